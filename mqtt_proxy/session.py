"""An MQTT session's Twisted-side adapter: feeds ``SessionState`` and carries out its actions.

Packet ids, the in-flight window, QoS 1/2 acknowledgements, resends, topic
aliases and the will live in ``session_state.SessionState`` (no I/O); this
module reads from queue offsets, writes to the connection and the session store.

A subscription owns an offset into the light queue of its filter, never a copy
of a message. ``pump`` pulls from each offset (through the read cache), within
the session's in-flight window, and sends; acknowledgements free the window.
A persistent session outlives its connection: while offline it costs its
offsets, and on return it resends what was in flight (DUP set, same packet id)
and carries on from its offsets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqtt_proxy import message_props
from mqtt_proxy.codec import NO_PROPERTIES, PubRel, encode, encode_properties, encode_publish, patch_publish
from mqtt_proxy.codec.wire import PacketType
from mqtt_proxy.session_state import (DeleteOutbound, DeleteReleased, GroupAcked, PumpSoon,
                                      Resend, SaveOutbound, SaveReleased, SendPubRel, SessionState)
from mqtt_proxy.session_store import StoredSubscription

if TYPE_CHECKING:
    from mqtt_proxy.delivery import SessionContext

log = logging.getLogger("twistmq.mqtt.session")

PUMP_BATCH = 256  # messages read per subscription per pump: bounds one tick's work


@dataclass
class Subscription:
    """One subscription of a session (``key`` is the filter as subscribed, $share prefix included)."""

    key: str
    topic_filter: str
    queue: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    sub_id: int = 0
    share: object | None = None  # the SharedGroup for $share subscriptions
    next_offset: int = 0
    inflight: set[int] = field(default_factory=set)  # queue offsets sent at QoS>0 and not yet acknowledged
    reading: bool = False
    dropped: int = 0  # owed messages lost to a disk limit (retention) while this session was subscribed

    def stored(self) -> StoredSubscription:
        group = self.share.group if self.share is not None else None
        return StoredSubscription(self.topic_filter, self.qos, self.no_local, self.retain_as_published,
                                  self.sub_id, group, self.next_offset)


def _state_attr(name: str) -> property:
    return property(lambda self: getattr(self.state, name), lambda self, value: setattr(self.state, name, value))


class Session:
    """State of one client id, connected or not."""

    def __init__(self, ctx: "SessionContext", client_id: str, level: int, expiry: int) -> None:
        self.ctx = ctx
        self.delivery = ctx.delivery
        self.sessions_db = ctx.sessions_db
        self.client_id = client_id
        self.state = SessionState(level, expiry, ctx.max_inflight)  # everything the protocol decides on
        self.conn = None
        self.will_call = None
        self.stored = False  # something of this session was written to the session store
        self.acl_username = None  # whose ACL rules the will is checked against
        self.expiry_call = None
        self._dirty_subs: set[str] = set()
        self._pumping = False
        self._pump_again = False
        self._pump_scheduled = False

    # The session's protocol state lives in SessionState; these read and write it there.
    level = _state_attr("level")
    expiry = _state_attr("expiry")
    subs = _state_attr("subs")
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

    def carry_out(self, actions) -> None:
        """Do what the state machine asked: writes, session-store updates, group acks, a pump."""
        db = self.sessions_db
        for a in actions:
            kind = type(a)
            if kind is SendPubRel:
                if self.conn is not None:
                    self.conn.write(encode(PubRel(a.packet_id), self.state.level))
            elif kind is SaveOutbound:
                db.save_outbound(self.client_id, a.packet_id, a.sub_key, a.queue_offset, a.qos)
            elif kind is DeleteOutbound:
                db.delete_outbound(self.client_id, a.packet_id)
            elif kind is SaveReleased:
                db.save_released(self.client_id, a.packet_id)
            elif kind is DeleteReleased:
                db.delete_released(self.client_id, a.packet_id)
            elif kind is GroupAcked:
                a.group.acked(a.queue_offset)
            elif kind is PumpSoon:
                self.pump_soon()
            elif kind is Resend:
                self._resend(a)
            else:
                raise TypeError(f"session action {a!r} has no adapter")

    # -- connection ---------------------------------------------------------------------

    def attach(self, conn) -> None:
        """Bind a new connection (fresh or resumed) to this session."""
        self.conn = conn
        self.state.attach(conn.level)
        if self.expiry_call is not None and self.expiry_call.active():
            self.expiry_call.cancel()
        self.expiry_call = None
        for sub in self.subs.values():
            self.watch(sub)

    def detach(self, publish_will: bool) -> list:
        """The connection is gone: stop pushing; shared groups hand our messages to others.

        Returns the will actions (PublishWill or ScheduleWill) for the registry, which owns the timers.
        """
        self.conn = None
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

    def _on_news(self, _queue: str) -> None:
        self.pump()

    # -- sending ------------------------------------------------------------------------------

    def resend_inflight(self) -> None:
        """After a reconnect: PUBREL for released messages, the PUBLISH again (DUP) for the rest."""
        self.carry_out(self.state.resend_plan())

    def _resend(self, a: Resend) -> None:
        sub = self.subs[a.sub_key]
        d = self.delivery.read(sub.queue, a.queue_offset, 1)
        d.addCallback(self._resend_one, a.packet_id, sub)
        d.addErrback(lambda f: log.error("resend_failed client=%s error=%s", self.client_id, f.getErrorMessage()))

    def _resend_one(self, messages, pid: int, sub: Subscription) -> None:
        if self.conn is None or pid not in self.outbound:
            return
        if not messages or messages[0].queue_offset != self.outbound[pid].queue_offset:
            self.carry_out(self.state.complete(pid))  # the record is gone (retention): nothing to resend
            return
        o = self.outbound[pid]
        self._send(messages[0].record, o.qos, pid, sub, dup=True)

    def pump_soon(self) -> None:
        """Pump once at the end of this tick: acknowledgements arrive in bursts, one read serves them all."""
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.delivery.call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self.pump()

    def pump(self) -> None:
        """Pull and send what the window allows from every subscription's offset."""
        if self.conn is None:
            return
        if self._pumping:
            self._pump_again = True
            return
        self._pumping = True
        try:
            while True:
                self._pump_again = False
                for sub in list(self.subs.values()):
                    if sub.share is None and not sub.reading:
                        self._pump_sub(sub)
                if not self._pump_again or self.conn is None:
                    break
        finally:
            self._pumping = False
        self._persist_offsets()

    def _pump_sub(self, sub: Subscription) -> None:
        if self.conn is None or self.conn.paused:
            return
        if sub.qos > 0 and self.window <= 0:
            return
        sub.reading = True
        d = self.delivery.read(sub.queue, sub.next_offset, PUMP_BATCH)
        d.addCallback(self._deliver_batch, sub)
        d.addErrback(self._read_failed, sub)

    def _read_failed(self, failure, sub: Subscription) -> None:
        sub.reading = False
        log.error("read_failed client=%s queue=%s error=%s", self.client_id, sub.queue, failure.getErrorMessage())

    def _deliver_batch(self, messages, sub: Subscription) -> None:
        sub.reading = False
        if self.conn is None or sub.key not in self.subs:
            return
        now = self.delivery.now_ms()
        advanced = False
        sent = None
        more = len(messages) == PUMP_BATCH
        if messages and messages[0].queue_offset > sub.next_offset:
            self._gap(sub, messages[0].queue_offset)
        for m in messages:
            if m.queue_offset < sub.next_offset:
                continue
            record = m.record
            qos = min(sub.qos, record.qos)
            if qos and self.window <= 0:
                more = False
                break
            if self.conn.paused:
                more = False
                break
            sub.next_offset = m.queue_offset + 1
            advanced = True
            if sub.no_local and record.client_id == self.client_id:
                continue
            if record.properties and message_props.expired(record.properties, now):
                self.delivery.stats.messages_expired += 1
                continue
            pid, actions = self.state.offer(sub, m.queue_offset, qos)
            if actions:
                self.carry_out(actions)
            self._send(record, qos, pid, sub)
            sent = record
        if advanced:
            self._dirty_subs.add(sub.key)
            if sent is not None and self.delivery.deliver_latency is not None:  # one sample per batch
                self.delivery.deliver_latency.observe(max(0, now - sent.store_ts) / 1000.0)
        if more:
            self._pump_again = True
            if not self._pumping:
                self.pump()
        elif not self._pumping:
            self._persist_offsets()

    def _gap(self, sub: Subscription, first_live: int) -> None:
        """Owed messages are gone (a disk limit deleted them): count, log, and resume after the gap."""
        lost = first_live - sub.next_offset
        sub.dropped += lost
        self.delivery.stats.messages_gap += lost
        log.warning("delivery_gap client=%s queue=%s queue_offsets=[%d,%d) messages=%d",
                    self.client_id, sub.queue, sub.next_offset, first_live, lost)
        sub.next_offset = first_live
        self._dirty_subs.add(sub.key)

    def send_retained(self, record, sub: Subscription) -> None:
        """Send a retained message in answer to a subscribe (RETAIN set, not tied to an offset)."""
        qos = min(sub.qos, record.qos)
        if qos and self.window <= 0:
            return  # the window is full of live traffic: skip rather than overrun the client
        pid = self.state.offer_retained(qos)
        self._send(record, qos, pid, sub, retain=True)

    def send_group_message(self, record, qos: int, sub: Subscription, group, queue_offset: int) -> int | None:
        """Send one message of a shared group; return its packet id (None for QoS 0)."""
        pid = self.state.offer_group(sub, queue_offset, qos, group)
        self._send(record, qos, pid, sub)
        return pid

    def _send(self, record, qos: int, pid: int | None, sub: Subscription, dup: bool = False,
              retain: bool | None = None) -> None:
        if retain is None:
            retain = record.retain and sub.retain_as_published
        level = self.level
        props_block = None
        alias_topic = record.topic
        if level == 5:
            needs_props = (record.properties and message_props.has_v5_fields(record.properties)) or sub.sub_id \
                or self.alias_maximum
            if needs_props:
                props = message_props.from_record(record.properties, self.delivery.now_ms(),
                                                  (sub.sub_id,) if sub.sub_id else ())
                alias = self.state.alias_for(record.topic)
                if alias is not None:
                    alias_id, known = alias
                    props = props.replace(topic_alias=alias_id)
                    if known:
                        alias_topic = ""
                props_block = encode_properties(props, PacketType.PUBLISH)
        if props_block is None and not dup:
            data = self.delivery.encoded_publish(record, qos, retain, level)
            if pid is not None:
                data = patch_publish(data, packet_id=pid)
        else:
            data = encode_publish(alias_topic, record.body, qos, retain, dup, pid, props_block, level)
        if self.max_packet_size and len(data) > self.max_packet_size:
            # MQTT-3.1.2-25: never send a client more than it can take; drop it instead.
            if pid is not None:
                self.carry_out(self.state.complete(pid))
            return
        self.conn.write(data)
        self.delivery.stats.sent(len(data))

    # -- acknowledgements ------------------------------------------------------------------

    def on_puback(self, pid: int) -> bool:
        """QoS 1 completed; False if the packet id was not in flight."""
        return self._acked(self.state.puback(pid))

    def on_pubrec(self, pid: int, failed: bool) -> bool:
        """QoS 2 received by the client: release it (or drop it if the client refused it)."""
        return self._acked(self.state.pubrec(pid, failed))

    def on_pubcomp(self, pid: int) -> bool:
        """QoS 2 finished."""
        return self._acked(self.state.pubcomp(pid))

    def _acked(self, actions) -> bool:
        if actions is None:
            return False
        self.carry_out(actions)
        return True

    def _persist_offsets(self) -> None:
        if not self._dirty_subs:
            return
        dirty, self._dirty_subs = self._dirty_subs, set()
        if not self.persistent:
            return
        for key in dirty:
            sub = self.subs.get(key)
            if sub is not None and sub.share is None:
                self.sessions_db.save_subscription(self.client_id, key, sub.stored())
