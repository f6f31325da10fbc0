"""Issue 26 on a real node: the native listener's token and bounds, and the HTTP listener's bounds.

One node (module-scoped) with a native token, an admin token, a short HTTP
request deadline, a small retained quota and few topic levels. Each test
reproduces one finding against the real process, with raw sockets (the exact
bytes matter) or the Python native client, and fails on the code before the fix:

- native TCP and UDP without the token were served (no authentication);
- a client that sends list requests and never reads grew the node's memory
  without limit (60 requests: +115 MB);
- a list reply had no pages, and over UDP a 13-byte request got a 43.8 KB reply;
- a datagram over 8,192 bytes was cut silently (Twisted's read size);
- native topics ignored ``[limits] max_topic_levels``;
- HTTP read (and spooled) a body before checking the token or its size, and a
  body trickled in kept the connection open for good;
- ``/dashboard/x%00.js`` answered 500 with a traceback in the log;
- every refused retained publish wrote a log line.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from mqtt_proxy.codec import Publish
from mqtt_proxy.native.client import BlockingClient, NativeError
from tests.integration.node import NodeProcess
from tests.integration.security_support import anon_rss_kib, node_logs, raw, unique, write_config

pytestmark = pytest.mark.slow  # ~12 s: 1,000 queues, a memory measure and timed HTTP deadlines

TOKEN = "native-s3cret"
ADMIN_TOKEN = "admin-s3cret"
MAX_DATAGRAM = 20000
MAX_TOPIC_LEVELS = 4
REQUEST_TIMEOUT_S = 2
MAX_BODY = 65536


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("nh-conf"), f"""\
[mqtt]
sys_interval = 0
[limits]
max_topic_levels = {MAX_TOPIC_LEVELS}
max_retained_messages = 2
[native]
token = "{TOKEN}"
max_datagram_bytes = {MAX_DATAGRAM}
[admin]
token = "{ADMIN_TOKEN}"
request_timeout_s = {REQUEST_TIMEOUT_S}
max_body_bytes = {MAX_BODY}
""")
    n = NodeProcess(str(tmp_path_factory.mktemp("nh") / "data"), listeners=("mqtt", "http", "native", "native-udp"),
                    extra_args=["--config", config]).start()
    yield n
    n.stop()


# -- helpers ---------------------------------------------------------------------------------------

def _tcp(node, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", node.port("native")), timeout=timeout)
    return sock


def _lines(sock, count: int, timeout: float = 5.0) -> list[dict]:
    """Read ``count`` reply lines (fewer if the server closes first)."""
    buf, deadline = b"", time.monotonic() + timeout
    while buf.count(b"\n") < count and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            break
        if not chunk:
            break
        buf += chunk
    return [json.loads(line) for line in buf.splitlines()[:count]]


def _closed(sock, timeout: float = 5.0) -> bool:
    """True once the server has closed the connection (EOF or reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True
    return True


def _udp(node, payload: bytes, timeout: float = 5.0) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(payload, ("127.0.0.1", node.port("native-udp")))
        return sock.recvfrom(65536)[0]


def _requests_served(client) -> int:
    """The node's native request count (node_monitor's ``requests``), less the node_monitor itself."""
    return client.request({"action": 104})["requests"] - 1


def _http(node, head: bytes, body_parts=(), gap: float = 0.0, timeout: float = 5.0) -> bytes:
    """Send a raw request (head, then each body part ``gap`` s apart) and read until the server answers."""
    sock = socket.create_connection(("127.0.0.1", node.port("http")), timeout=timeout)
    try:
        sock.sendall(head)
        sock.setblocking(False)
        deadline, parts, got = time.monotonic() + timeout, list(body_parts), b""
        while time.monotonic() < deadline and b"\r\n\r\n" not in got:
            if parts:
                try:
                    sock.sendall(parts.pop(0))
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass
            time.sleep(gap or 0.05)
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        return got
    finally:
        sock.close()


def _status(response: bytes) -> int | None:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else None


# -- native: the token -----------------------------------------------------------------------------

def test_native_tcp_without_token_is_refused_and_closed(node):
    """A native TCP connection whose first request lacks the token gets code -1 and is closed, nothing served."""
    with _tcp(node) as sock:
        sock.sendall(b'{"action":7}\n{"action":1,"queue":"nh-notoken","data":"x"}\n')
        (reply,) = _lines(sock, 1)
        assert reply["code"] == -1 and "token" in reply["reason"]
        assert _closed(sock)
    with _tcp(node) as sock:
        sock.sendall(b'{"action":"auth","token":"wrong"}\n')
        assert _lines(sock, 1)[0]["code"] == -1 and _closed(sock)
    with BlockingClient("127.0.0.1", node.port("native"), token=TOKEN) as c:
        assert c.monitor("nh-notoken")["size"] == 0  # the produce after the refused request never ran


def test_native_client_with_token_is_served(node):
    """The Python client with ``token=`` works as before; a wrong one raises NativeError."""
    with BlockingClient("127.0.0.1", node.port("native"), token=TOKEN) as c:
        msg_id = c.produce("nh-jobs", "hello")
        assert c.consume("nh-jobs")["msg_id"] == msg_id
    with pytest.raises(NativeError):
        BlockingClient("127.0.0.1", node.port("native"), token="wrong")


def test_native_udp_needs_the_token_in_each_datagram(node):
    """A datagram without the token is answered code -1; with it, served."""
    assert json.loads(_udp(node, b'{"action":4,"queue":"nh-udp"}'))["code"] == -1
    reply = json.loads(_udp(node, json.dumps({"action": 4, "queue": "nh-udp", "token": TOKEN}).encode()))
    assert reply["code"] == 0


# -- native: unread replies, pages, UDP sizes, topic levels ---------------------------------------

def test_udp_list_is_refused_with_a_small_reply(node):
    """A list request over UDP gets a short error, not a reply a thousand times its size (a reflection amplifier)."""
    with BlockingClient("127.0.0.1", node.port("native"), token=TOKEN, timeout=30) as c:
        c.pipeline([{"action": 1, "queue": f"nh-u{i:03d}", "data": "x"} for i in range(300)])  # a ~30 KB list
    request = json.dumps({"action": 7, "token": TOKEN}).encode()
    reply = _udp(node, request)
    assert len(reply) < 4 * len(request) and json.loads(reply)["code"] == -1


@pytest.fixture(scope="module")
def many_queues(node):
    """1,000 queues with a message each, so that one unpaged list reply is about 85 KB."""
    names = [f"nh-q{i:04d}" for i in range(1000)]
    with BlockingClient("127.0.0.1", node.port("native"), token=TOKEN, timeout=30) as c:
        replies = c.pipeline([{"action": 1, "queue": n, "data": "x"} for n in names])
    assert all(r["code"] == 0 for r in replies)
    return names


def _requests_settled(client, timeout: float = 30.0) -> int:
    """Wait until the node's native request count (others' requests) stops moving for a second; return it."""
    last, since, deadline, polls = -1, time.monotonic(), time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        now = _requests_served(client) - polls
        polls += 1
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 1.0:
            return now
        time.sleep(0.2)
    return last


def test_unread_list_replies_do_not_grow_memory(node, many_queues):
    """1,500 list requests (limit 1,000) from a client that never reads: the node stops reading, RSS stays put."""
    watcher = BlockingClient("127.0.0.1", node.port("native"), token=TOKEN)
    before_requests = _requests_settled(watcher)
    before = anon_rss_kib(node.proc.pid)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", node.port("native")))
    try:
        request = json.dumps({"action": 7, "limit": 1000}).encode() + b"\n"
        try:
            sock.sendall(json.dumps({"action": "auth", "token": TOKEN}).encode() + b"\n" + request * 1500)
        except socket.timeout:
            pass  # the node stopped reading: what matters is that it did
        served = _requests_settled(watcher) - before_requests - 1  # the auth request is not counted: -1 for luck
        grown_mb = (anon_rss_kib(node.proc.pid) - before) / 1024
        print(f"RssAnon {before / 1024:.1f} MB -> {before / 1024 + grown_mb:.1f} MB (+{grown_mb:.1f} MB) "
              f"for {served} list requests nobody read")
        assert grown_mb < 32, f"RSS grew {grown_mb:.1f} MB for {served} list requests nobody read"
        assert served < 1500
    finally:
        sock.close()
        watcher.close()
    with BlockingClient("127.0.0.1", node.port("native"), token=TOKEN) as c:
        assert c.monitor("nh-q0001")["size"] == 1  # still serving


def test_list_replies_are_paged(node, many_queues):
    """queue_list answers list_page_size queues and a cursor; following the cursors lists each queue once."""
    with BlockingClient("127.0.0.1", node.port("native"), token=TOKEN) as c:
        first = c.request({"action": 7})
        assert len(first["queues"]) == 100 and first["cursor"]
        seen, cursor = [q["queue"] for q in first["queues"]], first["cursor"]
        for _ in range(50):
            page = c.request({"action": 7, "limit": 250, "cursor": cursor})
            seen += [q["queue"] for q in page["queues"]]
            cursor = page.get("cursor")
            if cursor is None:
                break
    assert [n for n in seen if n.startswith("nh-q")] == many_queues
    assert len(seen) == len(set(seen))


def test_udp_datagrams_up_to_the_limit_are_read_whole(node):
    """A 12,000-byte datagram (over Twisted's 8,192, under max_datagram_bytes) is served; a longer one refused."""
    def produce(size):
        head = {"action": 1, "queue": "nh-big", "token": TOKEN, "data": ""}
        pad = size - len(json.dumps(head).encode())
        return json.dumps(dict(head, data="x" * pad)).encode()
    served = json.loads(_udp(node, produce(12000)))
    assert served["code"] == 0, served
    refused = json.loads(_udp(node, produce(MAX_DATAGRAM + 5000)))
    assert refused["code"] == -1 and "max_datagram_bytes" in refused["reason"]


def test_native_topics_obey_max_topic_levels(node):
    """A native produce to a topic deeper than [limits] max_topic_levels is refused, as an MQTT publish is."""
    with BlockingClient("127.0.0.1", node.port("native"), token=TOKEN) as c:
        deep = c.request({"action": 1, "topic": "a/b/c/d/e", "data": "x"})
        ok = c.request({"action": 1, "topic": "a/b/c/d", "data": "x"})
    assert deep["code"] == -1 and "levels" in deep["reason"]
    assert ok["code"] == 0


# -- HTTP ------------------------------------------------------------------------------------------

def test_http_wrong_token_is_refused_before_the_body(node):
    """A POST to the API with a wrong token and a 200 MB Content-Length is answered 401 without sending a byte of body."""
    head = (b"POST /api/v1/clients HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
            b"Content-Type: application/json\r\nContent-Length: 200000000\r\n\r\n")
    assert _status(_http(node, head)) == 401


def test_http_body_over_the_cap_is_refused_before_it_is_read(node):
    """With the right token, a Content-Length over max_body_bytes is 413 at once; a chunked one past it too."""
    auth = f"Authorization: Bearer {ADMIN_TOKEN}\r\n".encode()
    head = b"POST /api/v1/clients HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 200000000\r\n\r\n"
    assert _status(_http(node, head)) == 413
    chunked = b"POST /api/v1/clients HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n"
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    assert _status(_http(node, chunked, [chunk] * 8)) == 413


def test_http_slow_body_times_out(node):
    """A body sent one byte every half second is cut at request_timeout_s with 408."""
    head = b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    started = time.monotonic()
    response = _http(node, head, [b"x"] * 40, gap=0.5, timeout=REQUEST_TIMEOUT_S + 8)
    assert _status(response) == 408
    assert time.monotonic() - started < REQUEST_TIMEOUT_S + 3


def test_dashboard_nul_name_is_a_quiet_404(node):
    """``/dashboard/x%00.js`` is 404 and leaves no traceback in the log."""
    response = _http(node, b"GET /dashboard/x%00.js HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _status(response) == 404
    logs = node_logs(node)
    assert "Traceback" not in logs and "CRITICAL" not in logs


# -- log volume ------------------------------------------------------------------------------------

def test_refused_retained_publishes_log_at_most_a_line_a_second(node):
    """40 retained publishes past the quota are all refused (PUBACK 0x97) but write about one log line a second."""
    c = raw(node.port("mqtt"))
    started = time.monotonic()
    try:
        codes = []
        for pid in range(1, 43):
            c.send(Publish(unique("nh/ret"), b"v", qos=1, packet_id=pid, retain=True))
            codes.append(c.recv().reason_code)
    finally:
        c.close()
    elapsed = time.monotonic() - started
    assert codes.count(0x97) >= 40
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "retained_quota_exceeded" not in node_logs(node):
        time.sleep(0.1)
    lines = [ln for ln in node_logs(node).splitlines() if "retained_quota_exceeded" in ln]
    assert 1 <= len(lines) <= elapsed + 2, lines
