"""One inbound publish decision, whoever publishes: a client, a will, the admin API, a native producer.

Each test drives one path on a real node with real clients and checks what the
decision (``mqtt_proxy.publish_rules``) must refuse there as it does for a
client's PUBLISH: the ``$`` topics are the broker's, and the retained quota
counts every retained message, whichever door it came in by. One node, a
retained quota of ``MAX_RETAINED``; each test fills the quota afresh after
clearing what the one before retained.
"""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import quote

import pytest

from mqtt_proxy.codec import PubAck, Publish, ReasonCode, Will
from tests.integration.admin_support import call
from tests.integration.node import NodeProcess
from tests.integration.security_support import Paho, node_logs, raw, subscribe, unique, write_config

MAX_RETAINED = 3

pytestmark = pytest.mark.slow  # one node for the module, a few seconds


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("decision-conf"), f"""\
[mqtt]
sys_interval = 0
[limits]
max_retained_messages = {MAX_RETAINED}
""")
    n = NodeProcess(str(tmp_path_factory.mktemp("decision") / "data"), listeners=("mqtt", "http", "native"),
                    extra_args=["--config", config]).start()
    yield n
    n.stop()


@pytest.fixture()
def full_quota(node):
    """Retain ``MAX_RETAINED`` messages (after clearing every retained topic); clear them again after."""
    _clear_retained(node)
    prefix = unique("full")
    c = Paho(node.port())
    assert c.connect() == 0
    try:
        for i in range(MAX_RETAINED):
            assert c.publish(f"{prefix}/{i}", b"kept", qos=1, retain=True) == 0
        # One more retained PUBLISH: the quota refuses it (the behaviour every other door must match).
        assert c.publish(f"{prefix}/over", b"over", qos=1, retain=True) == ReasonCode.QUOTA_EXCEEDED
    finally:
        c.close()
    _wait_retained_count(node, MAX_RETAINED)
    yield prefix
    _clear_retained(node)


def _retained_topics(node) -> list[str]:
    status, _ctype, body = call(node.port("http"), "GET", "/api/v1/retained?limit=1000")
    assert status == 200, body
    items = body["items"] if isinstance(body, dict) else body
    return [item["topic"] for item in items]


def _clear_retained(node) -> None:
    for topic in _retained_topics(node):
        status, _c, body = call(node.port("http"), "DELETE", "/api/v1/retained/" + quote(topic, safe=""))
        assert status in (200, 404), body
    _wait_retained_count(node, 0)


def _wait_retained_count(node, want: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = len(_retained_topics(node))
        if got == want or time.monotonic() > deadline:
            assert got == want, f"{got} retained messages, expected {want}"
            return
        time.sleep(0.05)


def _die_with_will(node, will: Will) -> None:
    """Connect a v5 client with ``will``, then drop its TCP connection without DISCONNECT."""
    c = raw(node.port(), client_id=unique("will"), will=will)
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()


def test_will_on_sys_topic_never_reaches_sys_subscriber(node):
    """A will on $SYS/broker/version is refused like a client's PUBLISH there: a $SYS/# subscriber never sees it."""
    sub = raw(node.port(), client_id=unique("sys-sub"))
    assert subscribe(sub, "$SYS/#", qos=1).reason_codes == (1,)
    ordinary = unique("will-ok")
    assert subscribe(sub, ordinary, qos=1, pid=2).reason_codes == (1,)
    _die_with_will(node, Will("$SYS/broker/version", b"fake 9.9", qos=1))
    _die_with_will(node, Will(ordinary, b"real will", qos=1))  # the control: a will on an ordinary topic
    got = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(p.topic == ordinary for p in got):
        try:
            packet = sub.recv(timeout=0.5)
        except TimeoutError:
            continue
        if isinstance(packet, Publish):
            got.append(packet)
    assert any(p.topic == ordinary for p in got), "the ordinary will never arrived"
    assert not [p for p in got if p.topic.startswith("$SYS/") and p.payload == b"fake 9.9"]
    sub.close()
    assert "will_denied" in node_logs(node)


def test_retained_will_beyond_quota_is_refused(node, full_quota):
    """A retained will beyond max_retained_messages is refused like a retained PUBLISH: not retained, logged."""
    topic = unique("will-retained")
    _die_with_will(node, Will(topic, b"last words", qos=1, retain=True))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and "will_denied" not in node_logs(node).split(topic)[-1]:
        time.sleep(0.05)
    assert topic not in _retained_topics(node)
    assert len(_retained_topics(node)) == MAX_RETAINED


def test_admin_retained_publish_counts_against_quota(node, full_quota):
    """An admin publish of a retained message beyond the quota is refused (HTTP 507) and retains nothing."""
    topic = unique("admin-retained")
    status, _c, body = call(node.port("http"), "POST", "/api/v1/publish",
                            {"topic": topic, "payload": "x", "qos": 1, "retain": True})
    assert status == 507, body
    assert body["code"] == "quota_exceeded"
    assert topic not in _retained_topics(node)


def test_admin_publish_on_sys_topic_is_refused(node):
    """The admin API may not publish fake $SYS values either: 403, nothing stored."""
    status, _c, body = call(node.port("http"), "POST", "/api/v1/publish",
                            {"topic": "$SYS/broker/version", "payload": "fake", "qos": 0, "retain": True})
    assert status == 403, body
    assert "$SYS/broker/version" not in _retained_topics(node)


def _native(node, request: dict) -> dict:
    with socket.create_connection(("127.0.0.1", node.port("native")), timeout=5) as s:
        s.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            assert chunk, "the native listener closed without a reply"
            data += chunk
    return json.loads(data)


def test_native_retained_produce_counts_against_quota(node, full_quota):
    """A native produce with retain beyond the quota gets code -1 and retains nothing."""
    topic = unique("native-retained")
    reply = _native(node, {"action": "produce", "topic": topic, "data": "x", "retain": True})
    assert reply["code"] == -1, reply
    assert "quota" in reply["reason"]
    assert topic not in _retained_topics(node)


def test_native_produce_on_sys_topic_is_refused(node):
    """A native produce may not publish on $SYS/...: code -1, a $SYS/# subscriber sees nothing."""
    sub = raw(node.port(), client_id=unique("sys-native"))
    assert subscribe(sub, "$SYS/fake/#", qos=1).reason_codes == (1,)
    reply = _native(node, {"action": "produce", "topic": "$SYS/fake/x", "data": "fake", "retain": True})
    assert reply["code"] == -1, reply
    assert not [p for p in sub.recv_all(quiet=0.5) if isinstance(p, Publish)]
    sub.close()


def test_delayed_retained_publish_beyond_quota_is_refused(node, full_quota):
    """A retained $delayed/ publish beyond the quota is refused at once (QUOTA_EXCEEDED) and never retained."""
    topic = unique("delayed-retained")
    before = call(node.port("http"), "GET", "/api/v1/timers")[2]["enqueued"]
    c = raw(node.port(), client_id=unique("delayer"))
    c.send(Publish(f"$delayed/1/{topic}", b"later", qos=1, retain=True, packet_id=7))
    ack, _before = c.recv_until(PubAck)
    assert ack.reason_code == ReasonCode.QUOTA_EXCEEDED
    c.close()
    assert call(node.port("http"), "GET", "/api/v1/timers")[2]["enqueued"] == before  # no timer was scheduled
    assert topic not in _retained_topics(node)


def test_client_connect_still_works(node):
    """The decision refuses only what it must: a plain client still publishes and receives."""
    c = raw(node.port(), client_id=unique("plain"))
    topic = unique("plain-topic")
    assert subscribe(c, topic, qos=1).reason_codes == (1,)
    c.send(Publish(topic, b"hello", qos=1, packet_id=3))
    got = [p for p in c.recv_all(quiet=0.5) if isinstance(p, Publish)]
    assert [p.payload for p in got] == [b"hello"]
    c.close()
