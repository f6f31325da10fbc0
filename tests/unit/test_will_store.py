"""The proxy side of what a lost proxy leaves behind: the will stored in its group at CONNECT, cleaned when it
is published or cancelled, and the sessions of a group lost for a lease closed (front end over a real store)."""

from __future__ import annotations

import pytest

from mqtt_proxy.codec import Disconnect, Properties, ReasonCode, Subscribe, Subscription, SubscriptionOptions
from mqtt_proxy.codec.packets import ConnAck, Will
from store.session_store import SessionStore
from tests.unit.test_mqtt_broker import Harness, published


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path)
    yield harness
    harness.close()


def stored_will(h, cid):
    return SessionStore(h.kv).load_will(cid)


def test_a_connect_stores_its_will_as_the_publish_decision_takes_it_before_connack(h):
    """The will (topic, payload, qos, retain, delay) is in the session's group once CONNACK is out."""
    c = h.connect("w1", will=Will("will/w1", b"bye", 1, True, Properties(will_delay_interval=7)),
                  properties=Properties(session_expiry_interval=60))
    assert isinstance(c.received()[0], ConnAck)
    will = stored_will(h, "w1")
    assert (will.topic, will.payload, will.qos, will.retain, will.delay_s, will.due_ms) == \
        ("will/w1", b"bye", 1, True, 7, None)
    assert stored_will(h, "none") is None and h.connect("none") and stored_will(h, "none") is None


def test_a_will_the_decision_refuses_is_not_stored(h):
    """A will on a $ topic is refused by the publish decision: nothing is stored for a group to publish."""
    h.connect("sys", will=Will("$SYS/fake", b"x"))
    assert stored_will(h, "sys") is None


def test_a_normal_disconnect_cancels_the_stored_will_and_a_published_one_is_forgotten(h):
    """DISCONNECT 0x00: the stored will goes; 0x04 or a lost link: published here, then it goes."""
    watcher = h.connect("watch")
    watcher.send(Subscribe(1, (Subscription("will/+"),)))
    watcher.received()
    h.connect("polite", will=Will("will/a", b"a")).send(Disconnect())
    assert stored_will(h, "polite") is None
    lost = h.connect("lost", will=Will("will/b", b"b"), properties=Properties(session_expiry_interval=60))
    assert stored_will(h, "lost") is not None
    lost.lose()
    assert stored_will(h, "lost") is None
    assert [p.payload for p in published(watcher)] == [b"b"]


def test_a_delayed_will_stays_stored_until_its_delay_publishes_it(h):
    """While its delay runs the will stays in the group (if this proxy is lost meanwhile, the group publishes it);
    published after the delay, it goes."""
    c = h.connect("late", will=Will("will/late", b"l", properties=Properties(will_delay_interval=5)),
                  properties=Properties(session_expiry_interval=60))
    c.lose()
    h.tick(4)
    assert stored_will(h, "late") is not None
    h.tick(1.5)
    assert stored_will(h, "late") is None


def test_the_sessions_of_a_lost_group_are_closed_with_server_busy_and_kept_in_the_group(h):
    """``close_group_sessions``: the client is disconnected (v5 0x89), the session forgotten here without a write: its
    group keeps what is stored (and takes it over)."""
    c = h.connect("homed", properties=Properties(session_expiry_interval=60))
    c.send(Subscribe(1, (Subscription("exp/#"),)))
    c.received()
    other = h.connect("elsewhere")
    other.received()
    dropped = h.broker.registry.close_group_sessions(lambda s: s.client_id == "homed")
    h.tick()
    assert [cid for cid, _epoch in dropped] == ["homed"]
    assert c.received()[-1] == Disconnect(ReasonCode.SERVER_BUSY) and c.transport.disconnecting
    assert "homed" not in h.broker.sessions and "elsewhere" in h.broker.sessions
    stored = SessionStore(h.kv).load("homed")
    assert stored is not None and stored.disconnected_at is None and "exp/#" in stored.subscriptions


def test_a_node_restarted_after_a_sessions_expiry_expires_it_at_start(tmp_path):
    """One node: a stored session whose expiry passed while the node was down is deleted when it starts (its
    filter's interest never taken), and one still within its expiry comes back."""
    first = Harness(tmp_path)
    for cid, expiry in (("short", 10), ("long", 3600)):
        c = first.connect(cid, properties=Properties(session_expiry_interval=expiry))
        c.send(Subscribe(1, (Subscription(f"exp/{cid}"),)))
        c.lose()
    first.close()
    again = Harness(tmp_path)
    try:
        again.clock.advance(60)  # down for a minute
        again.broker.restore()
        again.tick()
        assert set(again.broker.sessions) == {"long"}
        assert SessionStore(again.kv).load("short") is None and SessionStore(again.kv).load("long") is not None
    finally:
        again.close()


def test_a_delayed_will_is_cancelled_when_its_client_returns_on_another_proxy(h):
    """MQTT-3.1.3-9 across proxies: the client left with a will delay and came back on another proxy within
    it; the old holder, told of the new claim, drops the will it was waiting to publish."""
    from mqtt_proxy.config import LimitsConfig, MQTTConfig
    from mqtt_proxy.front_end import build_front_end
    from mqtt_proxy.protocol import MQTTServerFactory

    other = build_front_end(h.local, h.clock, MQTTConfig(sys_interval=0), LimitsConfig(), holder="proxy-2")
    fronts = {"node": h.broker, "proxy-2": other}
    h.local.add_claim_listener(lambda cid, old, epoch: fronts[old].registry.taken_over(cid, epoch))
    watcher = h.connect("watch")
    watcher.send(Subscribe(1, (Subscription("will/+"),)))
    watcher.received()
    persist = Properties(session_expiry_interval=60)
    c = h.connect("late", properties=persist, will=Will("will/late", b"l", properties=Properties(will_delay_interval=5)))
    c.lose()
    h.tick(2)
    first, h.factory = h.factory, MQTTServerFactory(other, h.clock)
    try:
        back = h.connect("late", clean_start=False, properties=persist)
    finally:
        h.factory = first
    assert back.received()[0].session_present
    h.tick(10)
    assert published(watcher) == []


def _crashed_with(tmp_path, clients):
    """A node whose clients ``(client id, will, session expiry)`` are connected when it dies: nothing of them is
    told to the front end (no DISCONNECT, no lost link), as after kill -9. Its persistent watcher of ``will/#``
    (QoS 1) is restored after the restart, to collect what the restart publishes."""
    first = Harness(tmp_path)
    watcher = first.connect("watch", properties=Properties(session_expiry_interval=3600))
    watcher.send(Subscribe(1, (Subscription("will/#", SubscriptionOptions(qos=1)),)))
    watcher.lose()
    for cid, will, expiry in clients:
        assert isinstance(first.connect(cid, will=will, properties=Properties(session_expiry_interval=expiry))
                          .received()[0], ConnAck)
    first.close()
    return Harness(tmp_path, own_holder="node", left_wills=True)


def _watch(h):
    watcher = h.connect("watch", clean_start=False, properties=Properties(session_expiry_interval=3600))
    return watcher


def test_a_restarted_node_publishes_the_wills_its_crash_left(tmp_path):
    """After a crash: a clean session's will goes out at restore, its will and claim gone from the store; a
    persistent session's after its delay, counted from the restart; one whose client returns first never."""
    h = _crashed_with(tmp_path, [("clean", Will("will/clean", b"c", 1), 0),
                                 ("slow", Will("will/slow", b"s", 1, properties=Properties(will_delay_interval=30)),
                                  3600),
                                 ("back", Will("will/back", b"b", 1, properties=Properties(will_delay_interval=30)),
                                  3600)])
    try:
        h.broker.restore()
        h.tick()
        watcher = _watch(h)
        assert [p.payload for p in published(watcher)] == [b"c"]
        assert stored_will(h, "clean") is None and "clean" not in h.local.session_claims.claims
        h.tick(10)
        h.connect("back", clean_start=False, properties=Properties(session_expiry_interval=3600))
        h.tick(19)
        assert published(watcher) == [] and stored_will(h, "slow") is not None
        h.tick(2)
        assert [p.payload for p in published(watcher)] == [b"s"]
        h.tick(60)
        assert published(watcher) == []
        assert stored_will(h, "slow") is None and stored_will(h, "back") is None
    finally:
        h.close()


def test_a_left_will_goes_out_when_its_session_ends_before_its_delay(tmp_path):
    """A restored session that expires before its will's delay: the will goes out at the expiry, then the
    session is gone."""
    h = _crashed_with(tmp_path, [("short", Will("will/short", b"x", properties=Properties(will_delay_interval=600)),
                                  20)])
    try:
        h.broker.restore()
        h.tick()
        watcher = _watch(h)
        h.tick(19)
        assert published(watcher) == []
        h.tick(2)
        assert [p.payload for p in published(watcher)] == [b"x"]
        assert "short" not in h.broker.sessions and stored_will(h, "short") is None
    finally:
        h.close()


def test_a_session_that_ended_while_the_node_was_down_has_its_will_published_at_start(tmp_path):
    """A client lost before the crash whose delayed will was still waiting, and whose session expired during the
    downtime: the restart publishes the will and deletes the session."""
    first = Harness(tmp_path)
    watcher = first.connect("watch", properties=Properties(session_expiry_interval=3600))
    watcher.send(Subscribe(1, (Subscription("will/#", SubscriptionOptions(qos=1)),)))
    watcher.lose()
    first.connect("gone", will=Will("will/gone", b"g", properties=Properties(will_delay_interval=600)),
                  properties=Properties(session_expiry_interval=10)).lose()
    first.tick(5)
    first.close()
    h = Harness(tmp_path, own_holder="node", left_wills=True)
    try:
        h.clock.advance(60)
        h.broker.restore()
        h.tick()
        assert [p.payload for p in published(_watch(h))] == [b"g"]
        assert "gone" not in h.broker.sessions and stored_will(h, "gone") is None
        assert SessionStore(h.kv).load("gone") is None
    finally:
        h.close()


def test_a_front_end_without_left_wills_leaves_them_to_its_groups(tmp_path):
    """A proxy's restore (``left_wills`` off) publishes nothing: its broker groups' keepers publish a lost
    life's wills."""
    h = _crashed_with(tmp_path, [("clean", Will("will/clean", b"c", 1), 0)])
    h.broker.registry.left_wills = False
    try:
        h.broker.restore()
        h.tick(60)
        assert published(_watch(h)) == [] and stored_will(h, "clean") is not None
    finally:
        h.close()
