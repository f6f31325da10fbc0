"""A real broker process on its RPC port: bad input is refused and logged, good peers keep being served.

One broker for the module. The good peer speaks the protocol through the
sans-IO ``Connection`` over a blocking socket (no reactor in the test); the bad
ones write raw bytes: garbage instead of a handshake, a HELLO of another
cluster, a frame over the size cap, a request type the broker does not know,
a peer with another ``[cluster] secret`` or none.
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.request

import msgpack
import pytest

from cluster.remote import codec as store_codec
from cluster.rpc import frames
from cluster.rpc.connection import Closed, Connection, Opened
from cluster.rpc.frames import RPC_VERSION, Error, Event, Hello, Result
from tests.integration.node import NodeProcess

WAIT = 15.0
MAX_FRAME = 4096
SECRET = "rpc-secret-7"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    path = tmp_path_factory.mktemp("rpc-broker")
    conf = path / "twistmq.toml"
    conf.write_text(f'[store]\nsegment_size = {1 << 20}\n[cluster]\ncluster_id = "c-test"\ngroup = "g7"\n'
                    f'max_frame_bytes = {MAX_FRAME}\nsecret = "{SECRET}"\n')
    b = NodeProcess(str(path / "data"), listeners=("rpc", "http"), role="broker",
                    extra_args=["--config", str(conf), "--node-id", "b-test"]).start()
    yield b
    b.stop()
    assert "broker_stopped" in log_of(b)  # SIGTERM: a clean stop (goodbyes, then the store closed)


def log_of(broker) -> str:
    with open(broker.data_dir.rstrip("/") + ".stderr.log", errors="replace") as f:
        return f.read()


def wait_for_log(broker, text: str) -> str:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        log = log_of(broker)
        if text in log:
            return log
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in the broker's log")


class Peer:
    """A blocking RPC client over the sans-IO connection."""

    def __init__(self, broker, cluster_id="c-test", secret=SECRET) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.port("rpc")), timeout=WAIT)
        self.conn = Connection(Hello(cluster_id, "test-peer", "proxy", RPC_VERSION), True, 1 << 20,
                               secret.encode())
        self.sock.sendall(self.conn.data_to_send())

    def next_event(self):
        while True:
            data = self.sock.recv(65536)
            events = self.conn.receive(data) if data else [Closed("eof", by_peer=True)]
            out = self.conn.data_to_send()  # the handshake's PROOF, or our GOODBYE
            if out and data:
                self.sock.sendall(out)
            if events:
                assert len(events) == 1, events
                return events[0]

    def call(self, request_type: str, body: bytes):
        self.conn.call(request_type, body)
        self.sock.sendall(self.conn.data_to_send())
        while True:
            event = self.next_event()
            if not isinstance(event, (Event, frames.Heartbeat)):
                return event


def open_peer(broker) -> Peer:
    peer = Peer(broker)
    opened = peer.next_event()
    assert isinstance(opened, Opened) and opened.peer.node_id == "b-test" and opened.peer.role == "broker"
    return peer


def closed_with(sock: socket.socket) -> str:
    """The reason of the GOODBYE the broker sent before closing ``sock``."""
    decoder, got = frames.FrameDecoder(1 << 20), []
    while True:
        data = sock.recv(65536)
        if not data:
            break
        got += decoder.feed(data)
    (goodbye,) = [f for f in got if isinstance(f, frames.Goodbye)]
    return goodbye.reason


def raw(broker, data: bytes) -> str:
    sock = socket.create_connection(("127.0.0.1", broker.port("rpc")), timeout=WAIT)
    sock.sendall(data)
    return closed_with(sock)


def add_filter(peer: Peer, topic_filter: str) -> str:
    result = peer.call("store.add_filter", store_codec.pack_call("add_filter", (topic_filter,)))
    assert isinstance(result, Result), result
    return store_codec.unpack_result("add_filter", result.body)


def metrics(broker) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.port('http')}/metrics", timeout=WAIT) as r:
        return r.read().decode()


def test_a_peer_of_the_cluster_is_served(broker):
    """A HELLO with the cluster id is answered HELLO_OK naming the broker, and store calls are served."""
    peer = open_peer(broker)
    assert add_filter(peer, "good/#") == "%LMQ%good/#"


def test_bad_input_is_refused_logged_and_harms_no_one_else(broker):
    """Garbage, a wrong cluster id, an oversized frame: each refused with a reason and logged; a peer that
    was connected throughout, and one that connects after, are served."""
    survivor = open_peer(broker)
    assert "not a frame" in raw(broker, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    wrong = Peer(broker, cluster_id="someone-else")
    refused = wrong.next_event()
    assert isinstance(refused, Closed) and "wrong cluster id 'someone-else'" in refused.reason
    hello = frames.encode(Hello("c-test", "big", "proxy", RPC_VERSION, True, b"n" * frames.NONCE_SIZE))
    assert "over the limit" in raw(broker, hello + frames.encode_varint(MAX_FRAME + 1) + b"\x94")
    wait_for_log(broker, "rpc_refused")
    log = log_of(broker)
    assert "wrong cluster id 'someone-else'" in log and "over the limit of 4096" in log and "not a frame" in log
    assert add_filter(survivor, "survivor/#") == "%LMQ%survivor/#"
    assert add_filter(open_peer(broker), "after/#") == "%LMQ%after/#"
    text = metrics(broker)
    for kind in ("wrong_cluster", "oversized", "bad_frame"):
        assert f'twistmq_rpc_refused_total{{why="{kind}"}}' in text


def test_a_peer_with_another_secret_or_none_is_refused_and_logged(broker):
    """A member whose [cluster] secret differs (or is empty) gets no connection: it refuses the broker's proof,
    the broker logs and counts the refusal naming the key and not its value; the right secret is served."""
    for secret in ("another-secret", ""):
        peer = Peer(broker, secret=secret)
        refused = peer.next_event()
        assert isinstance(refused, Closed) and "did not prove the cluster secret" in refused.reason
        peer.sock.close()
    log = wait_for_log(broker, "[cluster] secret differs")
    assert "rpc_closed_by_peer" in log and SECRET not in log and "another-secret" not in log
    assert 'twistmq_rpc_refused_total{why="wrong_secret"} 2' in metrics(broker)
    assert add_filter(open_peer(broker), "secret/#") == "%LMQ%secret/#"


def test_a_fake_client_without_the_secret_cannot_open(broker):
    """A client that skips checking the broker's proof still has to prove the secret: a guessed PROOF is
    refused with GOODBYE and logged."""
    sock = socket.create_connection(("127.0.0.1", broker.port("rpc")), timeout=WAIT)
    sock.sendall(frames.encode(Hello("c-test", "intruder", "proxy", RPC_VERSION, True, b"i" * frames.NONCE_SIZE)))
    decoder = frames.FrameDecoder(1 << 20)
    challenge = []
    while not challenge:
        challenge = decoder.feed(sock.recv(65536))
    assert isinstance(challenge[0], frames.Challenge)
    sock.sendall(frames.encode(frames.Proof(b"\x00" * 32)))
    assert "proxy 'intruder' did not prove the cluster secret" in closed_with(sock)
    wait_for_log(broker, "rpc_refused peer=- addr=127.0.0.1")
    assert "proxy 'intruder' did not prove" in log_of(broker)


def test_an_unknown_request_type_gets_an_error_frame_and_the_connection_stays(broker):
    """A call of a type the broker does not serve is answered with an error frame; the next call is served."""
    peer = open_peer(broker)
    error = peer.call("no.such.request", b"")
    assert isinstance(error, Error) and error.code == "unknown_request" and "no.such.request" in error.message
    bad_body = peer.call("store.add_filter", b"\xc1")
    assert isinstance(bad_body, Error) and bad_body.code == "invalid_argument"
    assert add_filter(peer, "still/#") == "%LMQ%still/#"
    wait_for_log(broker, "rpc_unknown_request type='no.such.request'")


def test_native_requests_are_forwarded_whole(broker):
    """A native request map is served by the broker's engine and its reply map comes back; a UDP budget holds."""
    peer = open_peer(broker)

    def native(request: dict, budget=None) -> dict:
        result = peer.call("store.native_request", store_codec.pack_call("native_request", (request, budget)))
        assert isinstance(result, Result), result
        return store_codec.unpack_result("native_request", result.body)

    reply = native({"action": "produce", "queue": "jobs", "data": "x" * 300, "seq": 3})
    assert reply["code"] == 0 and reply["seq"] == 3 and reply["msg_id"] >= 0
    too_big = native({"action": "consume", "queue": "jobs"}, budget=100)
    assert too_big["code"] == -1 and too_big["reason"]
    assert native({"action": "consume", "queue": "jobs"})["data"] == "x" * 300  # it stayed for a TCP consumer
    bad = native({"action": "fly"})
    assert bad["code"] == -1 and bad["reason"]
    malformed = peer.call("store.native_request", msgpack.packb({"action": "produce"}))
    assert isinstance(malformed, Error) and malformed.code == "invalid_argument"


def test_rpc_metrics(broker):
    """/metrics counts calls per request type, their latency and the open connections."""
    peer = open_peer(broker)
    add_filter(peer, "m/#")
    text = metrics(broker)
    assert 'twistmq_rpc_calls_total{type="store.add_filter"}' in text
    assert 'twistmq_rpc_call_seconds_bucket{le="+Inf",type="store.add_filter"}' in text
    connections = [line for line in text.splitlines() if line.startswith("twistmq_rpc_connections ")]
    assert connections and float(connections[0].split()[1]) >= 1


def test_sighup_is_a_reload_not_a_stop(broker):
    """SIGHUP (systemctl reload) is logged as a reload and the broker keeps serving its peers."""
    broker.proc.send_signal(signal.SIGHUP)
    wait_for_log(broker, "reload_ok role=broker")
    assert broker.proc.poll() is None
    assert add_filter(open_peer(broker), "after/hup") == "%LMQ%after/hup"
