"""Session state that must survive kill -9 of the node: subscriptions, offsets, QoS 2 ids, PUBREL state."""

from __future__ import annotations

import pytest

from mqtt_proxy.codec import (
    Properties, PubAck, PubComp, Publish, PubRec, PubRel, SubAck, Subscribe, Subscription, SubscriptionOptions, Will,
)
from tests.integration.mqtt_raw import RawClient
from tests.integration.node import NodeProcess

PERSIST = Properties(session_expiry_interval=3600)


@pytest.fixture
def node(tmp_path):
    n = NodeProcess(str(tmp_path / "data")).start()
    yield n
    n.stop()


def persistent(node, cid, level=5, clean=False):
    c = RawClient(node.port(), level)
    ack = c.connect(cid, clean_start=clean, properties=PERSIST if level == 5 else Properties())
    assert ack.reason_code == 0
    return c, ack


def test_offline_messages_survive_kill(node):
    """A persistent subscriber offline across a SIGKILL gets every acknowledged message from its offset."""
    sub, _ = persistent(node, "r-sub", clean=True)
    sub.send(Subscribe(1, (Subscription("r/+/temp", SubscriptionOptions(qos=1)),)))
    sub.recv_until(SubAck)
    sub.close()
    pub = RawClient(node.port(), 5)
    pub.connect("r-pub")
    for i in range(50):
        pub.send(Publish(f"r/{i % 3}/temp", b"%d" % i, qos=1, packet_id=i + 1))
    acks = [pub.recv() for _ in range(50)]
    assert all(isinstance(a, PubAck) for a in acks)
    node.kill()
    node.start()
    sub, ack = persistent(node, "r-sub")
    assert ack.session_present
    got = []
    while len(got) < 50:
        p, _ = sub.recv_until(Publish)
        got.append(int(p.payload))
        sub.send(PubAck(p.packet_id))
    assert sorted(set(got)) == list(range(50))


def test_inbound_qos2_exactly_once_across_kill(node):
    """A QoS 2 PUBLISH answered with PUBREC before a kill is recognised when resent after it: stored once."""
    watcher, _ = persistent(node, "r-watch", clean=True)
    watcher.send(Subscribe(1, (Subscription("r/once", SubscriptionOptions(qos=1)),)))
    watcher.recv_until(SubAck)
    watcher.close()
    pub, _ = persistent(node, "r-q2pub", clean=True)
    pub.send(Publish("r/once", b"exactly", qos=2, packet_id=77))
    assert pub.recv() == PubRec(77)
    node.kill()
    node.start()
    pub, ack = persistent(node, "r-q2pub")
    assert ack.session_present
    pub.send(Publish("r/once", b"exactly", qos=2, packet_id=77, dup=True))
    assert pub.recv() == PubRec(77)
    pub.send(PubRel(77))
    assert pub.recv() == PubComp(77)
    watcher, _ = persistent(node, "r-watch")
    got = []
    for p in watcher.recv_all(0.8):
        if isinstance(p, Publish):
            got.append(p.payload)
            watcher.send(PubAck(p.packet_id))
    assert got == [b"exactly"]


def test_outbound_pubrel_state_survives_kill(node):
    """After PUBREC a kill must not resend the PUBLISH: the returning client gets PUBREL for the same id."""
    sub, _ = persistent(node, "r-rel", clean=True)
    sub.send(Subscribe(1, (Subscription("r/rel", SubscriptionOptions(qos=2)),)))
    sub.recv_until(SubAck)
    pub = RawClient(node.port(), 5)
    pub.connect("r-relpub")
    pub.send(Publish("r/rel", b"two", qos=2, packet_id=1))
    pub.recv()
    pub.send(PubRel(1))
    pub.recv()
    msg, _ = sub.recv_until(Publish)
    sub.send(PubRec(msg.packet_id))
    assert sub.recv() == PubRel(msg.packet_id)
    import time
    # Let the released state reach the session store before the SIGKILL. Nothing the node shows (no
    # metric, no log line) tells that this write is done, so this stays a short fixed pause.
    time.sleep(0.3)
    node.kill()
    node.start()
    sub, ack = persistent(node, "r-rel")
    assert ack.session_present
    first = sub.recv()
    assert first == PubRel(msg.packet_id)
    sub.send(PubComp(msg.packet_id))
    assert [p for p in sub.recv_all(0.5) if isinstance(p, Publish)] == []


def test_v311_persistent_session_and_subscription_survive_kill(node):
    """A 3.1.1 clean-session=0 subscription outlives a SIGKILL and delivers what arrived meanwhile."""
    sub, _ = persistent(node, "r-v311", level=4, clean=False)
    sub.send(Subscribe(1, (Subscription("r/v311/#", SubscriptionOptions(qos=1)),)))
    sub.recv_until(SubAck)
    sub.close()
    node.kill()
    node.start()
    pub = RawClient(node.port(), 4)
    pub.connect("r-v311-pub")
    pub.send(Publish("r/v311/a", b"while away", qos=1, packet_id=1))
    assert isinstance(pub.recv(), PubAck)
    sub, ack = persistent(node, "r-v311", level=4, clean=False)
    assert ack.session_present
    p, _ = sub.recv_until(Publish)
    assert p.payload == b"while away"


def test_clean_start_discards_session(node):
    """Clean start throws the stored session away: no session present, no old messages."""
    sub, _ = persistent(node, "r-clean", clean=True)
    sub.send(Subscribe(1, (Subscription("r/clean", SubscriptionOptions(qos=1)),)))
    sub.recv_until(SubAck)
    sub.close()
    pub = RawClient(node.port(), 5)
    pub.connect("r-clean-pub")
    pub.send(Publish("r/clean", b"old", qos=1, packet_id=1))
    pub.recv()
    sub, ack = persistent(node, "r-clean", clean=True)
    assert not ack.session_present
    assert [p for p in sub.recv_all(0.5) if isinstance(p, Publish)] == []


def _in_flight_then_kill(node, cid, wait):
    """A persistent QoS 1 subscriber gets three messages and acknowledges none; ``wait`` s later, SIGKILL."""
    import time
    sub, _ = persistent(node, cid, clean=True)
    sub.send(Subscribe(1, (Subscription(f"r/{cid}", SubscriptionOptions(qos=1)),)))
    sub.recv_until(SubAck)
    pub = RawClient(node.port(), 5)
    pub.connect(f"{cid}-pub")
    for i in range(3):
        pub.send(Publish(f"r/{cid}", b"%d" % i, qos=1, packet_id=i + 1))
        assert isinstance(pub.recv(), PubAck)
    sent = [sub.recv_until(Publish)[0] for _ in range(3)]
    time.sleep(wait)
    node.kill()
    node.start()
    sub, ack = persistent(node, cid)
    assert ack.session_present
    again = [p for p in sub.recv_all(1.0) if isinstance(p, Publish)]
    return sent, again


def test_qos1_in_flight_resent_with_its_packet_ids_after_kill(node):
    """MQTT-4.4.0-1 across a SIGKILL: QoS 1 PUBLISHes in flight for a while come again, DUP, same packet ids."""
    from mqtt_proxy.session import OUTBOUND_SAVE_DELAY
    # In flight longer than OUTBOUND_SAVE_DELAY, their entries are written; nothing the node shows tells
    # when, so the wait is that delay and a margin.
    sent, again = _in_flight_then_kill(node, "r-inflight", OUTBOUND_SAVE_DELAY + 0.5)
    assert [(p.packet_id, p.payload) for p in again[:3]] == [(p.packet_id, p.payload) for p in sent]
    assert all(p.dup for p in again[:3])


def test_qos1_in_flight_not_lost_by_kill_right_after_sending(node):
    """QoS 1 PUBLISHes sent and killed at once (entries not written yet) are all sent again after the restart."""
    sent, again = _in_flight_then_kill(node, "r-fresh", 0)
    assert {p.payload for p in again} == {p.payload for p in sent}


def test_wills_of_clients_connected_at_a_kill_are_published_when_the_node_starts_again(node):
    """A paho device with a retained "offline" will and a v5 client with a 3 s will delay are connected when the
    node is SIGKILLed: after the restart a new subscriber gets the retained will at once and the delayed one
    after its delay (the connections died with the process, and no DISCONNECT cancelled the wills)."""
    import paho.mqtt.client as mqtt

    from tests.integration.admin_support import paho
    from tests.integration.waiting import wait_until

    device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="r-device", protocol=mqtt.MQTTv311)
    device.will_set("r-status/device", b"offline", qos=1, retain=True)
    device.connect("127.0.0.1", node.port())
    device.loop_start()
    delayed = RawClient(node.port(), 5)
    ack = delayed.connect("r-delayed", clean_start=True, properties=PERSIST,
                          will=Will("r-status/delayed", b"gone", 1, properties=Properties(will_delay_interval=3)))
    try:
        assert ack.reason_code == 0
        wait_until(device.is_connected, 10, what="the paho device to connect")
        node.kill()
        node.start()
        got = []
        watcher = paho(node.port(), "r-watcher")
        watcher.on_message = lambda _c, _u, m: got.append((m.topic, m.payload, m.retain))
        watcher.subscribe("r-status/#", qos=1)
        wait_until(lambda: len(got) == 2, 15, what="both wills")
        assert got == [("r-status/device", b"offline", True), ("r-status/delayed", b"gone", False)]
        watcher.disconnect()
        watcher.loop_stop()
    finally:
        device.loop_stop()
        delayed.close()
