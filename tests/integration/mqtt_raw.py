"""A blocking raw-socket MQTT client built on the project's codec, for tests that need exact packets.

Third-party clients hide what we must check here (packet ids, DUP, the order
of acknowledgements, reason codes), so these tests speak the wire directly.
"""

from __future__ import annotations

import socket
import time

from mqtt_proxy.codec import MQTTParser, encode
from mqtt_proxy.codec.errors import ProtocolError
from mqtt_proxy.codec.packets import Connect


class Closed(Exception):
    """The server closed the connection."""


class RawClient:
    """Send packets, receive packets, with a deadline on every wait."""

    def __init__(self, port: int, level: int = 5, timeout: float = 5.0) -> None:
        self.level = level
        self.timeout = timeout
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.parser = MQTTParser(server_side=False, protocol_level=level)
        self.inbox: list = []
        self.closed = False

    def connect(self, client_id: str, **kw):
        """Send CONNECT and return the CONNACK."""
        self.send(Connect(client_id=client_id, protocol_level=self.level, **kw))
        return self.recv()

    def send(self, packet) -> None:
        self.sock.sendall(encode(packet, self.level))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float | None = None):
        """The next packet; raises Closed if the server closes first, TimeoutError on the deadline."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while not self.inbox:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no packet from the server")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError("no packet from the server") from None
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                raise Closed()
            try:
                self.inbox.extend(self.parser.feed(data))
            except ProtocolError as exc:
                self.inbox.extend(exc.parsed)
                raise
        return self.inbox.pop(0)

    def recv_until(self, kind, timeout: float | None = None):
        """Packets up to and including the first of type ``kind``; returns (that packet, the ones before)."""
        before = []
        while True:
            p = self.recv(timeout)
            if isinstance(p, kind):
                return p, before
            before.append(p)

    def recv_all(self, quiet: float = 0.3) -> list:
        """Every packet that arrives until the server is quiet for ``quiet`` seconds."""
        out = []
        while True:
            try:
                out.append(self.recv(quiet))
            except (TimeoutError, Closed):
                return out

    def expect_closed(self, timeout: float = 5.0) -> list:
        """Packets received before the server closes; fails if it stays open."""
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                out.append(self.recv(deadline - time.monotonic()))
            except Closed:
                return out
        raise AssertionError(f"server did not close the connection; got {out}")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
