"""The HTTP bounds of ``cluster.runtime.http_bounds``: refusals before a body is read, a body cap, a deadline.

A ``BoundedSite`` over ``StringTransport`` and ``task.Clock``. These tests also
guard the Twisted internal the module relies on (``mqtt_proxy.twisted_internals.request_target``): if
twisted.web stops calling the hooks in this order, or stops setting the
request's path before ``gotLength``, they fail.
"""

from __future__ import annotations

from twisted.internet import task
from twisted.internet.testing import StringTransport
from twisted.web import resource

from cluster.runtime.http_bounds import BoundedSite, Refusal
from cluster.runtime.http import DashboardFiles


class Echo(resource.Resource):
    isLeaf = True
    posts = 0

    def render_POST(self, request):
        Echo.posts += 1
        return b"got %d" % len(request.content.read())

    def render_GET(self, request):
        return b"ok"


def _gate(path, request):
    if path is None or path.startswith(b"/api/"):
        if request.getHeader(b"authorization") != b"Bearer right":
            return Refusal(401, "unauthorized", "a bearer token is required",
                           {"WWW-Authenticate": 'Bearer realm="t"'})
    return None


def _site(clock, max_body=100, timeout=5.0, root=None):
    return BoundedSite(root or Echo(), max_body=max_body, request_timeout=timeout, gate=_gate, reactor=clock)


def _connect(site):
    channel = site.buildProtocol(None)
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport


def _status(transport) -> int:
    return int(transport.value().split(b" ", 2)[1])


def test_wrong_token_is_refused_before_the_body():
    """A POST to /api/ with a wrong token gets 401 from its headers alone; the connection closes."""
    clock = task.Clock()
    channel, transport = _connect(_site(clock, max_body=10_000_000))
    channel.dataReceived(b"POST /api/v1/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n")
    assert _status(transport) == 401 and b"www-authenticate" in transport.value().lower()
    assert transport.disconnecting
    posts = Echo.posts
    channel.dataReceived(b"hello")  # the body, arriving after the refusal, reaches no resource
    assert Echo.posts == posts


def test_right_token_body_is_served():
    """With the right token and a body under the cap, the resource gets the whole body."""
    clock = task.Clock()
    channel, transport = _connect(_site(clock))
    channel.dataReceived(b"POST /api/v1/x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer right\r\n"
                         b"Content-Length: 5\r\n\r\nhello")
    assert _status(transport) == 200 and transport.value().endswith(b"got 5")


def test_declared_length_over_the_cap_is_413_before_the_body():
    """A Content-Length over max_body is answered 413 at once, whatever the path."""
    clock = task.Clock()
    channel, transport = _connect(_site(clock, max_body=100))
    channel.dataReceived(b"POST /health HTTP/1.1\r\nHost: h\r\nContent-Length: 101\r\n\r\n")
    assert _status(transport) == 413 and transport.disconnecting


def test_chunked_body_over_the_cap_is_413():
    """A chunked body is counted as it comes: past max_body, 413 and close."""
    clock = task.Clock()
    channel, transport = _connect(_site(clock, max_body=100))
    channel.dataReceived(b"POST /health HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert transport.value() == b""
    channel.dataReceived(b"40\r\n" + b"x" * 64 + b"\r\n")
    assert transport.value() == b""
    channel.dataReceived(b"40\r\n" + b"x" * 64 + b"\r\n")
    assert _status(transport) == 413 and transport.disconnecting


def test_slow_body_times_out_though_bytes_keep_coming():
    """A body sent one byte at a time is cut at request_timeout (408), although each byte resets the idle timer."""
    clock = task.Clock()
    channel, transport = _connect(_site(clock, timeout=5.0))
    channel.dataReceived(b"POST /health HTTP/1.1\r\nHost: h\r\nContent-Length: 50\r\n\r\n")
    for _ in range(4):
        clock.advance(1)
        channel.dataReceived(b"x")
    assert transport.value() == b""
    clock.advance(1.5)
    assert _status(transport) == 408 and transport.disconnecting


def test_slow_headers_time_out_too():
    """The deadline starts at the request line: headers trickled in get 408 as well."""
    clock = task.Clock()
    channel, transport = _connect(_site(clock, timeout=5.0))
    channel.dataReceived(b"GET /health HTTP/1.1\r\n")
    for _ in range(6):
        clock.advance(1)
        channel.dataReceived(b"X-A: b\r\n")
    assert _status(transport) == 408


def test_request_in_time_leaves_no_timer_behind():
    """A request that arrives whole cancels its deadline: no 408 later on a kept-alive connection."""
    clock = task.Clock()
    channel, transport = _connect(_site(clock, timeout=5.0))
    channel.dataReceived(b"GET /health HTTP/1.1\r\nHost: h\r\n\r\n")
    assert _status(transport) == 200
    transport.clear()
    clock.advance(10)
    assert transport.value() == b""


def test_dashboard_name_with_nul_is_404(tmp_path):
    """A dashboard path with an encoded NUL (``x%00.js``) is a 404, not a 500 with a traceback."""
    (tmp_path / "app.js").write_text("1")
    root = resource.Resource()
    root.putChild(b"dashboard", DashboardFiles(str(tmp_path)))
    clock = task.Clock()
    channel, transport = _connect(_site(clock, root=root))
    channel.dataReceived(b"GET /dashboard/x%00.js HTTP/1.1\r\nHost: h\r\n\r\n")
    assert _status(transport) == 404 and not transport.disconnecting


def test_gate_sees_the_path_before_the_body():
    """The gate gets the request's path before the body (HTTPChannel._path): a body to /health is not gated."""
    clock = task.Clock()
    seen = []
    site = BoundedSite(Echo(), max_body=100, request_timeout=5.0, reactor=clock,
                       gate=lambda path, request: seen.append(path))
    channel, transport = _connect(site)
    channel.dataReceived(b"POST /health?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n")
    assert seen == [b"/health?x=1"] and transport.value() == b""
    channel.dataReceived(b"ab")
    assert _status(transport) == 200 and transport.value().endswith(b"got 2")


def test_token_is_checked_before_the_size():
    """A wrong token with a body over the cap is 401, not 413: a client without the token learns no limit."""
    clock = task.Clock()
    channel, transport = _connect(_site(clock, max_body=100))
    channel.dataReceived(b"POST /api/v1/x HTTP/1.1\r\nHost: h\r\nContent-Length: 200000000\r\n\r\n")
    assert _status(transport) == 401
