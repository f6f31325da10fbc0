"""One RPC connection's state machine, sans-IO (h2's shape): methods in, events out, bytes to send queued.

The handshake, a mutual challenge keyed by ``[cluster] secret``::

    client                                         server
    HELLO(identity, nonce_c)            ------>    AWAIT_HELLO: cluster id, version, node id checked
    AWAIT_CHALLENGE                     <------    CHALLENGE(identity, nonce_s, mac_s)
    mac_s checked, then PROOF(mac_c)    ------>    AWAIT_PROOF: mac_c checked
    AWAIT_HELLO_OK                      <------    HELLO_OK                          both OPEN

Each mac is ``frames.handshake_mac`` (HMAC-SHA256 over both nonces and both
identities, labelled by who proves), compared with ``hmac.compare_digest``.
The server proves first and the client proves only to a server that did, so
neither a fake client nor a fake server learns anything it could replay; an
empty secret is still a key, so a node with a secret refuses one without.
It authenticates the members at connect, not the bytes after: where someone
could sit in the middle, use ``ssl:`` endpoints. A refusal's reason names the
peer, never the secret.

States (one table, below). Once ``OPEN`` either side may call, answer, send
events and heartbeats. Anything the peer gets wrong (garbage, an oversized
frame, a frame out of turn, a wrong cluster id or secret) closes the
connection with a ``GOODBYE`` carrying the reason: the caller writes
``data_to_send()`` and drops the transport when it sees ``Closed``. Using the
connection wrongly ourselves (calling before it is open) raises
``LocalProtocolError``.

Request ids are allocated here; an answer to an id no longer waited for (the
caller timed it out and called ``forget``) is dropped.
"""

from __future__ import annotations

import enum
import hmac
import itertools
import os
from dataclasses import dataclass, replace
from typing import Callable

from cluster.rpc import frames
from cluster.rpc.frames import (
    NONCE_SIZE,
    Call,
    Challenge,
    Error,
    Event,
    Goodbye,
    Heartbeat,
    Hello,
    HelloOk,
    Proof,
    Result,
    handshake_mac,
)

__all__ = ["Closed", "Connection", "LocalProtocolError", "Opened", "State"]


class LocalProtocolError(Exception):
    """We used the connection wrongly (a call before the handshake, after close)."""


class State(enum.Enum):
    AWAIT_HELLO = "await_hello"  # server: nothing received yet
    AWAIT_CHALLENGE = "await_challenge"  # client: HELLO sent
    AWAIT_PROOF = "await_proof"  # server: CHALLENGE sent
    AWAIT_HELLO_OK = "await_hello_ok"  # client: PROOF sent
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


# What each state accepts from the peer (exact frame types); anything else is refused.
_ACCEPTS = {
    State.AWAIT_HELLO: (Hello,),
    State.AWAIT_CHALLENGE: (Challenge, Goodbye),
    State.AWAIT_PROOF: (Proof, Goodbye),
    State.AWAIT_HELLO_OK: (HelloOk, Goodbye),
    State.OPEN: (Call, Result, Error, Event, Heartbeat, Goodbye),
    State.CLOSED: (),
}

CLEAN_STOP = "stopping"
"""The goodbye reason of a clean stop."""

SECRET_MISMATCH = "did not prove the cluster secret ([cluster] secret differs between the two nodes)"
"""The end of a refusal's reason when a peer's mac is wrong (names the key, never its value)."""


class Connection:
    """``Connection(local, client, max_frame, secret, nonce)``: ``local`` is our identity; a client sends its
    HELLO at once. ``secret`` is ``[cluster] secret`` as bytes; ``nonce(n)`` gives n random bytes (injected
    by tests)."""

    def __init__(self, local: Hello, client: bool, max_frame: int, secret: bytes = b"",
                 nonce: Callable[[int], bytes] = os.urandom) -> None:
        self.local = replace(local, nonce=nonce(NONCE_SIZE))
        self.client = client
        self.peer: Hello | None = None
        """The other side's identity, once the handshake is done."""
        self._claimed: Hello | None = None  # who the peer says it is, until it has proved the secret
        self.state = State.AWAIT_CHALLENGE if client else State.AWAIT_HELLO
        self._secret = secret
        self._decoder = frames.FrameDecoder(max_frame)
        self._out: list[bytes] = []
        self._ids = itertools.count(1)
        self._waiting: set[int] = set()
        if client:
            self._send(self.local)

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
        if type(frame) not in _ACCEPTS[self.state]:
            return self._refuse(f"unexpected {type(frame).__name__} frame in state {self.state.value}")
        if isinstance(frame, Goodbye):
            self.state = State.CLOSED
            return Closed(frame.reason, by_peer=True, clean=frame.reason == CLEAN_STOP)
        if isinstance(frame, Challenge):
            return self._challenge(frame)
        if isinstance(frame, Hello):
            return self._hello(frame)
        if isinstance(frame, Proof):
            return self._proof(frame)
        if isinstance(frame, HelloOk):
            return self._open()
        if isinstance(frame, (Result, Error)):
            if frame.request_id not in self._waiting:
                return None  # answered after its caller gave up: dropped
            self._waiting.discard(frame.request_id)
        return frame

    def _identity_problem(self, peer: Hello) -> str | None:
        if peer.cluster_id != self.local.cluster_id:
            return f"wrong cluster id {peer.cluster_id!r} (this is {self.local.cluster_id!r})"
        if peer.version != self.local.version:
            return f"RPC version {peer.version} not spoken (this node speaks {self.local.version})"
        if not peer.node_id:
            return "empty node id"
        if len(peer.nonce) != NONCE_SIZE:
            return f"nonce of {len(peer.nonce)} bytes (a nonce is {NONCE_SIZE})"
        return None

    def _hello(self, hello: Hello):
        """Server: the client introduced itself; prove the secret over both nonces and ask for its proof."""
        problem = self._identity_problem(hello)
        if problem:
            return self._refuse(problem)
        self._claimed = hello
        mac = handshake_mac(self._secret, "server", hello, self.local)
        me = self.local
        self._send(Challenge(me.cluster_id, me.node_id, me.role, me.version, me.healthy, me.nonce, mac))
        self.state = State.AWAIT_PROOF
        return None

    def _challenge(self, challenge: Challenge):
        """Client: check the server's proof before giving ours (a fake server learns nothing it can use)."""
        problem = self._identity_problem(challenge)
        if problem:
            return self._refuse(problem)
        if not hmac.compare_digest(challenge.mac, handshake_mac(self._secret, "server", self.local, challenge)):
            return self._refuse(f"{_who(challenge)} {SECRET_MISMATCH}")
        me = self.local
        self._claimed = Hello(challenge.cluster_id, challenge.node_id, challenge.role, challenge.version,
                              challenge.healthy, challenge.nonce)
        self._send(Proof(handshake_mac(self._secret, "client", me, self._claimed)))
        self.state = State.AWAIT_HELLO_OK
        return None

    def _proof(self, proof: Proof):
        """Server: the client's proof; open, or refuse it."""
        if not hmac.compare_digest(proof.mac, handshake_mac(self._secret, "client", self._claimed, self.local)):
            return self._refuse(f"{_who(self._claimed)} {SECRET_MISMATCH}")
        self._send(HelloOk())
        return self._open()

    def _open(self) -> Opened:
        self.peer = self._claimed
        self.state = State.OPEN
        return Opened(self.peer)

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


def _who(peer: Hello) -> str:
    return f"{peer.role} {peer.node_id!r}"
