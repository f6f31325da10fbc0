"""The store interface: what a proxy, the native protocol server and Spark's broker mode need from a broker.

Typed ``Protocol``s and frozen, slotted data types only; no implementation.
``cluster.local.store.LocalStore`` serves it in-process and
``tests.contract.loopback_store.LoopbackStore`` proves that every call and result
survives the RPC codec (``cluster.remote.codec``); the remote implementation
of the clustered roles plugs in beside them.

Rules every implementation keeps (``tests/contract`` checks them on each):

- Every operation returns a Deferred, and a caller never relies on it having
  fired already: a remote store answers ticks later.
- Failures are ``StoreError`` subclasses (a code and a one-line message), so
  they cross an RPC boundary as the same type. Outcomes a caller must handle
  per message (a message the log cannot take) are statuses, not errors.
- Queue positions are opaque: a ``QueuePosition`` names the queue, the broker
  group serving it and the group's own offset. Callers compare positions and
  move past one with ``next()``; they never compute with offsets, so a filter
  read from several broker groups needs no change here.
- Arguments and results are these data types, ``store.record``'s ``Message``
  and ``Record``, tuples and plain values: nothing a codec cannot carry.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

from twisted.internet import defer

from store import (
    native_types,  # re-exported: the native request vocabulary the queue engine serves
)
from store.record import Message, Record

__all__ = [
    "AppendResult", "AppendStatus", "Fenced", "InvalidArgument", "NotAuthorized", "InternalError", "MessageLog", "NativeObject",
    "NativeQueues", "NotFound", "OutboundState", "Owed",
    "QueuePosition", "Queues", "QuotaExceeded", "ReadResult", "QueuedMessage", "Retained", "RetainedMessage",
    "SessionMeta", "SessionState", "Sessions", "Store", "StoreError", "SubscriptionState", "Timers", "Unavailable",
    "Watch", "WillState", "WrongGroup", "native_types",
]


# -- errors ----------------------------------------------------------------------------------------

class StoreError(Exception):
    """A failed store operation: ``code`` names the kind, the message says what and why in one line."""

    code = "store_error"


class InvalidArgument(StoreError):
    """The call is malformed: a bad topic filter, packet id, queue name, max_count..."""

    code = "invalid_argument"


class NotFound(StoreError):
    """The call names something the store does not hold: a filter without interest, a timer, a watch."""

    code = "not_found"


class WrongGroup(StoreError):
    """A position (or other state) of a broker group this store does not serve."""

    code = "wrong_group"


class QuotaExceeded(StoreError):
    """A limit refuses the write: retained messages or bytes."""

    code = "quota_exceeded"


class Unavailable(StoreError):
    """The store cannot serve now (not open, closing, a disk error): the call may succeed later."""

    code = "unavailable"


class NotAuthorized(StoreError):
    """A claim by an identity that does not own the session (another identity made it, or holds it now)."""

    code = "not_authorized"


class Fenced(StoreError):
    """A session write carries an epoch older than the session's last claim: another holder took it over.

    The writer must let the session go (MQTT-3.1.4-3: its client is disconnected, v5 reason 0x8E).
    """

    code = "fenced"


class InternalError(StoreError):
    """An unexpected failure inside the store (a bug): logged there, reported here."""

    code = "internal"


# -- retention ----------------------------------------------------------------------------------

class Owed(NamedTuple):
    """An owner still owes delivery of ``queue`` from ``queue_offset`` on (see ``store.retention``)."""

    owner: str  # who: "session <client id>", "share <group> <filter>", "native <queue> group <group>"
    queue: str
    queue_offset: int


# -- the message log ---------------------------------------------------------------------------------

class AppendStatus(enum.Enum):
    """Outcome of one append (RocketMQ's nouns; ``store.message_store.PutStatus`` is this enum)."""

    PUT_OK = "PUT_OK"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"  # cannot be encoded (bad UTF-8, too big, bad qos): nothing kept
    OS_ERROR = "OS_ERROR"  # the write failed (disk full, I/O error): nothing kept
    FLUSH_DISK_FAILED = "FLUSH_DISK_FAILED"  # sync flush: written, but the fsync failed
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"  # the store is not open
    # A master: written, but its group did not replicate it per the acknowledgement policy within call_timeout
    # (the client is answered as when the group is unreachable, and sends it again).
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"


class AppendResult(NamedTuple):
    """What an append resolves to.

    A named tuple rather than a frozen dataclass: the store answers every
    message with one, and a tuple is built in one call (``tuple.__new__``).
    """

    status: AppendStatus
    offset: int = -1
    """Commit-log offset of the record (-1 when nothing was kept): the native ``msg_id``, a timer's id."""
    queues: tuple[str, ...] = ()
    """The queues the record was indexed in (topic queue, one light queue per matching filter, ...)."""
    reason: str = ""
    """Why, when the status is not ``PUT_OK``."""

    @property
    def ok(self) -> bool:
        return self.status is AppendStatus.PUT_OK


class IndexedAppend(NamedTuple):
    """Where a batch's records went in queues its submitter asked about, told with the batch's answer.

    A broker tells it to the proxy that appended the batch (``append_batch_indexed``), for the queues that
    proxy watches, so the proxy answers its sessions' reads of those entries from the messages it sent instead
    of reading them back. Given only once readers may see the records (written under the flush policy, below
    a master's confirm offset), so nothing is delivered that a read of the broker would not return.
    """

    group: str
    """The broker group whose queues these are (the group of the positions)."""
    store_ts: int
    """The records' store time (ms): one per batch."""
    sizes: tuple[int, ...]
    """Each message's record size, in the batch's order (0 for a message that was not stored)."""
    firsts: dict[str, int]
    """Queue name -> queue offset of the batch's first entry in it; its next entries follow one by one, in
    the batch's order, for the messages whose ``AppendResult.queues`` name that queue."""
    ends: dict[str, int] = {}
    """Queue name -> queue offset after the batch's last entry in it (the broker's bookkeeping of what the
    proxy was told; not sent: the proxy counts its entries itself)."""


@runtime_checkable
class MessageLog(Protocol):
    """Writing messages: each is stored once, in the commit log, and indexed in its target queues."""

    def append(self, message: Message) -> defer.Deferred[AppendResult]:
        """Store one message; fires after its record is written (and, under the sync flush policy, fsynced).

        Fires with an ``AppendResult``: ``PUT_OK`` with the commit-log offset and
        target queues, or another status when the message was not kept. By then
        the record is indexed, so a read of its queues sees it.
        """

    def append_batch(self, messages: tuple[Message, ...]) -> defer.Deferred[tuple[AppendResult, ...]]:
        """Store many messages in one write; fires with one ``AppendResult`` per message, in order."""


# -- queues --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A place in one queue as one broker group numbers it; opaque to callers.

    Compare positions of the same queue and group with ``<``/``<=``; step past
    one with ``next()``. Comparing positions of different queues or groups is a
    ``TypeError`` (they are not ordered).
    """

    queue: str
    """Queue name: a light queue (``add_filter``'s answer), a topic queue or a native queue."""
    group: str
    """The broker group whose copy of the queue this position is in."""
    offset: int
    """That group's own queue offset: never compute with it."""

    def next(self) -> QueuePosition:
        """The position right after this one."""
        return QueuePosition(self.queue, self.group, self.offset + 1)

    # Written out rather than generated: positions are dict keys and set members on the delivery path,
    # and the generated methods build a tuple per call (string hashes are cached, so this is cheap).
    def __hash__(self) -> int:
        return self.offset ^ hash(self.queue)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not QueuePosition:
            return NotImplemented
        return self.offset == other.offset and self.queue == other.queue and self.group == other.group

    def _key(self, other: object) -> int:
        if not isinstance(other, QueuePosition) or (other.queue, other.group) != (self.queue, self.group):
            raise TypeError(f"positions of different queues or groups are not ordered: {self!r} vs {other!r}")
        return other.offset

    def __lt__(self, other: QueuePosition) -> bool:
        return self.offset < self._key(other)

    def __le__(self, other: QueuePosition) -> bool:
        return self.offset <= self._key(other)

    def __gt__(self, other: QueuePosition) -> bool:
        return self.offset > self._key(other)

    def __ge__(self, other: QueuePosition) -> bool:
        return self.offset >= self._key(other)


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """One message read from a queue, at its position."""

    position: QueuePosition
    record: Record


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What ``read_queue`` returns."""

    messages: tuple[QueuedMessage, ...]
    next: QueuePosition
    """Where the next read continues (after the last message, or past what is gone)."""
    lost: int = 0
    """Entries between the position asked for and ``next`` that retention deleted before anyone read them."""


@dataclass(frozen=True, slots=True)
class Watch:
    """A registration for a queue's news (``watch_queue``); hand it back to ``unwatch_queue``."""

    queue: str
    watch_id: int


@runtime_checkable
class Queues(Protocol):
    """Light queues (one per topic filter in use), topic consume queues and native queues: read, watch, filter."""

    def first_positions(self, queue: str) -> defer.Deferred[tuple[QueuePosition, ...]]:
        """The oldest readable position of ``queue`` in every broker group that holds it (one today).

        An unknown queue is empty: its first position is where its first entry will go.
        """

    def end_positions(self, queue: str) -> defer.Deferred[tuple[QueuePosition, ...]]:
        """The position the next entry of ``queue`` will get, in every broker group that holds it."""

    def read_queue(self, position: QueuePosition, max_count: int) -> defer.Deferred[ReadResult]:
        """Up to ``max_count`` messages of ``position.queue`` from ``position`` on, oldest first.

        Reads are bounded in count (at most 1,000) and bytes, so fewer may come
        back; an empty result means nothing is stored there yet. Fails with
        ``InvalidArgument`` for ``max_count`` < 1 and ``WrongGroup`` for a
        position of a group this store does not serve.
        """

    def add_filter(self, topic_filter: str, restoring: bool = False) -> defer.Deferred[str]:
        """Register one more subscriber's interest in ``topic_filter``; fires with its light queue's name.

        Messages appended after this fires and matching the filter are indexed in
        that queue. Reference-counted. Fails with ``InvalidArgument`` for an
        invalid filter, and with ``QuotaExceeded`` when a new filter would take
        the store past its bound on matching work (``[store] max_filter_shapes``),
        unless ``restoring``: the filter of a subscription accepted before (a
        session restored after a restart, interest taken again after a
        reconnect), which is never refused, so a lowered bound loses no stored
        subscription.
        """

    def remove_filter(self, topic_filter: str) -> defer.Deferred[None]:
        """Drop one reference to ``topic_filter``'s interest (the queue stays until collected).

        Fails with ``NotFound`` if nobody holds interest in it.
        """

    def watch_queue(self, queue: str, callback: Callable[[str], None]) -> defer.Deferred[Watch]:
        """Call ``callback(queue)`` whenever ``queue`` gains entries; fires with the ``Watch`` once registered.

        News raised in one tick is merged: one call per queue per tick, some tick
        after the append that caused it. The callback then reads from its own
        position; the event carries nothing else.
        """

    def unwatch_queue(self, watch: Watch) -> defer.Deferred[None]:
        """Stop a watch; fires once no more calls will come. ``NotFound`` for an unknown watch."""


# -- session state ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SessionMeta:
    """A persistent MQTT session's existence and expiry."""

    client_id: str
    expiry_s: int
    """Session expiry interval (0xFFFFFFFF: never)."""
    protocol_level: int
    """4 (MQTT 3.1.1) or 5."""
    disconnected_at_ms: int | None = None
    """When its client left (None: connected, or never disconnected since)."""
    owner: str | None = None
    """The identity that made the session (``user:NAME``, ``cert:IDENTITY`` or ``anonymous``); a CONNECT under
    another identity may not take it. None: stored before owners were recorded (the next CONNECT adopts it)."""


@dataclass(frozen=True, slots=True)
class SubscriptionState:
    """A subscription as persisted, with where its delivery resumes."""

    topic_filter: str
    qos: int
    positions: tuple[QueuePosition, ...]
    """Next position to send from in the filter's light queue, one per broker group holding it.

    Empty for a shared subscription: its share group's positions are kept with ``put_share_position``.
    """
    no_local: bool = False
    retain_as_published: bool = False
    sub_id: int = 0
    share_group: str | None = None

    @property
    def key(self) -> str:
        """The subscription's name within its session: the filter, or ``$share/<group>/<filter>``."""
        return self.topic_filter if self.share_group is None else f"$share/{self.share_group}/{self.topic_filter}"


@dataclass(frozen=True, slots=True)
class OutboundState:
    """An outbound QoS 1/2 PUBLISH sent and not yet acknowledged."""

    packet_id: int
    subscription_key: str
    """``SubscriptionState.key`` of the subscription it was sent for."""
    position: QueuePosition
    """Its position in that subscription's light queue."""
    qos: int


@dataclass(frozen=True, slots=True)
class SessionState:
    """Everything a persistent session needs to resume, as ``get_session`` returns it."""

    meta: SessionMeta
    subscriptions: tuple[SubscriptionState, ...] = ()
    """In key order."""
    outbound: tuple[OutboundState, ...] = ()
    """In packet-id order."""
    released: frozenset[int] = frozenset()
    """Outbound QoS 2 packet ids released (PUBREL owed until PUBCOMP)."""
    inbound_qos2: frozenset[int] = frozenset()
    """Inbound QoS 2 packet ids stored whose PUBREL has not come yet (exactly once)."""
    epoch: int = 0
    """The session epoch of the last ``claim_session`` (0: never claimed)."""
    holder: str = ""
    """Who made that claim (a proxy's member id; empty: never claimed)."""


@dataclass(frozen=True, slots=True)
class ClaimedSession:
    """What ``claim_and_get`` answers: the claim and what it found."""

    epoch: int
    """The new claim's epoch, as ``claim_session`` fires with it."""
    session: SessionState | None
    """The stored session, as ``get_session`` gives it after the claim (None: nothing stored)."""
    taken_from: str = ""
    """The holder whose claim this one replaced (empty: nobody held the id)."""


@dataclass(frozen=True, slots=True)
class WillState:
    """A client's will as its proxy decided it at CONNECT: what its group publishes if the holder is lost.

    Only a will the publish decision (``mqtt_proxy.publish_rules.decide``, with the ACL) accepted is
    stored: ``message`` is the verdict's message (its topic the one it is stored on), and it is
    published the way the verdict routes it (``put_retained`` for a retained one with a payload, else
    ``append``).
    """

    message: Message
    delay_s: int = 0
    """The Will Delay Interval (MQTT 5 3.1.3.2.2): counted from the loss of the connection."""


@dataclass(frozen=True, slots=True)
class HeldWill:
    """A stored will with the claim on record for its client id, as ``list_wills`` gives it."""

    client_id: str
    will: WillState
    epoch: int = 0
    """The epoch of the claim on record (0: none: an id its proxy assigned is never claimed)."""
    holder: str = ""
    """Who made that claim (empty: nobody)."""


@runtime_checkable
class Sessions(Protocol):
    """Durable MQTT session state: each write fires after the state is durable (survives kill -9).

    One holder at a time: ``claim_session`` records who holds a client id's
    session and bumps its epoch; every write of that session carries the epoch
    its writer claimed and is refused with ``Fenced`` when a newer claim exists,
    so a holder that was taken over (or merely stopped and woken) cannot change
    the session any more (MQTT-3.1.4-3); so is a write whose claim was
    released since. An epoch never handed out is ``InvalidArgument``; epoch 0
    (a writer that never claimed: an id its proxy assigned) passes while
    nobody holds a claim of the id. Packet ids are 1..65535; anything else fails with
    ``InvalidArgument``. Writes of one client id apply in call order.
    """

    def claim_session(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred[int]:
        """Record ``holder`` as the session's holder under a new epoch, durably; fires with that epoch.

        Works whether or not a session is stored (a CONNECT claims first). Epochs
        of one client id only grow, also across ``delete_session`` and
        ``release_session``: a write with an epoch from before either is ``Fenced``.
        ``owner`` is the identity connecting: a session stored by another
        identity, or claimed by one now, fails the claim with ``NotAuthorized``
        and nobody is fenced (empty: not checked; a session stored without an
        owner is anybody's). A store whose holder lives in its own process (a
        node's front end) may keep that holder's claim of an id nobody else
        holds in memory until the session's first write: it fences only
        writers that die with that memory (``cluster.local.sessions``).
        """

    def claim_and_get(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred[ClaimedSession]:
        """``claim_session``, then ``get_session``, in one call: a CONNECT's first question to the store.

        Fails as ``claim_session`` does (nothing read then). ``taken_from`` says whether anybody held
        the id, so a store spread over groups may leave a fresh id's other groups to be claimed at its
        first write there (``cluster.remote.routed_store``).
        """

    def release_session(self, client_id: str, epoch: int) -> defer.Deferred[None]:
        """The holder that claimed ``epoch`` lets the session go (its client left, or it expired).

        Unless a session is stored, the claim is forgotten, so client ids that
        come and go leave nothing behind. A release with an epoch that is not
        the last claim's (a holder taken over since) changes nothing.
        """

    def put_will(self, client_id: str, will: WillState, epoch: int) -> defer.Deferred[None]:
        """Store the will of the connection that holds ``epoch`` (replacing one stored before).

        Kept in the group of the will's topic (where it is published from). If
        the holder is lost (its lease ends) that group publishes it after its
        delay, unless a new claim of the client comes first (MQTT 5 3.1.2.8).
        """

    def delete_will(self, client_id: str, epoch: int) -> defer.Deferred[None]:
        """Forget the stored will (published by its holder, or cancelled by a normal DISCONNECT); no error if
        absent."""

    def get_session(self, client_id: str) -> defer.Deferred[SessionState | None]:
        """The stored session of ``client_id`` with everything under it, or None."""

    def list_sessions(self) -> defer.Deferred[tuple[SessionState, ...]]:
        """Every stored session, in client-id order (restore after a restart, admin listings)."""

    def list_wills(self) -> defer.Deferred[tuple[HeldWill, ...]]:
        """Every stored will, in client-id order, with its claim: a holder back from a crash publishes those its
        last life's connections left (they went with the process, and no DISCONNECT cancelled them)."""

    def put_session(self, meta: SessionMeta, epoch: int) -> defer.Deferred[None]:
        """Create or update a session's existence and expiry."""

    def delete_session(self, client_id: str, epoch: int) -> defer.Deferred[None]:
        """Remove a session and everything under it (subscriptions, in-flight state); no error if absent.

        The claim stays while its holder has the session (``release_session`` lets it go).
        """

    def put_subscription(self, client_id: str, subscription: SubscriptionState, epoch: int) -> defer.Deferred[None]:
        """Store a subscription under its key (replacing one with the same key).

        Its positions must be in the filter's light queue (else
        ``InvalidArgument``) and of groups this store serves (else ``WrongGroup``).
        """

    def delete_subscription(self, client_id: str, key: str, epoch: int) -> defer.Deferred[None]:
        """Remove the subscription named ``key`` (``SubscriptionState.key``); no error if absent."""

    def put_outbound(self, client_id: str, outbound: OutboundState, epoch: int) -> defer.Deferred[None]:
        """Record an outbound QoS 1/2 PUBLISH in flight."""

    def delete_outbound(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        """Forget an outbound PUBLISH (acknowledged, or released for QoS 2)."""

    def put_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        """Record that PUBREL was sent for an outbound QoS 2 message."""

    def delete_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        """Forget a released packet id (PUBCOMP came)."""

    def put_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        """Record an inbound QoS 2 message stored and answered with PUBREC."""

    def delete_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        """Forget an inbound QoS 2 packet id (PUBREL came)."""

    def get_share_positions(self, share_group: str,
                            topic_filter: str) -> defer.Deferred[tuple[QueuePosition, ...]]:
        """The committed positions of shared subscription ``$share/<share_group>/<topic_filter>``.

        One per broker group that has one; an empty tuple if none was committed.
        """

    def put_share_position(self, share_group: str, topic_filter: str,
                           position: QueuePosition) -> defer.Deferred[None]:
        """Commit a shared group's position in one broker group's copy of the filter's light queue."""


# -- retained messages ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RetainedMessage:
    """The retained message of one topic."""

    topic: str
    record: Record


@runtime_checkable
class Retained(Protocol):
    """The last retained publish per topic (MQTT-3.3.1-5..11)."""

    def get_retained(self, topic_filter: str) -> defer.Deferred[tuple[RetainedMessage, ...]]:
        """Every retained message whose topic matches ``topic_filter``, in topic order.

        A filter starting with a wildcard does not match ``$`` topics
        (MQTT-4.7.2-1). ``InvalidArgument`` for an invalid filter.
        """

    def put_retained(self, message: Message) -> defer.Deferred[AppendResult]:
        """Append a retained publish (``message.retain`` set, payload not empty); it replaces the topic's one.

        It is delivered to subscribers like any publish. Fails with
        ``QuotaExceeded`` when the retained limits refuse it and
        ``InvalidArgument`` for a message that is not a retained MQTT publish
        with a payload.
        """

    def delete_retained(self, topic: str) -> defer.Deferred[AppendResult]:
        """Clear ``topic``'s retained message: appends an empty retained publish (MQTT-3.3.1-10).

        Subscribers of the topic receive that empty publish, as when a client clears it.
        """


# -- timers ------------------------------------------------------------------------------------------------

@runtime_checkable
class Timers(Protocol):
    """Delayed delivery: a message parked until its time, then appended like any other."""

    def schedule_timer(self, message: Message, deliver_at_ms: int) -> defer.Deferred[AppendResult]:
        """Park ``message`` until ``deliver_at_ms`` (ms since the epoch); fires once the timer record is written.

        The result's ``offset`` is the timer's id (``cancel_timer``; the
        ``msg_id`` a delayed native produce reports). A message that cannot be
        scheduled gets ``MESSAGE_ILLEGAL``. A retained MQTT publish with a
        payload meets the retained limits when it is scheduled, as
        ``put_retained``: ``QuotaExceeded`` if they would be broken now.
        """

    def cancel_timer(self, timer_id: int) -> defer.Deferred[bool]:
        """Cancel a scheduled message; fires once the cancellation is written (it survives a restart).

        True: the timer had not come due, it will not be delivered. False: it
        had come due (it has probably been delivered). ``NotFound`` if
        ``timer_id`` is not a timer's id.
        """


# -- native queues ----------------------------------------------------------------------------------------

NativeObject = dict[str, Any]
"""A native protocol request or reply: one JSON object (``native_types`` names its actions and fields)."""


@runtime_checkable
class NativeQueues(Protocol):
    """The native queue engine (queue_server semantics) behind the native protocol: one door, a whole request.

    A native request goes whole to the broker group that owns its queue (by
    name) or topic (by first level): produce/consume/confirm with delay, ttl and
    retry, virtual queues, POP pop/ack/change-invisible-time, queue lists and
    monitors. The broker validates it with the native codec and its engine
    answers it, so both ends of a proxy need no knowledge of each action.
    """

    def native_request(self, request: NativeObject,
                       max_data_bytes: int | None = None) -> defer.Deferred[NativeObject]:
        """Serve one native request (the client's JSON object); fire with its reply object.

        The reply is ``{"code": 0, ...}`` or, for a request that is malformed
        or that the engine refuses, ``{"code": -1, "reason": ...}``: a bad
        request is answered, never failed. It fires after the state it
        reports is durable. ``max_data_bytes`` bounds the reply's data (a UDP
        listener's budget). Fails only when the store cannot serve at all
        (``Unavailable``).
        """


class Store(MessageLog, Queues, Sessions, Retained, Timers, NativeQueues, Protocol):
    """The whole store interface (one broker group's, or a cluster's behind one facade)."""
