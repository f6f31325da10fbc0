"""Python clients of the native protocol: a blocking one (sockets) and a Twisted one (pipelined Deferreds).

Blocking::

    from mqtt_proxy.native.client import BlockingClient
    with BlockingClient("127.0.0.1", 9876, token="...") as c:   # token: the server's [native] token, if set
        c.produce("jobs", "payload", retry=30)
        msg = c.consume("jobs")              # {"code": 0, "msg_id": ..., "data": ...} or {"code": 0}
        if "data" in msg:
            c.confirm("jobs", msg["msg_id"])

Twisted::

    proto = yield connect(reactor, "127.0.0.1", 9876, token="...")
    reply = yield proto.request({"action": 1, "queue": "jobs", "data": "x"})
"""

from __future__ import annotations

import collections
import itertools
import json
import socket
from typing import Callable

import orjson
from twisted.internet import defer, endpoints, protocol

from mqtt_proxy.native.codec import LineBuffer
from mqtt_proxy.twisted_internals import can_send_directly, send


def encode_request(req: dict) -> bytes:
    """One request line (compact JSON and ``\n``); orjson, or the stdlib for what orjson refuses."""
    try:
        return orjson.dumps(req) + b"\n"
    except TypeError:  # a lone surrogate, an integer past 64 bits: the stdlib writes them (escaped)
        return json.dumps(req).encode() + b"\n"


def decode_reply(line: bytes) -> dict:
    """One reply line as a dict (orjson, or the stdlib for what orjson reads differently or refuses)."""
    try:
        reply = orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)
    if type(reply) is not dict or any(type(v) is float for v in reply.values()):  # orjson reads integers past 64 bits as floats
        return json.loads(line)
    return reply


def auth_request(token: str) -> dict:
    """The request that presents the server's ``[native] token`` (a connection's first)."""
    return {"action": "auth", "token": token}


class NativeError(Exception):
    """A reply with ``code != 0``; ``.reply`` is the whole reply."""

    def __init__(self, reply: dict) -> None:
        super().__init__(reply.get("reason", f"code {reply.get('code')}"))
        self.reply = reply


class BlockingClient:
    """One TCP connection, one request at a time (or ``pipeline`` many)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9876, timeout: float = 10.0,
                 token: str | None = None) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lines = LineBuffer(64 * 1024 * 1024)
        self._ready: collections.deque = collections.deque()
        self._seq = itertools.count(1)
        if token is not None:
            try:
                self._ok(auth_request(token))
            except BaseException:
                self.sock.close()
                raise

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
        return decode_reply(self._ready.popleft())

    def pipeline(self, requests: list[dict]) -> list[dict]:
        """Send every request, then read the replies (in request order)."""
        self.sock.sendall(b"".join(encode_request(r) for r in requests))
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
    """Pipelined Twisted client: ``request(obj)`` fires with the reply (replies come in request order).

    ``call(obj, on_reply)`` is the same without a Deferred, for load generators:
    ``on_reply(reply)`` runs with the reply, or with ``{"code": -1, "reason":
    "connection lost"}`` if the connection goes first.
    """

    def __init__(self) -> None:
        self._lines = LineBuffer(64 * 1024 * 1024)
        self._waiting: collections.deque = collections.deque()  # Deferreds and on_reply callables
        self._direct = False
        self.closed: defer.Deferred = defer.Deferred()

    def connectionMade(self) -> None:
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)  # pipelined requests go out at once, not behind Nagle's wait for an ACK
        self._direct = can_send_directly(self.transport)

    def request(self, req: dict) -> defer.Deferred:
        return self.send_raw(encode_request(req))

    def call(self, req: dict, on_reply: Callable[[dict], None]) -> None:
        """Send ``req``; ``on_reply(reply)`` runs when its reply comes."""
        self._waiting.append(on_reply)
        send(self.transport, encode_request(req), self._direct)

    def send_raw(self, data: bytes, replies: int = 1) -> defer.Deferred:
        """Send raw bytes expecting ``replies`` reply lines; fires with the last one."""
        ds = [defer.Deferred() for _ in range(replies)]
        self._waiting.extend(ds)
        send(self.transport, data, self._direct)
        return ds[-1] if ds else defer.succeed(None)

    def dataReceived(self, data: bytes) -> None:
        waiting = self._waiting
        for line in self._lines.feed(data):
            if waiting:
                w = waiting.popleft()
                reply = decode_reply(line)
                if type(w) is defer.Deferred:
                    w.callback(reply)
                else:
                    w(reply)

    def connectionLost(self, reason=protocol.connectionDone) -> None:
        waiting, self._waiting = self._waiting, collections.deque()
        for w in waiting:
            if type(w) is defer.Deferred:
                w.errback(ConnectionError("connection lost"))
            else:
                w({"code": -1, "reason": "connection lost"})
        self.closed.callback(None)


def connect(reactor, host: str, port: int, token: str | None = None) -> defer.Deferred:
    """Connect a NativeClientProtocol over TCP; with ``token``, present it first (NativeError if refused)."""
    ep = endpoints.TCP4ClientEndpoint(reactor, host, port)
    d = endpoints.connectProtocol(ep, NativeClientProtocol())
    if token is None:
        return d

    def authenticate(proto):
        def checked(reply):
            if reply.get("code") != 0:
                raise NativeError(reply)
            return proto
        return proto.request(auth_request(token)).addCallback(checked)

    return d.addCallback(authenticate)
