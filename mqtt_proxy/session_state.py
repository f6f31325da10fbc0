"""The MQTT session machine, sans I/O: subscriptions, packet ids, both windows, topic aliases, the will, the phase.

``SessionState`` is a closed state machine (h11's pattern): it does no I/O,
keeps no timers, and its state changes only through its events, which are
method calls: the session's life (``connect_accepted``, ``attach``,
``detach``, ``disconnect_received``, ``expired``, ``restored``,
``subscribed``/``unsubscribed``, ``ended``), what a read of a queue brings
(``messages_read``, for a session's own subscriptions and, one message at a
time, for a shared group's; ``retained_read``; ``unsent``), the client's
acknowledgements (``puback``, ``pubrec``, ``pubcomp``), and its PUBLISHes
(``publish_received``, ``publish_accepted``, ``publish_stored``,
``publish_failed``, ``pubrel_received``). Each answers with actions: a
``Delivery`` per read (send these records with this QoS, packet id and RETAIN
flag; advance the position to here; count these expired), the ``PublishForm``
of a v5 PUBLISH (topic alias included), and small frozen dataclasses for the
rest (send a PUBREL or PUBREC, persist or delete an outbound entry or an
inbound QoS 2 id, tell a shared group, by its subscription key, that a message
is done, schedule or publish the will). What the client did wrong is a
``PeerError`` (a reason code and a line); what the adapter did wrong, a
``SessionStateError``. The adapter reads the state, never writes it.

``Phase`` is a connection's place in its life (CONNECT, CONNACK, closing), with
its transition table. ``session.py`` is the Twisted-side adapter that feeds
the session machine, encodes and writes; ``publish.py`` feeds it the client's
PUBLISHes; ``shared.py`` offers a group's messages to its members' machines.

Nothing here imports Twisted, the store or push: it runs the same under a test with no reactor.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from mqtt_proxy import message_props
from mqtt_proxy.codec import ReasonCode, encode_properties
from mqtt_proxy.codec.wire import PacketType
from store.record import EXPIRES_AT

NEVER_EXPIRES = 0xFFFFFFFF
NO_PACKET_IDS: Mapping[int, None] = MappingProxyType({})  # shared by every session until it holds one
NO_ACTIONS: tuple = ()  # what most events return


class _NoEntries(dict):
    """The empty dict idle sessions share for their subscriptions and in-flight messages (64 bytes each saved
    per connection): it takes no entries, a session takes a dict of its own first (``own_subs``,
    ``own_outbound``)."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("the shared empty mapping takes no entries: use the session's own dict")

    __setitem__ = setdefault = update = _refuse


NO_ENTRIES: dict = _NoEntries()
MAX_PACKET_ID = 65535


class SessionStateError(Exception):
    """The adapter misused the state machine (not the peer misbehaving): e.g. no packet id is free."""


class PeerError(Exception):
    """The client broke the protocol: the adapter answers with ``reason_code`` (a DISCONNECT's, or the
    acknowledgement's where the packet has one) and logs ``text``."""

    def __init__(self, reason_code: int, text: str) -> None:
        super().__init__(text)
        self.reason_code = reason_code
        self.text = text


class Phase(enum.Enum):
    """Where one connection is in its life; its protocol object holds one and changes it only with ``Phase.after``."""

    AWAITING_CONNECT = "awaiting_connect"
    """Nothing read yet: the first packet must be CONNECT (MQTT-3.1.0-1)."""
    CONNECTING = "connecting"
    """CONNECT read and being answered (authentication, the session claim): later packets wait for CONNACK."""
    CONNECTED = "connected"
    """CONNACK sent and the session bound: packets are handled as they come."""
    CLOSING = "closing"
    """Closing (refused, disconnected, timed out, a protocol error): nothing more is read or written."""

    def after(self, event: "PhaseEvent") -> "Phase":
        """The phase ``event`` leads to; ``SessionStateError`` for an event the phase does not take (our misuse)."""
        following = _PHASES.get((self, event))
        if following is None:
            raise SessionStateError(f"{event.name} in phase {self.name}")
        return following


class PhaseEvent(enum.Enum):
    """What moves a connection from one phase to the next."""

    CONNECT = "connect"
    """The client's CONNECT was read."""
    CONNACK = "connack"
    """CONNECT was answered with success and the session is bound."""
    CLOSE = "close"
    """The connection is being closed, for whatever reason."""


_PHASES = {
    (Phase.AWAITING_CONNECT, PhaseEvent.CONNECT): Phase.CONNECTING,
    (Phase.CONNECTING, PhaseEvent.CONNACK): Phase.CONNECTED,
    (Phase.AWAITING_CONNECT, PhaseEvent.CLOSE): Phase.CLOSING,
    (Phase.CONNECTING, PhaseEvent.CLOSE): Phase.CLOSING,
    (Phase.CONNECTED, PhaseEvent.CLOSE): Phase.CLOSING,
    (Phase.CLOSING, PhaseEvent.CLOSE): Phase.CLOSING,
}


@dataclass(slots=True)
class SubOptions:
    """A subscription's options as the machine decides deliveries by them (MQTT-3.8.3.1): its own, changed only
    by its events (``subscribed``, ``resubscribed``); the adapter reads them."""

    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    sub_id: int = 0  # the Subscription Identifier (v5), 0 for none


@dataclass(slots=True)
class Outbound:
    """A QoS 1/2 PUBLISH sent and not yet completed."""

    sub_key: str | None  # None: a retained message sent on subscribe (not tied to a queue position)
    position: object  # the message's QueuePosition (opaque here; None for a retained one)
    qos: int
    released: bool = False  # QoS 2: PUBREC seen, PUBREL sent, waiting for PUBCOMP
    group: str | None = None  # a shared group's: the member's subscription key (the group keeps the offset)


# -- actions: what the adapter must do -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendPubRel:
    """Send PUBREL for ``packet_id`` (QoS 2, after PUBREC, and again on reconnect)."""

    packet_id: int


# Not frozen, like ``store.record.Record``: one of each is made per QoS 1 message of a persistent session, and
# a frozen dataclass's __init__ costs about 3x a plain one. Treat them as immutable all the same.
@dataclass(slots=True)
class SaveOutbound:
    """Persist an in-flight QoS 1/2 PUBLISH so a restart resends it (persistent sessions only)."""

    packet_id: int
    sub_key: str
    position: object
    qos: int


@dataclass(slots=True)
class DeleteOutbound:
    """Forget a persisted in-flight PUBLISH."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class SaveReleased:
    """Persist that ``packet_id`` is released (PUBREL sent, PUBCOMP awaited)."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class DeleteReleased:
    """Forget a persisted released packet id."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class SendPubRec:
    """Send PUBREC for ``packet_id`` again: a QoS 2 resend of a message already stored (MQTT-4.3.3-9)."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class SaveInboundQos2:
    """Persist that inbound QoS 2 ``packet_id`` is stored and not yet released, before its PUBREC."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class DeleteInboundQos2:
    """Forget a persisted inbound QoS 2 packet id, before its PUBCOMP."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class GroupAcked:
    """Tell the shared group of subscription ``group`` (its key) that its message at ``position`` is done with."""

    group: str
    position: object


@dataclass(frozen=True, slots=True)
class PumpSoon:
    """The window has room again: pull more before this tick ends."""


@dataclass(frozen=True, slots=True)
class Resend:
    """After a reconnect: read the message at ``position`` of ``sub_key`` and send it again with DUP set."""

    packet_id: int
    sub_key: str
    position: object


@dataclass(frozen=True, slots=True)
class PublishWill:
    """Publish the will now."""

    will: object


@dataclass(frozen=True, slots=True)
class ScheduleWill:
    """Publish the will after ``delay`` seconds unless the client returns first (MQTT-3.1.3-9)."""

    will: object
    delay: float


PUMP_SOON = PumpSoon()


class PublishForm:
    """How one v5 PUBLISH goes out (``publish_properties``): a slotted object, one per message sent with properties."""

    __slots__ = ("topic", "properties", "assigned_alias")

    def __init__(self, topic: str, properties: bytes, assigned_alias: str | None) -> None:
        self.topic = topic
        """The topic name to send: empty when the client knows the topic's alias already (3.3.2.3.4)."""
        self.properties = properties
        """The encoded properties block."""
        self.assigned_alias = assigned_alias
        """The topic whose alias this PUBLISH introduces (withdrawn if it is never sent), or None."""


class Delivery:
    """What to do with one read of a subscription's queue: ``SessionState.messages_read``'s answer.

    A plain slotted object, one per read, because this is the fan-out path: each
    send is a tuple ``(message, qos, packet_id, retain)`` (the queue message as
    read, the QoS granted, None at QoS 0, the RETAIN flag to send), not an
    object of its own.
    """

    __slots__ = ("sends", "position", "expired", "stopped", "actions", "_expired_at")

    def __init__(self, position) -> None:
        self.sends: list[tuple] = []
        """Send these, in order: ``(message, qos, packet_id, retain)``."""
        self.position = position
        """Advance the subscription's position to this: the next read starts here."""
        self.expired = 0
        """Messages skipped because their Message Expiry Interval had passed (MQTT-3.3.2-5): count them."""
        self.stopped = False
        """The window (or the connection) filled before the read's end: pump again after acknowledgements."""
        self.actions: list = []
        """Carry these out: before the sends of a read (in-flight messages to persist); at once for ``unsent``'s
        answer (the packet ids of what was not sent, freed)."""
        self._expired_at: list[int] | None = None  # len(sends) at each expired message: ``unsent`` recounts


class SessionState:
    """One client id's session state, connected or not, with no I/O.

    ``subs`` maps a subscription key to its ``SubOptions``: the machine knows a
    subscription by its key alone (the adapter keeps its own objects for queue
    positions and reads). A shared group is named by its member's subscription key.
    """

    __slots__ = ("level", "expiry", "max_inflight", "connected", "subs", "outbound", "inbound_qos2",
                 "inbound_inflight", "inbound_aliases", "receive_maximum", "max_packet_size", "alias_maximum",
                 "aliases", "will", "pending_will", "_next_pid")

    def __init__(self, level: int, expiry: int, max_inflight: int) -> None:
        self.level = level
        self.expiry = expiry
        self.max_inflight = max_inflight  # the server's cap
        self.connected = False
        self.subs: dict[str, SubOptions] = NO_ENTRIES  # own_subs() before adding one
        self.outbound: dict[int, Outbound] = NO_ENTRIES  # own_outbound() before adding one
        self.inbound_qos2: Mapping[int, None] = NO_PACKET_IDS  # QoS 2 ids received, not released yet
        self.inbound_inflight = 0  # the client's QoS 1/2 PUBLISHes on this connection not yet acknowledged
        self.inbound_aliases: dict[int, str] | None = None  # the client's topic aliases, made by the first (v5)
        self.receive_maximum = 65535  # the client's, v5
        self.max_packet_size = 0  # the client's, 0 = no limit
        self.alias_maximum = 0  # topic aliases the client accepts from us
        self.aliases: dict[str, int] | None = None  # made when the first alias is given out
        self.will = None
        self.pending_will = None  # a will waiting on its delay
        self._next_pid = 1

    def own_subs(self) -> dict:
        """The session's own subscriptions dict (made on first use: an idle session shares an empty one)."""
        if self.subs is NO_ENTRIES:
            self.subs = {}
        return self.subs

    def own_outbound(self) -> dict:
        """The session's own in-flight dict (made on first use: an idle session shares an empty one)."""
        if self.outbound is NO_ENTRIES:
            self.outbound = {}
        return self.outbound

    @property
    def persistent(self) -> bool:
        return self.expiry > 0

    # -- the session's life --------------------------------------------------------------------

    def restored(self, outbound, released, inbound_qos2) -> tuple:
        """Event: the session comes back from the store after a restart: ``outbound`` (``OutboundState``-like:
        ``packet_id``, ``subscription_key``, ``position``, ``qos``) in flight, ``released`` QoS 2 ids awaiting
        PUBCOMP, ``inbound_qos2`` ids received and not yet released (MQTT-4.1.0-1)."""
        for o in outbound:
            self.own_outbound()[o.packet_id] = Outbound(o.subscription_key, o.position, o.qos)
        for pid in released:
            self.own_outbound()[pid] = Outbound(None, None, 2, released=True)
        for pid in inbound_qos2:
            self._hold_inbound_qos2(pid)
        return NO_ACTIONS

    def subscribed(self, key: str, options: SubOptions) -> tuple:
        """Event: a subscription ``key`` was made (or restored) with ``options``; reads of it go by them."""
        self.own_subs()[key] = options
        return NO_ACTIONS

    def resubscribed(self, key: str, qos: int, no_local: bool, retain_as_published: bool, sub_id: int) -> tuple:
        """Event: a SUBSCRIBE repeats subscription ``key``: its options are replaced, what it is owed is kept
        (MQTT-3.8.4-3); the next read goes by the new ones."""
        options = self.subs[key]
        options.qos = qos
        options.no_local = no_local
        options.retain_as_published = retain_as_published
        options.sub_id = sub_id
        return NO_ACTIONS

    def unsubscribed(self, key: str) -> tuple:
        """Event: subscription ``key`` is gone; what it has in flight is resent no more (``resend_plan``)."""
        self.subs.pop(key, None)
        return NO_ACTIONS

    def ended(self) -> tuple:
        """Event: the session ends (expiry, clean start, takeover elsewhere): it holds nothing any more."""
        self.subs = NO_ENTRIES
        self.outbound = NO_ENTRIES
        return NO_ACTIONS

    # -- connection ----------------------------------------------------------------------------

    def connect_accepted(self, expiry: int, will, receive_maximum: int = 65535, max_packet_size: int = 0,
                         alias_maximum: int = 0) -> tuple:
        """Event: a CONNECT for this session passed: its Session Expiry Interval, will and (v5) the client's
        Receive Maximum, Maximum Packet Size and Topic Alias Maximum hold from now on (MQTT-3.1.2)."""
        self.expiry = expiry
        self.will = will
        self.receive_maximum = receive_maximum
        self.max_packet_size = max_packet_size
        self.alias_maximum = alias_maximum
        return NO_ACTIONS

    def disconnect_received(self, expiry_interval: int | None, expiry_max: int) -> tuple:
        """Event: DISCONNECT, with the Session Expiry Interval it carries (v5; None: unchanged), capped at
        ``expiry_max``. ``PeerError`` when a session made non-persistent at CONNECT asks to persist (MQTT-3.14.2-2)."""
        if expiry_interval is None:
            return NO_ACTIONS
        if self.expiry == 0 and expiry_interval != 0:
            raise PeerError(ReasonCode.PROTOCOL_ERROR,
                            "a session expiry interval on DISCONNECT after 0 at CONNECT (MQTT-3.14.2-2)")
        self.expiry = min(expiry_interval, expiry_max) if expiry_interval != NEVER_EXPIRES else NEVER_EXPIRES
        return NO_ACTIONS

    def attach(self, level: int) -> tuple:
        """Event: a connection (fresh or resumed) is bound: aliases both ways and inbound flow control start over
        (MQTT-3.3.2-7/-12), a pending will is off."""
        self.connected = True
        self.level = level
        self.aliases = None
        self.inbound_inflight = 0  # flow control and the client's aliases are the connection's (MQTT-3.3.2-12)
        self.inbound_aliases = None
        self.pending_will = None
        return NO_ACTIONS

    def detach(self, publish_will: bool) -> list:
        """Event: the connection is gone: shared-group and retained sends are forgotten; the will, if due, goes out.

        A Will Delay Interval defers the will, which goes out when the delay or the
        session ends, whichever is first (3.1.3.2.2); a return in time cancels it (MQTT-3.1.3-9).
        """
        self.connected = False
        for pid in [p for p, o in self.outbound.items() if o.group is not None or o.sub_key is None]:
            del self.outbound[pid]
        will, self.will = self.will, None
        if will is None or not publish_will:
            return []
        delay = will.properties.will_delay_interval or 0
        if delay and self.persistent:
            if self.expiry != NEVER_EXPIRES:
                delay = min(delay, self.expiry)
            self.pending_will = will
            return [ScheduleWill(will, delay)]
        return [PublishWill(will)]

    def expired(self) -> list:
        """Event: the session expired: a will still waiting on its delay goes out now (the session ends first)."""
        will, self.pending_will = self.pending_will, None
        return [PublishWill(will)] if will is not None else []

    def expiry_deadline_ms(self, since_ms: int) -> int | None:
        """When a session disconnected at ``since_ms`` expires; None if it never does or is connected."""
        if self.expiry == NEVER_EXPIRES or self.connected:
            return None
        return since_ms + self.expiry * 1000

    # -- packet ids and the window ----------------------------------------------------------------

    @property
    def window(self) -> int:
        """How many more QoS>0 messages may be in flight now (MQTT-3.3.4-9: the client's Receive Maximum)."""
        return min(self.receive_maximum, self.max_inflight) - len(self.outbound)

    def _allocate_pid(self) -> int:
        for _ in range(MAX_PACKET_ID):
            pid = self._next_pid
            self._next_pid = pid % MAX_PACKET_ID + 1
            if pid not in self.outbound:
                return pid
        raise SessionStateError("no free packet identifier")

    def retained_read(self, key: str, record) -> Delivery:
        """Event: a retained ``record`` matches a new subscription; its one send carries the record itself.

        It goes out with RETAIN set (MQTT-3.3.1-8) at the lower of its QoS and the
        subscription's, not tied to a queue position and never persisted; with the
        window full of live traffic it is skipped rather than overrun the client
        (a stopped Delivery with no sends).
        """
        d = Delivery(None)
        granted = self.subs[key].qos
        qos = record.qos if record.qos < granted else granted
        if qos and self.window <= 0:
            d.stopped = True
            return d
        pid = None
        if qos:
            pid = self._allocate_pid()
            self.own_outbound()[pid] = Outbound(None, None, qos)
        d.sends.append((record, qos, pid, True))
        return d

    def messages_read(self, key: str, messages, next_position, client_id: str, now_ms: int,
                      group: str | None = None) -> Delivery:
        """Event: ``messages`` were read from one of subscription ``key``'s positions, ``next_position`` right after
        them.

        With ``group`` (the shared subscription's key) they are a shared group's,
        handed to this member one at a time: the same decisions, but the group
        keeps the offset, so nothing is persisted and the group is told when each
        is done (``GroupAcked``); a stopped Delivery means this member has no room.

        Decides per message, in order: the QoS granted (the lower of the message's
        and the subscription's, MQTT-3.8.4-8), whether the window has room (a QoS
        1/2 message beyond the client's Receive Maximum waits, MQTT-3.3.4-9, and so
        does everything after it: order is kept, MQTT-4.6.0-6), No Local (never
        back to its publisher, MQTT-3.8.3-3), expiry (an expired message is not
        sent, MQTT-3.3.2-5), a packet id for QoS 1/2 (MQTT-2.2.1-3) and RETAIN as published
        or cleared (MQTT-3.3.1-12/-13), by the subscription's ``SubOptions``; a
        message needs ``position`` and a ``record``
        with ``qos``, ``client_id``, ``properties`` and ``retain``.
        """
        d = Delivery(next_position)
        sends = d.sends
        window = self.window
        options = self.subs[key]
        granted = options.qos
        no_local = options.no_local
        as_published = options.retain_as_published
        outbound = self.own_outbound()
        save = self.persistent and group is None
        actions = d.actions
        expired = message_props.expired
        next_pid = self._next_pid
        for m in messages:
            record = m.record
            qos = record.qos if record.qos < granted else granted
            if qos and window <= 0:
                d.position = m.position
                d.stopped = True
                break
            if no_local and record.client_id == client_id:
                continue
            props = record.properties
            if props and EXPIRES_AT in props and expired(props, now_ms):
                d.expired += 1
                if d._expired_at is None:
                    d._expired_at = []
                d._expired_at.append(len(sends))
                continue
            if qos:
                window -= 1
                pid = next_pid  # _allocate_pid, inline for the usual case: the next id is free
                if pid in outbound:
                    self._next_pid = pid
                    pid = self._allocate_pid()
                    next_pid = self._next_pid
                else:
                    next_pid = pid % MAX_PACKET_ID + 1
                position = m.position
                outbound[pid] = Outbound(key, position, qos, False, group)
                if save:
                    actions.append(SaveOutbound(pid, key, position, qos))
            else:
                pid = None
            sends.append((m, qos, pid, record.retain and as_published))
        self._next_pid = next_pid
        return d

    def unsent(self, d: Delivery, written: int) -> Delivery:
        """Event: the connection filled after ``written`` of ``d.sends`` went out; the rest wait for the next read.

        The answer replaces ``d`` (which stays as it was): the sends that went, the
        position back at the first that did not, so nothing is skipped, the expired
        messages before it, and as ``actions`` (to carry out now) what frees the
        packet ids of the rest (a persisted one is deleted).
        """
        rest = d.sends[written:]
        if not rest:
            return d
        u = Delivery(rest[0][0].position)
        u.sends = d.sends[:written]
        u.stopped = True
        u.expired = d.expired
        if d._expired_at is not None:  # expired messages after the first unsent one are read (and counted) again
            u.expired = sum(1 for at in d._expired_at if at <= written)
        actions = u.actions
        for _, _, pid, _ in rest:
            if pid is not None:
                actions += self.complete(pid)
        return u

    # -- acknowledgements ----------------------------------------------------------------------

    def puback(self, packet_id: int) -> list:
        """QoS 1 done (MQTT-4.3.2-5): the packet id is free again. ``PeerError`` if it was not a QoS 1 in flight."""
        o = self.outbound.get(packet_id)
        if o is None or o.qos != 1:
            raise PeerError(ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, f"PUBACK for packet id {packet_id} not in flight")
        if o.group is None:  # the common cases: nothing to count; at most the persisted entry to delete
            del self.outbound[packet_id]
            if self.persistent and o.sub_key is not None:
                return [DeleteOutbound(packet_id), PUMP_SOON]
            return [PUMP_SOON]
        return self.complete(packet_id) + [PUMP_SOON]

    def pubacks(self, packet_ids) -> list:
        """Event: a run of PUBACKs (one read's), each as ``puback``, with one ``PumpSoon`` after them all. An id
        not in flight as QoS 1 is passed over, as ``puback``'s ``PeerError`` is (a late duplicate after a resend)."""
        outbound = self.outbound
        delete = self.persistent
        actions: list = []
        done = False
        for packet_id in packet_ids:
            o = outbound.get(packet_id)
            if o is None or o.qos != 1:
                continue
            done = True
            if o.group is None:
                del outbound[packet_id]
                if delete and o.sub_key is not None:
                    actions.append(DeleteOutbound(packet_id))
            else:
                actions += self.complete(packet_id)
        if done:
            actions.append(PUMP_SOON)
        return actions

    def pubrec(self, packet_id: int, failed: bool) -> list:
        """QoS 2 received: release it with PUBREL (MQTT-4.3.3-4), or drop it if the client refused it.
        ``PeerError`` if it was not a QoS 2 in flight."""
        o = self.outbound.get(packet_id)
        if o is None or o.qos != 2:
            raise PeerError(ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, f"PUBREC for packet id {packet_id} not in flight")
        if failed:
            return self.complete(packet_id) + [PUMP_SOON]
        actions = []
        if not o.released:
            o.released = True
            if o.group is None:
                actions += self._finish_offset(o)  # a shared group counts it delivered only at PUBCOMP
            if self.persistent and o.group is None and o.sub_key is not None:
                actions += [DeleteOutbound(packet_id), SaveReleased(packet_id)]
        actions.append(SendPubRel(packet_id))
        return actions

    def pubcomp(self, packet_id: int) -> list:
        """QoS 2 finished: the packet id is free again. ``PeerError`` if it was not released."""
        o = self.outbound.get(packet_id)
        if o is None or not o.released:
            raise PeerError(ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, f"PUBCOMP for packet id {packet_id} not released")
        del self.outbound[packet_id]
        actions = []
        if o.group is not None:
            actions.append(GroupAcked(o.group, o.position))
        elif self.persistent:
            actions.append(DeleteReleased(packet_id))
        actions.append(PUMP_SOON)
        return actions

    def complete(self, packet_id: int) -> list:
        """Forget an in-flight packet id (acknowledged, refused, or not sendable)."""
        o = self.outbound.pop(packet_id)
        actions = [] if o.released else self._finish_offset(o)
        if self.persistent and o.group is None:
            if o.released:
                actions.append(DeleteReleased(packet_id))
            elif o.sub_key is not None:
                actions.append(DeleteOutbound(packet_id))
        return actions

    def _finish_offset(self, o: Outbound) -> list:
        if o.group is not None:
            return [GroupAcked(o.group, o.position)]
        return []

    def owed(self, sub_key: str) -> list:
        """Positions of ``sub_key``'s messages sent and not yet received by the client (retention keeps them).

        A QoS 2 message released (PUBREC seen) is the client's already (MQTT-4.3.3).
        """
        return [o.position for o in self.outbound.values()
                if o.sub_key == sub_key and o.group is None and not o.released]

    def resend_plan(self) -> list:
        """After a reconnect (MQTT-4.4.0-1): PUBREL for released ids, the PUBLISH again for the rest."""
        actions = []
        for pid, o in list(self.outbound.items()):
            if o.group is not None:
                continue  # sent by a shared group since attach (a detach forgets the older ones): not a resend
            if o.released:
                actions.append(SendPubRel(pid))
            elif o.sub_key is None or o.sub_key not in self.subs:
                actions += self.complete(pid)
            else:
                actions.append(Resend(pid, o.sub_key, o.position))
        return actions

    # -- inbound PUBLISH: flow control, topic aliases, exactly once ------------------------------------

    def inbound_room(self, receive_maximum: int) -> int:
        """How many more QoS 1/2 PUBLISHes the client may have unacknowledged now (our ``receive_maximum``)."""
        return receive_maximum - self.inbound_inflight

    def publish_received(self, packet_id: int, qos: int, receive_maximum: int) -> tuple:
        """Event: a QoS 1/2 PUBLISH arrived (before the publish decision).

        ``(SendPubRec,)`` for a QoS 2 resend of a message already stored: it is
        acknowledged, not stored again (MQTT-4.3.3-9); ``PeerError``
        (0x93) when it is one more than our Receive Maximum allows unacknowledged (3.3.4).
        """
        if qos == 2 and packet_id in self.inbound_qos2:
            return (SendPubRec(packet_id),)
        if self.inbound_inflight >= receive_maximum:
            raise PeerError(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                            f"more than {receive_maximum} unacknowledged QoS 1/2 PUBLISHes")
        return NO_ACTIONS

    def publish_accepted(self, qos: int, bind_alias: tuple[int, str] | None) -> tuple:
        """Event: the publish decision accepted a PUBLISH: at QoS 1/2 it is unacknowledged until stored; a Topic
        Alias it set (``(alias, topic)``) holds for the rest of this connection (MQTT-3.3.2-12)."""
        if qos:
            self.inbound_inflight += 1
        if bind_alias is not None:
            if self.inbound_aliases is None:
                self.inbound_aliases = {}  # made by the first alias: most clients set none
            alias, topic = bind_alias
            self.inbound_aliases[alias] = topic
        return NO_ACTIONS

    def publishes_accepted(self, count: int) -> tuple:
        """Event: ``count`` plain QoS 1 PUBLISHes of one read were accepted (the fast path's ``publish_accepted``:
        it takes no more than ``inbound_room`` gave)."""
        self.inbound_inflight += count
        return NO_ACTIONS

    def publish_stored(self, packet_id: int, qos: int) -> tuple:
        """Event: the store took a QoS 1/2 PUBLISH. QoS 1: acknowledged now (PUBACK). QoS 2: its packet id is
        held until PUBREL, so a resend is not stored twice; ``(SaveInboundQos2,)`` first in a persistent session
        (a restart must remember it), then PUBREC."""
        if qos == 1:
            self.inbound_inflight -= 1
            return NO_ACTIONS
        self._hold_inbound_qos2(packet_id)
        return (SaveInboundQos2(packet_id),) if self.persistent else NO_ACTIONS

    def publish_failed(self, packet_id: int, qos: int) -> tuple:
        """Event: a QoS 1/2 PUBLISH was not stored (or its QoS 2 packet id not made durable): it is no longer
        unacknowledged, and never promised exactly once."""
        if qos:
            self.inbound_inflight -= 1
        if qos == 2 and packet_id in self.inbound_qos2:
            del self.inbound_qos2[packet_id]
        return NO_ACTIONS

    def pubrel_received(self, packet_id: int) -> tuple:
        """Event: PUBREL ends ``packet_id``'s exactly-once hold: a later PUBLISH with it is a new message
        (MQTT-4.3.3-11); ``(DeleteInboundQos2,)`` in a persistent session, then PUBCOMP (MQTT-4.3.3-10).
        ``PeerError`` (0x92, the PUBCOMP's reason code) for an id not held."""
        if packet_id not in self.inbound_qos2:
            raise PeerError(ReasonCode.PACKET_IDENTIFIER_NOT_FOUND, f"PUBREL for packet id {packet_id} not held")
        del self.inbound_qos2[packet_id]
        if self.inbound_inflight > 0:
            self.inbound_inflight -= 1
        return (DeleteInboundQos2(packet_id),) if self.persistent else NO_ACTIONS

    def _hold_inbound_qos2(self, packet_id: int) -> None:
        if self.inbound_qos2 is NO_PACKET_IDS:
            self.inbound_qos2 = {}  # made when first needed: most sessions never see QoS 2
        self.inbound_qos2[packet_id] = None

    # -- the PUBLISH's form ----------------------------------------------------------------------

    def publish_properties(self, record, sub_id: int, now_ms: int) -> PublishForm | None:
        """Event: ``record`` goes out: the form of its v5 PUBLISH, or None when it needs no properties.

        Properties go along when the message carries v5 fields (the remaining Message
        Expiry Interval, MQTT-3.3.2-6; payload format, content type, response topic,
        correlation data and user properties pass through unaltered, MQTT-3.3.2-4/-17),
        the subscription has a Subscription Identifier (MQTT-3.3.4-3), or the client
        takes topic aliases: a known alias sends an empty topic (3.3.2.3.4).
        """
        if self.level != 5:
            return None
        props = record.properties
        if not ((props and message_props.has_v5_fields(props)) or sub_id or self.alias_maximum):
            return None
        properties = message_props.from_record(props, now_ms, (sub_id,) if sub_id else ())
        topic = record.topic
        assigned = None
        alias = self.alias_for(topic)
        if alias is not None:
            alias_id, known = alias
            properties = properties.replace(topic_alias=alias_id)
            if known:
                topic = ""
            else:
                assigned = topic
        return PublishForm(topic, encode_properties(properties, PacketType.PUBLISH), assigned)

    def too_large(self, size: int) -> bool:
        """Whether a packet of ``size`` bytes is more than the client's Maximum Packet Size (MQTT-3.1.2-24)."""
        return 0 < self.max_packet_size < size

    def dropped_too_large(self, packet_id: int | None, assigned_alias: str | None) -> list:
        """Event: a PUBLISH was too large to send (MQTT-3.1.2-25): discard it as if it had been delivered.

        Its packet id is complete; an alias it was to introduce is withdrawn, since the client never learnt it.
        """
        if assigned_alias is not None and self.aliases.get(assigned_alias) == len(self.aliases):
            del self.aliases[assigned_alias]
        return self.complete(packet_id) if packet_id is not None else []

    # -- topic aliases -------------------------------------------------------------------------

    def alias_for(self, topic: str) -> tuple[int, bool] | None:
        """(alias, already known to the client) for ``topic``, or None: at most the client's Topic Alias Maximum."""
        if not self.alias_maximum:
            return None
        aliases = self.aliases
        if aliases is None:
            aliases = self.aliases = {}
        alias = aliases.get(topic)
        if alias is not None:
            return alias, True
        if len(aliases) >= self.alias_maximum:
            return None
        alias = len(self.aliases) + 1
        self.aliases[topic] = alias
        return alias, False
