"""The native adapters' bounds: the token, paged list replies, reading paused while replies pile up, UDP limits.

Over a real engine and store (the engine tests' ``Node``), ``StringTransport``
and ``FakeDatagramTransport``; the integration side is
``tests/integration/test_security_native_http.py``.
"""

from __future__ import annotations

import inspect
import json

import pytest
from twisted.internet import udp
from twisted.internet.testing import FakeDatagramTransport

from mqtt_proxy.native import paging
from mqtt_proxy.native.codec import RequestError, TopicLimits
from mqtt_proxy.native.protocol import NativeUDPProtocol, token_bytes, token_ok
from tests.unit.test_native_engine import Node
from tests.unit.test_native_protocol import _connect, _replies, _send  # the TCP protocol harness

PEER = ("127.0.0.1", 5555)


def _settle(node, ticks=200):
    for _ in range(ticks):
        node.clock.advance(0)


def _udp(node):
    proto = NativeUDPProtocol(node.native)
    transport = FakeDatagramTransport()
    proto.makeConnection(transport)
    return proto, transport


def test_token_ok_compares_the_token_field():
    """No token set: every request passes; set: only a string equal to it (not a number, not a prefix)."""
    assert token_ok({}, token_bytes(""))
    token = token_bytes("s3cret")
    assert token_ok({"token": "s3cret"}, token)
    for given in ({}, {"token": "s3cre"}, {"token": "s3cret "}, {"token": 1}, {"token": None}, {"token": "\ud800"}):
        assert not token_ok(given, token)


def test_first_request_without_the_token_is_refused_and_the_connection_closed(tmp_path):
    """With a token set, a first request without it is answered code -1 and nothing after it is served."""
    node = Node(tmp_path, token="s3cret")
    proto, transport = _connect(node)
    _send(proto, {"action": 7, "seq": 1}, {"action": 1, "queue": "q", "data": "x"})
    _settle(node)
    (reply,) = _replies(transport)
    assert reply["code"] == -1 and "token" in reply["reason"] and reply["seq"] == 1
    # closed with the producer unregistered: a transport whose producer is paused would not close
    assert transport.disconnecting and transport.producer is None
    assert node.native.engine.counters["requests"] == 0


def test_auth_request_then_requests_are_served(tmp_path):
    """``{"action": "auth", "token": ...}`` first: answered code 0, and the connection's requests are served."""
    node = Node(tmp_path, token="s3cret")
    proto, transport = _connect(node)
    _send(proto, {"action": "auth", "token": "s3cret", "seq": 9}, {"action": 1, "queue": "q", "data": "x"})
    _settle(node)
    auth, produced = _replies(transport)
    assert auth == {"code": 0, "action": "auth", "seq": 9} and produced["code"] == 0
    assert not transport.disconnecting


def test_token_on_the_first_ordinary_request_is_enough(tmp_path):
    """A ``token`` field on the first request authenticates the connection; later requests need none."""
    node = Node(tmp_path, token="s3cret")
    proto, transport = _connect(node)
    _send(proto, {"action": 4, "queue": "q", "token": "s3cret"}, {"action": 4, "queue": "q"})
    assert [r["code"] for r in _replies(transport)] == [0, 0]


def test_wrong_auth_later_closes_the_connection(tmp_path):
    """An ``auth`` with a wrong token, even after a good one, is refused and closes the connection."""
    node = Node(tmp_path, token="s3cret")
    proto, transport = _connect(node)
    _send(proto, {"action": "auth", "token": "s3cret"}, {"action": "auth", "token": "nope"})
    assert [r["code"] for r in _replies(transport)] == [0, -1]
    assert transport.disconnecting


def test_udp_datagram_needs_the_token_each_time(tmp_path):
    """Over UDP every datagram carries the token: without it, code -1; with it, served."""
    node = Node(tmp_path, token="s3cret")
    proto, transport = _udp(node)
    proto.datagramReceived(b'{"action":4,"queue":"q","seq":1}', PEER)
    proto.datagramReceived(b'{"action":4,"queue":"q","seq":2,"token":"s3cret"}', PEER)
    first, second = (json.loads(p) for p, _ in transport.written)
    assert first["code"] == -1 and "token" in first["reason"] and first["seq"] == 1
    assert second["code"] == 0 and second["seq"] == 2


def test_udp_refuses_list_actions(tmp_path):
    """A list over UDP (small request, reply growing with the queues) is refused with a small error."""
    node = Node(tmp_path)
    proto, transport = _udp(node)
    for action in (7, 107, "queue_list"):
        proto.datagramReceived(json.dumps({"action": action}).encode(), PEER)
    replies = [json.loads(p) for p, _ in transport.written]
    assert all(r["code"] == -1 and "TCP" in r["reason"] for r in replies)
    assert all(len(p) < 100 for p, _ in transport.written)


def test_udp_reads_one_byte_past_the_datagram_limit(tmp_path):
    """The UDP port reads max_datagram_bytes + 1, so an over-long datagram is seen whole enough to refuse."""
    node = Node(tmp_path, max_datagram_bytes=20000)
    proto, transport = _udp(node)
    assert transport.maxPacketSize == 20001


def test_twisted_udp_port_reads_its_max_packet_size_attribute():
    """Twisted's UDP port reads ``self.maxPacketSize`` per datagram (what startProtocol sets); fails if that changes."""
    assert "recvfrom(self.maxPacketSize)" in inspect.getsource(udp.Port.doRead)


def test_topic_levels_limit_applies_to_native_topics(tmp_path):
    """A produce to a topic with more levels than [limits] max_topic_levels is refused."""
    node = Node(tmp_path)
    node.native.topic_limits = TopicLimits(65535, 3)
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "topic": "a/b/c/d", "data": "x"}, {"action": 4, "topic": "a/b/c"})
    deep, ok = _replies(transport)
    assert deep["code"] == -1 and "levels" in deep["reason"] and ok["code"] == 0


def test_list_replies_come_in_pages(tmp_path):
    """queue_list answers ``limit`` queues and a cursor; following the cursors lists every queue once."""
    node = Node(tmp_path)
    proto, transport = _connect(node)
    names = [f"q{i:03d}" for i in range(25)]
    _send(proto, *({"action": 1, "queue": n, "data": "x"} for n in names))
    _settle(node)
    _replies(transport)
    seen, cursor = [], None
    for _ in range(10):
        req = {"action": 7, "limit": 10}
        if cursor:
            req["cursor"] = cursor
        _send(proto, req)
        (reply,) = _replies(transport)
        assert len(reply["queues"]) <= 10
        seen += [q["queue"] for q in reply["queues"]]
        cursor = reply.get("cursor")
        if cursor is None:
            break
    assert seen == names


def test_list_default_page_is_list_page_size(tmp_path):
    """Without ``limit`` a list reply holds at most native.list_page_size queues."""
    node = Node(tmp_path, list_page_size=5)
    proto, transport = _connect(node)
    _send(proto, *({"action": 1, "queue": f"q{i}", "data": "x"} for i in range(8)))
    _settle(node)
    _replies(transport)
    _send(proto, {"action": 7})
    (reply,) = _replies(transport)
    assert len(reply["queues"]) == 5 and reply["cursor"]


@pytest.mark.parametrize("obj", [{"limit": 0}, {"limit": 1001}, {"limit": "5"}, {"limit": True},
                                 {"cursor": 5}, {"cursor": "!!"}, {"cursor": "WzEsMl0"}])
def test_bad_page_fields_are_refused(obj):
    """A limit out of 1..1000 or a cursor this server did not give is a RequestError."""
    with pytest.raises(RequestError):
        paging.parse_page(obj, 100)


def test_page_of_topics_continues_after_queues_run_out():
    """Queues and topics are paged side by side; the cursor continues whichever list has more."""
    reply = {"code": 0, "queues": [{"queue": "a"}], "topics": ["t1", "t2", "t3"]}
    first = paging.page_reply(reply, paging.Page(2))
    assert first["queues"] == [{"queue": "a"}] and first["topics"] == ["t1", "t2"]
    second = paging.page_reply(reply, paging.parse_page({"cursor": first["cursor"]}, 2))
    assert second["queues"] == [] and second["topics"] == ["t3"] and "cursor" not in second


def test_reading_stops_while_the_transport_is_over_its_high_water_mark(tmp_path):
    """While the transport says its send buffer is full (pauseProducing), no request is served or read."""
    node = Node(tmp_path)
    proto, transport = _connect(node)
    assert transport.producer is proto and transport.streaming
    proto.pauseProducing()  # what the transport calls once its buffer passes bufferSize
    assert transport.producerState == "paused"
    _send(proto, *({"action": 4, "queue": "q", "seq": i} for i in range(50)))
    assert transport.value() == b"" and node.native.engine.counters["requests"] == 0
    proto.resumeProducing()  # the buffer drained
    assert [r["seq"] for r in _replies(transport)] == list(range(50))
    assert transport.producerState == "producing"


def test_replies_held_behind_a_slow_one_stop_the_serving(tmp_path):
    """Replies ready behind an unanswered one count against max_reply_buffer_bytes: serving stops past it."""
    node = Node(tmp_path, max_reply_buffer_bytes=2000)
    proto, transport = _connect(node)
    # The produce waits for the store; each monitor after it on another queue is ready but held behind it.
    _send(proto, {"action": 1, "queue": "slow", "data": "x"}, *({"action": 4, "queue": f"m{i}"} for i in range(200)))
    served = node.native.engine.counters["requests"]
    assert served < 100 and transport.producerState == "paused"
    _settle(node)
    assert len(_replies(transport)) == 201 and transport.producerState == "producing"


def test_proxy_native_udp_answers_a_datagram():
    """A proxy's UDP adapter answers (here: a token error) instead of failing on a counter it lacked."""
    from cluster.remote.proxy_native import ForwardingEngine, ProxyNativeService
    from store.config import NativeConfig
    service = ProxyNativeService(ForwardingEngine(None), NativeConfig(token="s3cret"))
    proto = NativeUDPProtocol(service)
    transport = FakeDatagramTransport()
    proto.makeConnection(transport)
    proto.datagramReceived(b'{"action":4,"queue":"q"}', PEER)
    (payload, _), = transport.written
    assert json.loads(payload)["code"] == -1 and service.counters["udp_datagrams"] == 1
