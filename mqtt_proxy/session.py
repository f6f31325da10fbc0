"""An MQTT session's Twisted-side adapter: feeds ``SessionState`` and carries out its actions.

Packet ids, the in-flight window, what each read sends (QoS, No Local, expiry,
RETAIN), QoS 1/2 acknowledgements, resends, topic aliases, the Maximum Packet
Size and the will live in ``session_state.SessionState`` (no I/O); this module
reads from queue positions, encodes (through the pump's encode cache) and writes
to the connection and to the store's session state (``store.api.Sessions``),
every write carrying the session epoch its CONNECT claimed.

A subscription owns one position per broker group into the light queue of its
filter, never a copy of a message. ``pump`` pulls from each position (through
the read cache), within the session's in-flight window, and sends;
acknowledgements free the window. A persistent session outlives its
connection: while offline it costs its positions, and on return it resends
what was in flight (DUP set, same packet id) and carries on from its positions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from mqtt_proxy.codec import PubAck, PubRel, encode, encode_publish, patch_publish
from mqtt_proxy.session_state import (NO_ENTRIES, DeleteOutbound, DeleteReleased, Delivery, GroupAcked, PeerError,
                                      PumpSoon, Resend, SaveOutbound, SaveReleased, SendPubRel, SessionState,
                                      SubOptions)
from store.api import Fenced, OutboundState, QueuePosition, ReadResult, SessionMeta, SubscriptionState

if TYPE_CHECKING:
    from mqtt_proxy.auth.acl import ReadCheck
    from mqtt_proxy.delivery import SessionContext

log = logging.getLogger("twistmq.mqtt.session")

PUMP_BATCH = 256  # messages read per subscription position per pump: bounds one tick's work
WRITE_CHUNK = 65536  # bytes of PUBLISHes joined before a write, so a full transport stops a batch in time
# Seconds a QoS 1 PUBLISH stays in flight before its packet id is written: most are acknowledged sooner,
# and then cost no write at all. Until it is written, the subscription's stored position stays at it (see
# ``Session.subscription_state``), so a restart sends it again all the same, though under a new packet id.
OUTBOUND_SAVE_DELAY = 1.0
# Seconds a moved position may wait for its write while QoS 1 messages are in flight unwritten: the stored
# position is held back to the first of them meanwhile, so a later write only means fewer duplicates after
# a restart. A drain then writes its position a few times a second rather than once per window.
POSITION_SAVE_DELAY = 0.1
DENIED_LOG_INTERVAL = 10.0  # seconds between two delivery_denied lines (the counter counts every one)
_denied_log = [0.0]  # when the next delivery_denied line may be written (one for the process)


@dataclass
class Subscription:
    """One subscription of a session (``key`` is the filter as subscribed, $share prefix included): its queue,
    positions and reads. Its options are the session machine's (``SubOptions``, changed only by its events):
    this side reads them."""

    key: str
    topic_filter: str
    queue: str
    options: SubOptions
    share: object | None = None  # the SharedGroup for $share subscriptions
    positions: dict[str, QueuePosition] = field(default_factory=dict)  # broker group -> next position to send
    reading: set[str] = field(default_factory=set)  # broker groups with a read under way
    drained: set[str] = field(default_factory=set)  # groups found empty at their position, no news since
    news: int = 0  # queue news heard so far: a read that saw none meanwhile may mark its group drained
    dropped: int = 0  # owed messages lost to a disk limit (retention) while this session was subscribed

    def state(self) -> SubscriptionState:
        """The subscription as ``Sessions.put_subscription`` stores it."""
        group = self.share.group if self.share is not None else None
        positions = () if self.share is not None else tuple(self.positions[g] for g in sorted(self.positions))
        o = self.options
        return SubscriptionState(self.topic_filter, o.qos, positions, o.no_local, o.retain_as_published,
                                 o.sub_id, group)


def _state_attr(name: str) -> property:
    return property(lambda self: getattr(self.state, name), doc=f"The state machine's ``{name}`` (read only).")


def _true(_) -> bool:
    return True


def _ignore_fenced(session: "Session") -> None:
    """The default when nobody listens: a fenced session just stops writing."""


class Session:
    """State of one client id, connected or not."""

    # Slots: one per client id, connected or not, so its size is the broker's size per client.
    __slots__ = ("ctx", "delivery", "sessions", "client_id", "epoch", "fenced", "on_fenced", "state", "conn",
                 "will_call", "stored", "acl_username", "expiry_call", "_dirty_subs", "_pumping", "_pump_again",
                 "_pump_scheduled", "owner", "reads", "retained_backlog", "subs",
                 "will_stored", "_held", "_held_call", "_positions_call")

    def __init__(self, ctx: "SessionContext", client_id: str, level: int, expiry: int, epoch: int = 0) -> None:
        self.ctx = ctx
        self.delivery = ctx.delivery
        self.sessions = ctx.sessions
        self.client_id = client_id
        self.epoch = epoch  # the session epoch this holder claimed: every session write carries it
        self.fenced = False  # a newer holder claimed the session: write nothing more
        self.on_fenced: Callable[[Session], None] = _ignore_fenced  # the registry's reaction to a Fenced refusal
        self.state = SessionState(level, expiry, ctx.max_inflight)  # everything the protocol decides on
        self.conn = None
        self.will_call = None
        self.stored = False  # something of this session was written to the session store
        self.acl_username = None  # whose ACL rules the will is checked against
        self.expiry_call = None
        self._dirty_subs: dict[str, None] | None = None  # keys of subs whose position moved, once any did
        self._pumping = False
        self._pump_again = False
        self._pump_scheduled = False
        self.owner: str | None = None  # the identity that made the session (None: stored before owners were kept)
        self.reads: ReadCheck | None = None  # the connected identity's read access (None: no ACL configured)
        self.retained_backlog = None  # subscribe.RetainedBacklog: retained messages waiting for room
        # key -> Subscription (queue, positions, reads); the machine knows the same keys, with their options.
        self.subs: dict[str, Subscription] = NO_ENTRIES
        self.will_stored = False  # this connection's will is stored in its group (published there if we are lost)
        self._held: dict[int, SaveOutbound] | None = None  # QoS 1 in flight, not written yet (by packet id)
        self._held_call = None  # the timer that writes them
        self._positions_call = None  # the timer that writes positions moved while QoS 1 is in flight unwritten

    # The session's protocol state lives in SessionState and changes only through its events; these read it.
    level = _state_attr("level")
    expiry = _state_attr("expiry")
    outbound = _state_attr("outbound")
    inbound_qos2 = _state_attr("inbound_qos2")
    receive_maximum = _state_attr("receive_maximum")
    max_packet_size = _state_attr("max_packet_size")
    alias_maximum = _state_attr("alias_maximum")
    will = _state_attr("will")
    pending_will = _state_attr("pending_will")

    @property
    def persistent(self) -> bool:
        return self.state.persistent

    @property
    def window(self) -> int:
        """How many more QoS>0 messages may be in flight now."""
        return self.state.window

    # -- subscriptions: this side's objects and the machine's options, by the same keys ----------------

    def add_subscription(self, sub: Subscription) -> None:
        """A subscription made or restored: the machine hears of its options, this side keeps its queue."""
        self.state.subscribed(sub.key, sub.options)
        if self.subs is NO_ENTRIES:
            self.subs = {}
        self.subs[sub.key] = sub

    def remove_subscription(self, key: str) -> Subscription | None:
        """Subscription ``key`` is gone (what it has in flight is resent no more); this side's object, if any."""
        self.state.unsubscribed(key)
        return self.subs.pop(key, None) if self.subs else None

    def end(self) -> None:
        """The session ends (expiry, clean start, takeover elsewhere): neither side holds anything any more."""
        self.state.ended()
        self.subs = NO_ENTRIES
        self._held = None
        for call in (self._held_call, self._positions_call):
            if call is not None and call.active():
                call.cancel()
        self._held_call = self._positions_call = None

    # -- durable state: one typed write per operation of ``store.api.Sessions``, each with the epoch --------

    def save_session(self, meta: SessionMeta):
        """Store the session's meta (it names the client itself)."""
        return self._write(self.sessions.put_session, meta)

    def delete_session(self):
        return self._write(self.sessions.delete_session, self.client_id)

    def save_subscription(self, subscription: SubscriptionState):
        return self._write(self.sessions.put_subscription, self.client_id, subscription)

    def delete_subscription(self, key: str):
        return self._write(self.sessions.delete_subscription, self.client_id, key)

    def save_outbound(self, outbound: OutboundState):
        return self._write(self.sessions.put_outbound, self.client_id, outbound)

    def delete_outbound(self, packet_id: int):
        return self._write(self.sessions.delete_outbound, self.client_id, packet_id)

    def save_released(self, packet_id: int):
        return self._write(self.sessions.put_released, self.client_id, packet_id)

    def delete_released(self, packet_id: int):
        return self._write(self.sessions.delete_released, self.client_id, packet_id)

    def save_inbound_qos2(self, packet_id: int):
        return self._write(self.sessions.put_inbound_qos2, self.client_id, packet_id)

    def delete_inbound_qos2(self, packet_id: int):
        return self._write(self.sessions.delete_inbound_qos2, self.client_id, packet_id)

    def save_will(self, will):
        return self._write(self.sessions.put_will, self.client_id, will)

    def delete_will(self):
        return self._write(self.sessions.delete_will, self.client_id)

    def _write(self, operation, *args):
        """Call ``operation`` of the store with ``args`` and the epoch.

        Returns a Deferred that fires True once the write is durable, False if
        it failed (handled here: a ``Fenced`` refusal means a newer holder took
        the session over, and the registry is told); None if the session is
        fenced already.
        """
        if self.fenced:
            return None
        name = operation.__name__
        return operation(*args, self.epoch).addCallbacks(_true, self._write_failed, errbackArgs=(name,))

    def _write_failed(self, failure, name: str) -> bool:
        if failure.check(Fenced):
            if not self.fenced:
                self.fenced = True
                log.info("session_fenced client=%s epoch=%d operation=%s", self.client_id, self.epoch, name)
                self.on_fenced(self)
            return False
        log.error("session_write_failed client=%s operation=%s error=%s", self.client_id, name,
                  failure.getErrorMessage())
        return False

    def carry_out(self, actions) -> None:
        """Do what the state machine asked: writes, session-state updates, group acks, a pump."""
        for a in actions:
            kind = type(a)
            # The per-message actions of a persistent QoS 1 session first: one of each per message.
            if kind is SaveOutbound:
                if a.qos == 1:
                    self._hold(a)
                else:  # QoS 2 in flight is exactly-once state: written at once
                    self.save_outbound(OutboundState(a.packet_id, a.sub_key, a.position, a.qos))
            elif kind is DeleteOutbound:
                held = self._held.pop(a.packet_id, None) if self._held else None
                if held is None:
                    self.delete_outbound(a.packet_id)
                else:  # never written: nothing to delete, but the stored position may move on now
                    dirty = self._dirty_subs
                    if dirty is None:
                        dirty = self._dirty_subs = {}
                    dirty[held.sub_key] = None
            elif kind is PumpSoon:
                self.pump_soon()
            elif kind is SendPubRel:
                if self.conn is not None:
                    self.conn.write(encode(PubRel(a.packet_id), self.state.level))
            elif kind is SaveReleased:
                self.save_released(a.packet_id)
            elif kind is DeleteReleased:
                self.delete_released(a.packet_id)
            elif kind is GroupAcked:
                sub = self.subs.get(a.group)
                if sub is not None and sub.share is not None:  # gone: leaving the group took its messages back
                    sub.share.acked(a.position)
            elif kind is Resend:
                self._resend(a)
            else:
                raise TypeError(f"session action {a!r} has no adapter")

    # -- QoS 1 in flight: written only when it stays in flight ----------------------------------

    def _hold(self, a: SaveOutbound) -> None:
        """Keep a QoS 1 in-flight entry unwritten for now: an acknowledgement within ``OUTBOUND_SAVE_DELAY``
        saves both its write and its delete (an offline drain's whole window is acknowledged in milliseconds)."""
        if self._held is None:
            self._held = {}
        self._held[a.packet_id] = a
        if self._held_call is None:
            self._held_call = self.delivery.clock.callLater(OUTBOUND_SAVE_DELAY, self._held_due)

    def _held_due(self) -> None:
        self._held_call = None
        self.save_held()

    def save_held(self) -> None:
        """Write the QoS 1 entries still in flight that are not written yet (then the stored position moves
        on to the send mark): when they have been in flight a while, and when the connection goes."""
        if self._held_call is not None:
            if self._held_call.active():
                self._held_call.cancel()
            self._held_call = None
        held, self._held = self._held, None
        if not held:
            return
        for a in held.values():
            self.save_outbound(OutboundState(a.packet_id, a.sub_key, a.position, a.qos))
            self._moved(a.sub_key)
        self._persist_positions()

    def _moved(self, key: str) -> None:
        if self._dirty_subs is None:
            self._dirty_subs = {}
        self._dirty_subs[key] = None

    def subscription_state(self, sub: Subscription) -> SubscriptionState:
        """The subscription as stored: its positions, each held back to the first QoS 1 message in flight
        whose entry is not written yet, so that what a restart cannot resend by its packet id it reads
        again (an at-least-once duplicate, never a loss)."""
        state = sub.state()
        held = self._held
        if not held or sub.share is not None:
            return state
        marks = {p.group: p for p in state.positions}
        back = False
        for a in held.values():
            if a.sub_key == sub.key:
                p = a.position
                mark = marks.get(p.group)
                if mark is not None and p.offset < mark.offset:
                    marks[p.group] = p
                    back = True
        if not back:
            return state
        return replace(state, positions=tuple(marks[g] for g in sorted(marks)))

    # -- connection ---------------------------------------------------------------------

    def attach(self, conn) -> None:
        """Bind a new connection (fresh or resumed) to this session."""
        self.conn = conn
        self.state.attach(conn.level)
        if self.expiry_call is not None and self.expiry_call.active():
            self.expiry_call.cancel()
        self.expiry_call = None
        for sub in self.subs.values():
            sub.drained.clear()  # news went unheard while no connection watched
        # What was in flight goes out again first (MQTT-4.4.0-1): a watch may pump new messages at once.
        self.resend_inflight()
        for sub in self.subs.values():
            self.watch(sub)

    def detach(self, publish_will: bool) -> list:
        """The connection is gone: stop pushing; shared groups hand our messages to others.

        Returns the will actions (PublishWill or ScheduleWill) for the registry, which owns the timers.
        """
        self.conn = None
        self.save_held()  # another holder, or this one after a restart, resends them by their packet ids
        self._write_positions()  # and goes on from where this connection got to
        for sub in self.subs.values():
            self.unwatch(sub)
            if sub.share is not None:
                sub.share.member_left(self, sub)
        return self.state.detach(publish_will)

    def watch(self, sub: Subscription) -> None:
        """Be told when the subscription's queue (or shared group) has news."""
        if sub.share is not None:
            sub.share.member_joined(self, sub)
        else:
            self.delivery.watch(sub.queue, id(self), self._on_news)

    def unwatch(self, sub: Subscription) -> None:
        """Stop hearing of the subscription's queue (shared groups are left through the group)."""
        if sub.share is None:
            self.delivery.unwatch(sub.queue, id(self))

    def _on_news(self, queue: str) -> None:
        for sub in self.subs.values():
            if sub.queue == queue:
                sub.news += 1
                sub.drained.clear()
        self.pump()

    # -- sending ------------------------------------------------------------------------------

    def resend_inflight(self) -> None:
        """After a reconnect: PUBREL for released messages, the PUBLISH again (DUP) for the rest."""
        self.carry_out(self.state.resend_plan())

    def _resend(self, a: Resend) -> None:
        sub = self.subs[a.sub_key]
        d = self.delivery.read(a.position, 1)
        d.addCallback(self._resend_one, a.packet_id, sub)
        d.addErrback(lambda f: log.error("resend_failed client=%s error=%s", self.client_id, f.getErrorMessage()))

    def _resend_one(self, result: ReadResult, pid: int, sub: Subscription) -> None:
        if self.conn is None or pid not in self.outbound:
            return
        o = self.outbound[pid]
        if not result.messages or result.messages[0].position != o.position:
            self.carry_out(self.state.complete(pid))  # the record is gone (retention): nothing to resend
            return
        record = result.messages[0].record
        reads = self.reads
        if reads is not None and not reads.whole(sub.topic_filter) and not reads.can_read(record.topic):
            self._denied(1, record.topic)  # the ACL changed since it was first sent
            self.carry_out(self.state.complete(pid))
            return
        self._send(record, o.qos, pid, sub, dup=True)

    def pump_soon(self) -> None:
        """Pump once at the end of this tick: acknowledgements arrive in bursts, one read serves them all."""
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.delivery.call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self.pump()

    def pump(self) -> None:
        """Pull and send what the window allows from every subscription's positions."""
        if self.conn is None:
            return
        if self._pumping:
            self._pump_again = True
            return
        if self.retained_backlog is not None:
            self.retained_backlog.drain(self)
        self._pumping = True
        try:
            while True:
                self._pump_again = False
                for sub in list(self.subs.values()):
                    if sub.share is None:
                        for group in list(sub.positions):
                            # A drained group has nothing to read until news comes: acknowledgements
                            # pump often, and an empty read is a store round trip for nothing.
                            if group not in sub.reading and group not in sub.drained:
                                self._pump_sub(sub, group)
                if not self._pump_again or self.conn is None:
                    break
        finally:
            self._pumping = False
        self._persist_positions()

    def _pump_sub(self, sub: Subscription, group: str) -> None:
        if self.conn is None or self.conn.paused:
            return
        qos = sub.options.qos
        if qos > 0 and self.window <= 0:
            return
        sub.reading.add(group)
        start = sub.positions[group]
        # What the window can take is enough from the read cache; a store read still fetches a whole
        # batch, so the acknowledgements to come find the next messages cached.
        enough = PUMP_BATCH if qos == 0 else min(PUMP_BATCH, self.window)
        d = self.delivery.read(start, PUMP_BATCH, enough)
        d.addCallback(self._deliver_batch, sub, start, sub.news)
        d.addErrback(self._read_failed, sub, group)

    def _read_failed(self, failure, sub: Subscription, group: str) -> None:
        sub.reading.discard(group)
        log.error("read_failed client=%s queue=%s error=%s", self.client_id, sub.queue, failure.getErrorMessage())

    def _deliver_batch(self, result: ReadResult, sub: Subscription, start: QueuePosition, news: int) -> None:
        group = start.group
        sub.reading.discard(group)
        current = sub.positions.get(group)
        if self.conn is None or self.subs.get(sub.key) is not sub or (current is not start and current != start):
            return
        if result.lost:
            sub.dropped += result.lost
            self.delivery.gap(f"client={self.client_id}", sub.queue, result.lost)
        messages = read = result.messages
        reads = self.reads
        if reads is not None and read and not reads.whole(sub.topic_filter):
            messages = self._readable(read, reads)  # denied ones are passed over like No Local ones
        now = self.delivery.now_ms()
        # The state machine decides what goes out (window, No Local, expiry, QoS, packet ids, RETAIN);
        # this side writes it, stopping where the connection fills.
        d = self.state.messages_read(sub.key, messages, result.next, self.client_id, now)
        if d.actions:
            self.carry_out(d.actions)
        conn = self.conn
        conn.cork()  # the batch goes to the transport as one write
        try:
            state = self.state
            if state.max_packet_size or (state.level == 5 and (sub.options.sub_id or state.alias_maximum)):
                written = self._send_each(d.sends, sub)
            else:
                written = self._send_plain(d.sends, sub)
            if written < len(d.sends):
                d = state.unsent(d, written)
                self.carry_out(d.actions)
        finally:
            conn.uncork()
        if d.expired:  # counted after ``unsent``: expired ones past a stop are read, and counted, again
            self.delivery.stats.messages_expired += d.expired
        more = len(read) == PUMP_BATCH and not d.stopped
        sent = d.sends[-1][0].record if d.sends else None
        position = d.position
        if not read and not result.lost:  # at the end (a short read may be short of bytes only)
            if sub.news == news:
                sub.drained.add(group)
            else:
                more = True  # news came while reading: read again
        if position is not start and position != start:
            sub.positions[group] = position
            if self._dirty_subs is None:
                self._dirty_subs = {}
            self._dirty_subs[sub.key] = None
            if sent is not None and self.delivery.deliver_latency is not None:  # one sample per batch
                self.delivery.deliver_latency.observe(max(0, now - sent.store_ts) / 1000.0)
        if more:
            self._pump_again = True
            if not self._pumping:
                self.pump()
        elif not self._pumping:
            self._persist_positions()

    def _readable(self, messages: list, reads: ReadCheck) -> list:
        """The messages the connected identity may read now (the ACL changed since the subscription was made)."""
        allowed = [m for m in messages if reads.can_read(m.record.topic)]
        if len(allowed) < len(messages):
            self._denied(len(messages) - len(allowed), messages[0].record.topic)
        return allowed

    def _denied(self, count: int, topic: str) -> None:
        self.delivery.stats.messages_denied += count
        now = self.delivery.clock.seconds()
        if now >= _denied_log[0]:
            _denied_log[0] = now + DENIED_LOG_INTERVAL
            log.warning("delivery_denied client=%s user=%s topic=%s count=%d (ACL read; logged at most every "
                        "%gs)", self.client_id, self.acl_username, topic, count, DENIED_LOG_INTERVAL)

    def _send_each(self, sends: list, sub: Subscription) -> int:
        """Send a read's PUBLISHes one by one (per-message properties or size checks); return how many went."""
        conn = self.conn
        send = self._send
        written = 0
        for m, qos, pid, retain in sends:
            if conn.paused:
                break
            send(m.record, qos, pid, sub, False, retain)
            written += 1
        return written

    def _send_plain(self, sends: list, sub: Subscription) -> int:
        """Send a read's PUBLISHes when the session needs nothing per message (no sub id, alias or size limit).

        The common case, in one loop: each is encoded straight away (or taken
        from the encode cache when other sessions read the same queue), written
        in chunks so that back-pressure still stops the batch. A v5 message with
        properties of its own goes through ``_send``. Returns how many went.
        """
        conn = self.conn
        level = self.state.level
        delivery = self.delivery
        cached = delivery.encoded_publish if delivery.shared(sub.queue) else None
        out: list[bytes] = []
        size = total = written = encoded = 0
        for m, qos, pid, retain in sends:
            if conn.paused:
                break
            record = m.record
            if level == 5 and record.properties:
                if out:
                    conn.write(b"".join(out))
                    out, size = [], 0
                self._send(record, qos, pid, sub, False, retain)
                written += 1
                continue
            if cached is None:
                data = encode_publish(record.topic, record.body, qos, retain, False, pid, None, level)
            else:
                data = cached(record, qos, retain, level)
                if pid is not None:
                    data = patch_publish(data, packet_id=pid)
            out.append(data)
            size += len(data)
            total += len(data)
            written += 1
            encoded += 1
            if size >= WRITE_CHUNK:
                conn.write(b"".join(out))  # the transport may pause us now
                out, size = [], 0
        if out:
            conn.write(b"".join(out))
        stats = delivery.stats  # what went through _send is counted there
        stats.messages_sent += encoded
        stats.bytes_sent += total
        return written

    def send_retained(self, record, sub: Subscription) -> None:
        """Send a retained message in answer to a subscribe, if the window has room."""
        for record, qos, pid, retain in self.state.retained_read(sub.key, record).sends:
            self._send(record, qos, pid, sub, False, retain)

    def send_group_message(self, message, sub: Subscription, now_ms: int):
        """Offer one message of ``sub``'s shared group to this member: the state machine's Delivery, sent.

        Stopped: no room here (the group tries another member); ``expired``: nobody gets it. A message the
        identity connected now may not read is skipped (an empty Delivery: the group goes past it).
        """
        reads = self.reads
        if reads is not None and not reads.whole(sub.topic_filter) and not reads.can_read(message.record.topic):
            self._denied(1, message.record.topic)
            return Delivery(message.position)
        d = self.state.messages_read(sub.key, (message,), message.position, self.client_id, now_ms, sub.key)
        if d.expired:
            self.delivery.stats.messages_expired += d.expired
        for m, qos, pid, retain in d.sends:
            self._send(m.record, qos, pid, sub, False, retain)
        return d

    def _send(self, record, qos: int, pid: int | None, sub: Subscription, dup: bool = False,
              retain: bool | None = None) -> None:
        """Encode and write one PUBLISH in the form the state machine gives it (or drop it: too large)."""
        if retain is None:
            retain = record.retain and sub.options.retain_as_published
        state = self.state
        form = state.publish_properties(record, sub.options.sub_id, self.delivery.now_ms()) if state.level == 5 else None
        if form is None and not dup:
            data = self.delivery.encoded_publish(record, qos, retain, state.level)
            if pid is not None:
                data = patch_publish(data, packet_id=pid)
        elif form is None:
            data = encode_publish(record.topic, record.body, qos, retain, True, pid, None, state.level)
        else:
            data = encode_publish(form.topic, record.body, qos, retain, dup, pid, form.properties, state.level)
        if state.max_packet_size and state.too_large(len(data)):
            self.carry_out(state.dropped_too_large(pid, form.assigned_alias if form is not None else None))
            return
        self.conn.write(data)
        self.delivery.stats.sent(len(data))

    # -- acknowledgements ------------------------------------------------------------------

    # An acknowledgement of a packet id not in flight is the client's error, but a harmless one (a late
    # duplicate after a resend): it is ignored, as before.

    def on_puback(self, pid: int) -> bool:
        """QoS 1 completed; False if the packet id was not in flight."""
        try:
            self.carry_out(self.state.puback(pid))
        except PeerError:
            return False
        return True

    def on_pubacks(self, packets: list, i: int) -> int:
        """The run of PUBACKs in ``packets`` from ``i`` on, as one event (``SessionState.pubacks``): each as
        ``on_puback``. Returns where the run ends. The pump they ask for is the caller's to run (``pump``),
        once the rest of its read is handled: in the same reactor pass, not the next."""
        j, n = i, len(packets)
        while j < n and type(packets[j]) is PubAck:
            j += 1
        actions = self.state.pubacks([p.packet_id for p in packets[i:j]])
        if actions and type(actions[-1]) is PumpSoon:
            actions.pop()
        self.carry_out(actions)
        return j

    def on_pubrec(self, pid: int, failed: bool) -> bool:
        """QoS 2 received by the client: release it (or drop it if the client refused it)."""
        try:
            self.carry_out(self.state.pubrec(pid, failed))
        except PeerError:
            return False
        return True

    def on_pubcomp(self, pid: int) -> bool:
        """QoS 2 finished."""
        try:
            self.carry_out(self.state.pubcomp(pid))
        except PeerError:
            return False
        return True

    def _persist_positions(self) -> None:
        """Write the positions that moved: now, or within ``POSITION_SAVE_DELAY`` while QoS 1 messages are in
        flight unwritten (the stored position stays at the first of them until then: nothing is skipped)."""
        if not self._dirty_subs:
            return
        if self._held and self.conn is not None:
            if self._positions_call is None:
                self._positions_call = self.delivery.clock.callLater(POSITION_SAVE_DELAY, self._positions_due)
            return
        self._write_positions()

    def _positions_due(self) -> None:
        self._positions_call = None
        self._write_positions()

    def _write_positions(self) -> None:
        if self._positions_call is not None:
            if self._positions_call.active():
                self._positions_call.cancel()
            self._positions_call = None
        if not self._dirty_subs:
            return
        dirty, self._dirty_subs = self._dirty_subs, None
        if not self.persistent:
            return
        for key in dirty:
            sub = self.subs.get(key)
            if sub is not None and sub.share is None:
                self.save_subscription(self.subscription_state(sub))
