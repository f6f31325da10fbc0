"""A TCP relay for tests and the chaos benchmark: listens on 127.0.0.1, forwards each connection to a target,
can be cut and restored.

Put it between two members (advertise its address instead of the real one) to break the link
between them on purpose::

    with Relay() as relay:          # listening now: relay.port, relay.address ("tcp:127.0.0.1:PORT")
        relay.target = ("127.0.0.1", broker_port)   # may be set after the relay started
        ...
        relay.cut()                 # open connections closed, new ones accepted and closed at once
        relay.cut(blackhole=True)   # or: connections stay open but every byte is dropped (a partition)
        relay.restore()             # forwarding again (for new connections; a cut closed the old ones)

Threads only (no reactor): an accept thread, and two pump threads per relayed connection. Every
socket is closed by ``close()``; ``connections`` counts the connections relayed so far.
"""

from __future__ import annotations

import socket
import threading

CHUNK = 65536


class Relay:
    """One listening port on 127.0.0.1 relaying to ``target`` (host, port)."""

    def __init__(self, target: tuple[str, int] | None = None) -> None:
        self.target = target
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.address = f"tcp:127.0.0.1:{self.port}"
        self.connections = 0
        """Connections relayed to the target (not counting those a cut refused)."""
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut = False
        self._blackhole = False
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept, name=f"relay-{self.port}", daemon=True)
        self._acceptor.start()

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- control --------------------------------------------------------------------------------------

    def cut(self, blackhole: bool = False) -> None:
        """Break the link: close every open connection and refuse new ones; with ``blackhole`` keep them
        open (and accept new ones) but drop every byte, as a network partition does."""
        with self._lock:
            self._cut, self._blackhole = not blackhole, blackhole
            pairs = [] if blackhole else list(self._pairs)
        for pair in pairs:
            self._drop(pair)

    def restore(self) -> None:
        """Forward again: new connections are relayed (and, after a blackhole, the open ones carry bytes again)."""
        with self._lock:
            self._cut = self._blackhole = False

    @property
    def is_cut(self) -> bool:
        return self._cut or self._blackhole

    def close(self) -> None:
        """Stop listening and close every relayed connection."""
        with self._lock:
            self._closed = True
            pairs = list(self._pairs)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for pair in pairs:
            self._drop(pair)
        self._acceptor.join(timeout=5)

    # -- threads --------------------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                refuse = self._closed or self._cut or self.target is None
            if refuse:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs.append(pair)
                self.connections += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, pair), daemon=True,
                                 name=f"relay-{self.port}-pump").start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair) -> None:
        while True:
            try:
                data = src.recv(CHUNK)
            except OSError:
                break
            if not data:
                break
            if self._blackhole:
                continue
            try:
                dst.sendall(data)
            except OSError:
                break
        self._drop(pair)

    def _drop(self, pair) -> None:
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
        for sock in pair:
            _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
