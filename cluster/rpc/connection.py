"""One RPC connection's state machine, sans-IO (h2's shape): methods in, events out, bytes to send queued.

States (one table, below): a client sends ``HELLO`` and waits for
``HELLO_OK``; a server waits for ``HELLO``, checks the cluster id and the
protocol version, and answers ``HELLO_OK`` or refuses with a ``GOODBYE``
naming why. Once ``OPEN`` either side may call, answer, send events and
heartbeats. Anything the peer gets wrong (garbage, an oversized frame, a frame
out of turn, a wrong cluster id) closes the connection with a ``GOODBYE``
carrying the reason: the caller writes ``data_to_send()`` and drops the
transport when it sees ``Closed``. Using the connection wrongly ourselves
(calling before it is open) raises ``LocalProtocolError``.

Request ids are allocated here; an answer to an id no longer waited for (the
caller timed it out and called ``forget``) is dropped.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

from cluster.rpc import frames
from cluster.rpc.frames import Call, Error, Event, Goodbye, Heartbeat, Hello, HelloOk, Result

__all__ = ["Closed", "Connection", "LocalProtocolError", "Opened", "State"]


class LocalProtocolError(Exception):
    """We used the connection wrongly (a call before the handshake, after close)."""


class State(enum.Enum):
    AWAIT_HELLO = "await_hello"  # server: nothing received yet
    AWAIT_HELLO_OK = "await_hello_ok"  # client: HELLO sent
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Opened:
    """The handshake is done; ``peer`` is the other side's identity."""

    peer: Hello


@dataclass(frozen=True, slots=True)
class Closed:
    """The connection is over: drop the transport after writing ``data_to_send()``."""

    reason: str
    by_peer: bool
    """True: the peer said goodbye (or refused us); False: we refused the peer."""
    clean: bool = False
    """True: a goodbye at a clean stop, not a refusal."""


# What each state accepts from the peer; anything else is refused.
_ACCEPTS = {
    State.AWAIT_HELLO: (Hello,),
    State.AWAIT_HELLO_OK: (HelloOk, frames.Goodbye),
    State.OPEN: (Call, Result, Error, Event, Heartbeat, Goodbye),
    State.CLOSED: (),
}

CLEAN_STOP = "stopping"
"""The goodbye reason of a clean stop."""


class Connection:
    """``Connection(local, client, max_frame)``: ``local`` is our HELLO; a client sends it at ``start()``."""

    def __init__(self, local: Hello, client: bool, max_frame: int) -> None:
        self.local = local
        self.client = client
        self.peer: Hello | None = None
        self.state = State.AWAIT_HELLO_OK if client else State.AWAIT_HELLO
        self._decoder = frames.FrameDecoder(max_frame)
        self._out: list[bytes] = []
        self._ids = itertools.count(1)
        self._waiting: set[int] = set()
        if client:
            self._send(Hello(local.cluster_id, local.node_id, local.role, local.version, local.healthy))

    # -- bytes --------------------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call."""
        out, self._out = b"".join(self._out), []
        return out

    def _send(self, frame) -> None:
        self._out.append(frames.encode(frame))

    # -- from the peer -----------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list:
        """Feed bytes from the peer; the events they complete (at most one ``Closed``, last)."""
        if self.state is State.CLOSED:
            return []
        try:
            received = self._decoder.feed(data)
        except frames.FrameError as exc:
            return [self._refuse(str(exc))]
        events: list = []
        for frame in received:
            event = self._handle(frame)
            if event is not None:
                events.append(event)
            if self.state is State.CLOSED:
                break
        return events

    def _handle(self, frame):
        if not isinstance(frame, _ACCEPTS[self.state]) or (self.state is State.AWAIT_HELLO
                                                            and isinstance(frame, HelloOk)):
            return self._refuse(f"unexpected {type(frame).__name__} frame in state {self.state.value}")
        if isinstance(frame, Goodbye):
            self.state = State.CLOSED
            return Closed(frame.reason, by_peer=True, clean=frame.reason == CLEAN_STOP)
        if isinstance(frame, Hello):
            return self._hello(frame)
        if isinstance(frame, (Result, Error)):
            if frame.request_id not in self._waiting:
                return None  # answered after its caller gave up: dropped
            self._waiting.discard(frame.request_id)
        return frame

    def _hello(self, hello: Hello):
        if hello.cluster_id != self.local.cluster_id:
            return self._refuse(f"wrong cluster id {hello.cluster_id!r} (this is {self.local.cluster_id!r})")
        if hello.version != self.local.version:
            return self._refuse(f"RPC version {hello.version} not spoken (this node speaks {self.local.version})")
        if not hello.node_id:
            return self._refuse("empty node id")
        self.peer = hello
        if not self.client:
            me = self.local
            self._send(HelloOk(me.cluster_id, me.node_id, me.role, me.version, me.healthy))
        self.state = State.OPEN
        return Opened(hello)

    def _refuse(self, reason: str) -> Closed:
        self._send(Goodbye(reason))
        self.state = State.CLOSED
        return Closed(reason, by_peer=False)

    # -- to the peer -------------------------------------------------------------------------------------

    def _require_open(self) -> None:
        if self.state is not State.OPEN:
            raise LocalProtocolError(f"connection is {self.state.value}, not open")

    def call(self, request_type: str, body: bytes) -> int:
        """Queue a call; its request id, which the ``Result`` or ``Error`` event will carry."""
        self._require_open()
        request_id = next(self._ids)
        self._waiting.add(request_id)
        self._send(Call(request_id, request_type, body))
        return request_id

    def forget(self, request_id: int) -> None:
        """Stop waiting for ``request_id`` (timed out): its late answer will be dropped."""
        self._waiting.discard(request_id)

    @property
    def waiting(self) -> int:
        """Calls sent and not answered."""
        return len(self._waiting)

    def answer(self, request_id: int, body: bytes) -> None:
        """Answer a received call."""
        if self.state is State.OPEN:  # a call answered after the connection closed is simply not sent
            self._send(Result(request_id, body))

    def fail(self, request_id: int, code: str, message: str) -> None:
        """Answer a received call with an error (``code`` a stable word, ``message`` one line)."""
        if self.state is State.OPEN:
            self._send(Error(request_id, code, " ".join(message.split())))

    def event(self, topic: str, body: bytes) -> None:
        """Send unsolicited news."""
        self._require_open()
        self._send(Event(topic, body))

    def heartbeat(self, healthy: bool) -> None:
        """Say we are alive, and whether we take work."""
        if self.state is State.OPEN:
            self._send(Heartbeat(healthy))

    def goodbye(self, reason: str = CLEAN_STOP) -> Closed | None:
        """Close from our side (a clean stop unless ``reason`` says otherwise)."""
        if self.state is State.CLOSED:
            return None
        self._send(Goodbye(reason))
        self.state = State.CLOSED
        return Closed(reason, by_peer=False, clean=reason == CLEAN_STOP)
