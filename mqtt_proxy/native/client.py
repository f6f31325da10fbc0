"""Python clients of the native protocol: a blocking one (sockets) and a Twisted one (pipelined Deferreds).

Blocking::

    from mqtt_proxy.native.client import BlockingClient
    with BlockingClient("127.0.0.1", 9876) as c:
        c.produce("jobs", "payload", retry=30)
        msg = c.consume("jobs")              # {"code": 0, "msg_id": ..., "data": ...} or {"code": 0}
        if "data" in msg:
            c.confirm("jobs", msg["msg_id"])

Twisted::

    proto = yield connect(reactor, "127.0.0.1", 9876)
    reply = yield proto.request({"action": 1, "queue": "jobs", "data": "x"})
"""

from __future__ import annotations

import collections
import itertools
import json
import socket

from twisted.internet import defer, endpoints, protocol

from mqtt_proxy.native.codec import LineBuffer


class NativeError(Exception):
    """A reply with ``code != 0``; ``.reply`` is the whole reply."""

    def __init__(self, reply: dict) -> None:
        super().__init__(reply.get("reason", f"code {reply.get('code')}"))
        self.reply = reply


class BlockingClient:
    """One TCP connection, one request at a time (or ``pipeline`` many)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9876, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lines = LineBuffer(64 * 1024 * 1024)
        self._ready: collections.deque = collections.deque()
        self._seq = itertools.count(1)

    def __enter__(self) -> "BlockingClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_reply(self) -> dict:
        while not self._ready:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self._ready.extend(self._lines.feed(chunk))
        return json.loads(self._ready.popleft())

    def pipeline(self, requests: list[dict]) -> list[dict]:
        """Send every request, then read the replies (in request order)."""
        self.sock.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        return [self.read_reply() for _ in requests]

    def request(self, req: dict) -> dict:
        return self.pipeline([req])[0]

    def _ok(self, req: dict) -> dict:
        reply = self.request(req)
        if reply.get("code") != 0:
            raise NativeError(reply)
        return reply

    def produce(self, queue: str, data: str, **fields) -> int:
        return self._ok({"action": 1, "queue": queue, "data": data, **fields})["msg_id"]

    def publish(self, topic: str, data: str, **fields) -> int:
        return self._ok({"action": 1, "topic": topic, "data": data, **fields})["msg_id"]

    def consume(self, queue: str | None = None, *, topic: str | None = None, **fields) -> dict:
        key = {"queue": queue} if queue is not None else {"topic": topic}
        return self._ok({"action": 2, **key, **fields})

    def confirm(self, queue: str, msg_id: int, **fields) -> dict:
        return self._ok({"action": 3, "queue": queue, "msg_id": msg_id, **fields})

    def pop(self, queue: str, group: str = "default", invisible_time: int = 30, **fields) -> dict:
        return self._ok({"action": 11, "queue": queue, "group": group, "invisible_time": invisible_time, **fields})

    def ack(self, queue: str, msg_id: int, group: str = "default", **fields) -> dict:
        return self._ok({"action": 12, "queue": queue, "group": group, "msg_id": msg_id, **fields})

    def monitor(self, queue: str) -> dict:
        return self._ok({"action": 4, "queue": queue})


class NativeClientProtocol(protocol.Protocol):
    """Pipelined Twisted client: ``request(obj)`` fires with the reply (replies come in request order)."""

    def __init__(self) -> None:
        self._lines = LineBuffer(64 * 1024 * 1024)
        self._waiting: collections.deque[defer.Deferred] = collections.deque()
        self.closed: defer.Deferred = defer.Deferred()

    def connectionMade(self) -> None:
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)  # pipelined requests go out at once, not behind Nagle's wait for an ACK

    def request(self, req: dict) -> defer.Deferred:
        return self.send_raw(json.dumps(req).encode() + b"\n")

    def send_raw(self, data: bytes, replies: int = 1) -> defer.Deferred:
        """Send raw bytes expecting ``replies`` reply lines; fires with the last one."""
        ds = [defer.Deferred() for _ in range(replies)]
        self._waiting.extend(ds)
        self.transport.write(data)
        return ds[-1] if ds else defer.succeed(None)

    def dataReceived(self, data: bytes) -> None:
        for line in self._lines.feed(data):
            if self._waiting:
                self._waiting.popleft().callback(json.loads(line))

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        waiting, self._waiting = self._waiting, collections.deque()
        for d in waiting:
            d.errback(ConnectionError("connection lost"))
        self.closed.callback(None)


def connect(reactor, host: str, port: int) -> defer.Deferred:
    """Connect a NativeClientProtocol over TCP."""
    ep = endpoints.TCP4ClientEndpoint(reactor, host, port)
    return endpoints.connectProtocol(ep, NativeClientProtocol())
