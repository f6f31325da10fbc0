"""The native TCP/UDP adapters over a real engine and store: pipelined requests take effect in order.

A real MessageStore, light queues and DurableKV in a tmp dir (the engine tests'
``Node``), a task.Clock, ``StringTransport`` / ``FakeDatagramTransport``.
"""

from __future__ import annotations

import json

import pytest
from twisted.internet.testing import FakeDatagramTransport, StringTransport

from mqtt_proxy.native.protocol import NativeTCPFactory, NativeUDPProtocol
from tests.unit.test_native_engine import Node


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def _connect(node):
    proto = NativeTCPFactory(node.native).buildProtocol(("127.0.0.1", 1))
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


def _send(proto, *requests):
    proto.dataReceived(b"".join(json.dumps(r).encode() + b"\n" for r in requests))


def _replies(transport):
    out = [json.loads(line) for line in transport.value().splitlines()]
    transport.clear()
    return out


def _settle(node, ticks=500):
    # Each tick lets the store append and the KV commit what the previous one staged.
    for _ in range(ticks):
        node.clock.advance(0)


def test_pipelined_produce_then_consume_gets_the_message(node):
    """A consume sent in the same write as a produce to its queue hands out that message."""
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "queue": "jobs3", "data": "x", "seq": 1}, {"action": 2, "queue": "jobs3", "seq": 2})
    _settle(node)
    produced, consumed = _replies(transport)
    assert (produced["seq"], consumed["seq"]) == (1, 2)
    assert consumed["code"] == 0 and consumed["data"] == "x" and consumed["msg_id"] == produced["msg_id"]


def test_consume_waits_for_the_earlier_produce_on_its_queue(node):
    """Until the produce is answered, a later request on the same queue is not started."""
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "queue": "q", "data": "x"}, {"action": 2, "queue": "q"})
    assert node.native.engine.counters["requests"] == 1
    assert transport.value() == b""
    _settle(node)
    assert node.native.engine.counters["requests"] == 2


def test_requests_on_other_queues_are_not_held(node):
    """A request on another queue (or topic) starts at once, but its reply still waits its turn."""
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "queue": "a", "data": "x", "seq": 1},
          {"action": 4, "queue": "b", "seq": 2}, {"action": 2, "topic": "dev/1", "seq": 3})
    assert node.native.engine.counters["requests"] == 3
    assert transport.value() == b""  # the monitor's reply is ready but waits for the produce's
    _settle(node)
    assert [r["seq"] for r in _replies(transport)] == [1, 2, 3]


def test_virtual_queue_produce_orders_its_real_queues(tmp_path):
    """A consume of a real queue waits for an earlier produce to a virtual queue that feeds it."""
    node = Node(tmp_path, virtual_queues={"all": ["r1", "r2"]})
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "queue": "all", "data": "v"}, {"action": 2, "queue": "r2"})
    _settle(node)
    assert _replies(transport)[1]["data"] == "v"


def test_topic_produce_then_topic_consume_in_one_write(node):
    """A produce to a topic and a consume of its first level, pipelined, hand out that publish."""
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "topic": "dev/1/temp", "data": "21.5"}, {"action": 2, "topic": "dev", "group": "g"})
    _settle(node)
    consumed = _replies(transport)[1]
    assert consumed["data"] == "21.5" and consumed["msg_topic"] == "dev/1/temp"


def test_queue_list_waits_for_every_earlier_request(node):
    """A request without a queue (queue list) sees every earlier produce, and later requests wait for it."""
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "queue": "a", "data": "x"}, {"action": 1, "queue": "b", "data": "y"},
          {"action": 7}, {"action": 4, "queue": "c"})
    assert node.native.engine.counters["requests"] == 2
    _settle(node)
    replies = _replies(transport)
    assert [q["queue"] for q in replies[2]["queues"]] == ["a", "b"]
    assert [q["size"] for q in replies[2]["queues"]] == [1, 1]
    assert replies[3]["code"] == 0


def test_pipelined_chain_of_100_produce_consume_confirm(node):
    """100 produce/consume/confirm triples on one queue, all sent at once, each consume gets its own message."""
    proto, transport = _connect(node)
    reqs = []
    for i in range(100):
        reqs += [{"action": 1, "queue": "chain", "data": f"m{i}", "retry": 30, "seq": 3 * i},
                 {"action": 2, "queue": "chain", "seq": 3 * i + 1}]
    _send(proto, *reqs)
    _settle(node)
    replies = _replies(transport)
    assert [r["seq"] for r in replies] == [r["seq"] for r in reqs]
    consumed = [r for r in replies if r["action"] == 2]
    assert [c["data"] for c in consumed] == [f"m{i}" for i in range(100)]
    _send(proto, *({"action": 3, "queue": "chain", "msg_id": c["msg_id"], "seq": i} for i, c in enumerate(consumed)))
    _settle(node)
    confirms = _replies(transport)
    assert [(c["seq"], c["code"]) for c in confirms] == [(i, 0) for i in range(100)]
    assert node.native.engine.counters["confirmed"] == 100


def test_lost_connection_never_starts_held_requests(node):
    """A consume held behind a produce is dropped with its connection, so no message is handed to nobody."""
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "queue": "q", "data": "kept"}, {"action": 2, "queue": "q"})
    proto.connectionLost()
    _settle(node)
    assert node.native.engine.counters["requests"] == 1
    assert node.call(action=2, queue="q")["data"] == "kept"


def test_long_chain_of_instant_replies_does_not_recurse(node):
    """3,000 requests held behind one produce and answered at once run without growing the stack."""
    proto, transport = _connect(node)
    _send(proto, {"action": 1, "queue": "q", "data": "x"},
          *({"action": 3, "queue": "q", "msg_id": 1} for _ in range(3000)))
    _settle(node)
    replies = _replies(transport)
    assert len(replies) == 3001 and all(r["code"] == -1 for r in replies[1:])


def test_udp_datagrams_are_answered_each_on_their_own(node):
    """Over UDP each datagram gets one reply of its own, not held behind another datagram's pending produce."""
    proto = NativeUDPProtocol(node.native)
    transport = FakeDatagramTransport()
    proto.makeConnection(transport)
    peer = ("127.0.0.1", 5555)
    proto.datagramReceived(json.dumps({"action": 1, "queue": "u", "data": "x", "seq": 1}).encode(), peer)
    proto.datagramReceived(json.dumps({"action": 4, "queue": "other", "seq": 2}).encode(), peer)
    assert [json.loads(p)["seq"] for p, _ in transport.written] == [2]
    _settle(node)
    proto.datagramReceived(json.dumps({"action": 2, "queue": "u", "seq": 3}).encode(), peer)
    _settle(node)
    replies = [json.loads(p) for p, addr in transport.written]
    assert [r["seq"] for r in replies] == [2, 1, 3]
    assert replies[2]["data"] == "x" and all(addr == peer for _, addr in transport.written)
