"""Pipelined native requests against a real node process: they take effect in the order they were sent.

The native client's ``BlockingClient.pipeline`` writes every request before
reading any reply, so the node sees them in one read; UDP stays one request per
datagram.
"""

from __future__ import annotations

import json
import socket

import pytest

from mqtt_proxy.native.client import BlockingClient
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProcess(str(tmp_path_factory.mktemp("native-pipeline") / "data"),
                    listeners=("native", "native-udp")).start()
    yield n
    assert n.stop() in (0, -15)  # twistd re-raises SIGTERM after a clean shutdown


def test_pipelined_produce_then_consume_gets_the_message(node):
    """The issue's case: pipeline([produce jobs3 "x", consume jobs3]) hands back "x"."""
    with BlockingClient("127.0.0.1", node.port("native")) as c:
        produced, consumed = c.pipeline([{"action": 1, "queue": "jobs3", "data": "x"},
                                         {"action": 2, "queue": "jobs3"}])
    assert produced["code"] == 0
    assert (consumed["code"], consumed.get("data"), consumed.get("msg_id")) == (0, "x", produced["msg_id"])


def test_pipelined_chain_of_100_produce_consume_confirm(node):
    """100 rounds of [produce i, consume i, confirm i-1] each pipelined on one connection all succeed."""
    with BlockingClient("127.0.0.1", node.port("native")) as c:
        previous = None
        for i in range(100):
            reqs = [{"action": 1, "queue": "chain", "data": f"m{i}", "retry": 60, "seq": i},
                    {"action": 2, "queue": "chain", "seq": i}]
            if previous is not None:
                reqs.append({"action": 3, "queue": "chain", "msg_id": previous, "seq": i - 1})
            replies = c.pipeline(reqs)
            assert [r["code"] for r in replies] == [0] * len(reqs), replies
            assert replies[1].get("data") == f"m{i}" and replies[1]["msg_id"] == replies[0]["msg_id"]
            previous = replies[1]["msg_id"]
        c.confirm("chain", previous)
        mon = c.monitor("chain")
    assert (mon["size"], mon["inflight"]) == (0, 0)


def test_one_pipeline_of_200_then_100_confirms(node):
    """200 produce/consume requests in one write, then their 100 confirms in one write: every step in order."""
    with BlockingClient("127.0.0.1", node.port("native")) as c:
        reqs = []
        for i in range(100):
            reqs += [{"action": 1, "queue": "burst", "data": f"b{i}", "retry": 60},
                     {"action": 2, "queue": "burst"}]
        replies = c.pipeline(reqs)
        consumed = replies[1::2]
        assert [r.get("data") for r in consumed] == [f"b{i}" for i in range(100)]
        confirms = c.pipeline([{"action": 3, "queue": "burst", "msg_id": r["msg_id"]} for r in consumed])
        assert [r["code"] for r in confirms] == [0] * 100
        assert c.monitor("burst")["inflight"] == 0


def test_udp_keeps_one_reply_per_datagram(node):
    """A burst of UDP produces gets one reply per datagram (matched by seq), then consumes read every one back."""
    port = node.port("native-udp")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        for i in range(50):
            s.sendto(json.dumps({"action": 1, "queue": "udp-burst", "data": f"u{i}", "seq": i}).encode(),
                     ("127.0.0.1", port))
        replies = [json.loads(s.recv(65536)) for _ in range(50)]
        assert sorted(r["seq"] for r in replies) == list(range(50))
        assert all(r["code"] == 0 for r in replies)
        got = []
        for i in range(50):
            s.sendto(json.dumps({"action": 2, "queue": "udp-burst", "seq": i}).encode(), ("127.0.0.1", port))
            reply = json.loads(s.recv(65536))
            assert reply["seq"] == i
            got.append(reply.get("data"))
    assert sorted(got, key=lambda d: int(d[1:])) == [f"u{i}" for i in range(50)]
