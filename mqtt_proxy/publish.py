"""Inbound PUBLISH and PUBREL: checks, storing once, and the acknowledgement after it is stored.

A QoS 1 PUBACK and a QoS 2 PUBREC go out only after the store answered the
append (the bytes reached the operating system, or the disk under sync flush).
For QoS 2 the packet id is also made durable (``put_inbound_qos2``) before
PUBREC, so a duplicate that arrives after a restart is recognised and not
stored twice (exactly once). Publishes of one tick reach the store in one
batch (``inbound.InboundBatcher``); a retained publish with a payload goes
through ``put_retained`` (its quota may refuse it) and a ``$delayed/`` one
through ``schedule_timer``, each after the batch taken before it. The PUBACKs a
batch's answer produces go out as one write per connection (a publisher with a
window of 100 has up to 100 in one batch), in the order of its PUBLISHes.
"""

from __future__ import annotations

import logging

from twisted.internet import defer

from mqtt_proxy import message_props
from mqtt_proxy.auth.acl import ACL
from mqtt_proxy.codec import MQTT_5, NO_PROPERTIES, PubAck, PubComp, Publish, PubRec, ReasonCode, encode_pubacks
from mqtt_proxy.config import LimitsConfig, MQTTConfig
from mqtt_proxy.inbound import InboundBatcher
from mqtt_proxy.publish_rules import Origin, PublishRules, Refuse, Route, decide
from mqtt_proxy.ratelog import RateLimitedLog
from mqtt_proxy.session_state import PeerError
from mqtt_proxy.stats import BrokerStats
from store import record as rec
from store.api import AppendStatus, QuotaExceeded, Retained, Timers, Unavailable, WillState

log = logging.getLogger("twistmq.mqtt.publish")


class PublishRefused(Exception):
    """The publish decision refused a publish that has no MQTT connection to answer (an admin publish)."""

    def __init__(self, verdict: Refuse) -> None:
        super().__init__(verdict.why)
        self.verdict = verdict

VALID_TOPICS_CACHE = 100_000
MQTT_PUBLISH = rec.RecordKind.MQTT_PUBLISH
PUT_OK = AppendStatus.PUT_OK
_WRITTEN = frozenset({PUT_OK, AppendStatus.FLUSH_SLAVE_TIMEOUT, AppendStatus.FLUSH_DISK_FAILED})
"""Statuses of an append that is in the log all the same (the client would be asked to send it again)."""


class Publisher:
    """Inbound PUBLISH and PUBREL of every connection: the store side, the ACL, the limits and the counters."""

    def __init__(self, inbound: InboundBatcher, store: Retained | Timers, acl: ACL, config: MQTTConfig,
                 limits: LimitsConfig, stats: BrokerStats, clock) -> None:
        self.inbound = inbound  # plain publishes, per tick
        self.store = store  # put_retained, schedule_timer, put/delete_inbound_qos2
        self.acl = acl
        self.config = config
        self.limits = limits
        self.stats = stats
        self.clock = clock
        self.refusals = RateLimitedLog(log, clock)  # a client refused in a loop writes a line a second, not per packet
        # Topic names that passed validation, each mapped to one string object for all its messages: the
        # store's per-topic caches then find it by identity.
        self.valid_topics: dict[str, str] = {}
        self._acks: dict | None = None  # conn -> packet ids to PUBACK, while a batch's answers run
        self._rules_key: tuple | None = None
        self._rules: PublishRules | None = None
        inbound.listener = self

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    def handle_publish(self, conn, packet) -> None:
        """One PUBLISH from a connected client."""
        if self.handle_publishes(conn, (packet,), 0) == 0:
            self._checked_publish(conn, packet)

    def handle_publishes(self, conn, packets, i: int) -> int:
        """The plain PUBLISHes of one read from ``packets[i]`` on, in one loop; return where it stopped.

        Plain: a device reporting on a known topic, QoS 0 or 1, no properties,
        within the limits, no ACL: every check of ``_checked_publish`` would
        pass, so each goes straight to this tick's batch. The first packet that
        is not one (any other packet, or a PUBLISH that needs checking) ends the
        loop; the caller handles it, then may come back here.
        """
        if self.acl.configured:
            return i
        valid, max_payload = self.valid_topics, self.limits.max_payload
        session, client_id = conn.session, conn.client_id
        state = session.state
        room = room_before = state.inbound_room(self.config.receive_maximum)  # QoS 1 ones the client may send
        born = int(conn.last_rx * 1000)  # born when its bytes arrived (the read's time, no clock call each)
        plain = (conn, None, None)  # a QoS 0 publish's origin: batch_stored answers it
        Message = rec.Message
        messages: list = []
        origins: list = []
        size = 0
        n = len(packets)
        start = i
        while i < n:
            packet = packets[i]
            if type(packet) is not Publish:
                break
            topic, payload, qos = valid.get(packet.topic), packet.payload, packet.qos
            if (topic is None or packet.properties is not NO_PROPERTIES or packet.retain or qos > 1
                    or len(payload) > max_payload or topic[0] == "$"):
                break
            if qos:
                if room <= 0:
                    break
                room -= 1
                origins.append((conn, session, packet.packet_id))
            else:
                origins.append(plain)
            messages.append(Message(topic, payload, MQTT_PUBLISH, qos, False, client_id, born, {}))
            size += len(payload)
            i += 1
        if i > start:
            if room != room_before:
                state.publishes_accepted(room_before - room)
            stats = self.stats
            stats.messages_received += i - start
            stats.bytes_received += size
            conn.put_started(i - start)
            self.inbound.submit_many(messages, origins)
        return i

    def batch_stored(self, origins: list, results) -> None:
        """A batch's answers: plain publishes (``(conn, session, packet id)``) in this loop, others through
        their callbacks; the PUBACKs go out as one write per connection, in the order of its PUBLISHes."""
        self._acks = {}
        done, finished = None, 0  # a run of one connection's stored publishes, counted off at once
        try:
            for origin, result in zip(origins, results):
                if type(origin) is not tuple:
                    origin(result)
                    continue
                conn, session, packet_id = origin
                if result.status is not PUT_OK:
                    if packet_id is None:
                        conn.qos0_stored(result)
                    else:
                        self._stored(result, conn, session, 1, packet_id)
                    continue
                if conn is not done:
                    if finished:
                        done.put_finished(finished)
                    done, finished = conn, 0
                finished += 1
                if packet_id is not None and conn.session is session:
                    session.state.publish_stored(packet_id, 1)
                    self._puback(conn, packet_id)
            if finished:
                done.put_finished(finished)
        finally:
            acks, self._acks = self._acks, None
            for conn, packet_ids in acks.items():
                conn.write(encode_pubacks(packet_ids))

    def _puback(self, conn, packet_id: int) -> None:
        acks = self._acks
        if acks is None:  # not inside a batch's answer (a retained or delayed publish)
            conn.send(PubAck(packet_id))
            return
        packet_ids = acks.get(conn)
        if packet_ids is None:
            acks[conn] = [packet_id]
        else:
            packet_ids.append(packet_id)

    @property
    def rules(self) -> PublishRules:
        """The rules ``decide`` checks against, remade when the config, limits or ACL object change."""
        key = (self.config, self.limits, self.acl)
        if self._rules_key != key:
            self._rules_key, self._rules = key, PublishRules.of(self.acl, self.config, self.limits)
        return self._rules

    def _checked_publish(self, conn, packet) -> None:
        session = conn.session
        level = conn.level
        props = packet.properties
        qos = packet.qos
        self.stats.received(len(packet.payload))
        state = session.state
        if qos:
            try:
                resend = state.publish_received(packet.packet_id, qos, self.config.receive_maximum)
            except PeerError as exc:
                conn.protocol_violation(exc.reason_code, exc.text)
                return
            if resend:  # a QoS 2 message already stored: acknowledge, do not store again
                conn.send(PubRec(packet.packet_id))
                return
        now = self.now_ms()
        topic = packet.topic
        verdict = decide(self.rules, Origin.CLIENT, topic, len(packet.payload), packet.retain,
                         username=conn.acl_username, client_id=session.client_id, now_ms=now,
                         alias=props.topic_alias if level == MQTT_5 else None, aliases=state.inbound_aliases,
                         topic_checked=topic in self.valid_topics)
        if type(verdict) is Refuse:
            if verdict.peer_error:
                conn.protocol_violation(verdict.reason, verdict.why)
                return
            self.refusals.event(verdict.reason, "publish_denied client=%s user=%s topic=%s reason=%s", session.client_id,
                                conn.username, topic, verdict.why)
            self._refuse(conn, qos, packet.packet_id, verdict.reason)
            return
        state.publish_accepted(qos, verdict.bind_alias)
        if topic == verdict.topic and topic not in self.valid_topics:  # devices publish to the same topics
            if len(self.valid_topics) >= VALID_TOPICS_CACHE:
                self.valid_topics.clear()
            self.valid_topics[topic] = topic
        topic = self.valid_topics.get(verdict.topic, verdict.topic)  # the one string object of a known topic

        record_props = message_props.to_record(props, now) if level == MQTT_5 else {}
        message = rec.Message(topic, packet.payload, MQTT_PUBLISH, qos, packet.retain,
                              session.client_id, now, record_props)
        conn.put_started()
        packet_id = packet.packet_id
        route = verdict.route
        if route is Route.DELAYED:
            self.inbound.flush()  # what the client published before it goes first
            d = self.store.schedule_timer(message, verdict.deliver_at_ms)
        elif route is Route.RETAINED:
            self.inbound.flush()
            d = self.store.put_retained(message)
        elif qos == 0:
            self.inbound.submit(message, conn.qos0_stored)
            return
        else:
            self.inbound.submit(message, lambda result: self._stored(result, conn, session, qos, packet_id))
            return
        d.addCallback(self._stored, conn, session, qos, packet_id)
        d.addErrback(self._put_failed, conn, session, qos, packet_id)

    def will_state(self, client_id: str, will, username: str | None) -> WillState | None:
        """A client's will as the publish decision takes it at CONNECT, to be stored in its session's group (which
        publishes it if this proxy is lost); None if the decision refuses it (then nobody publishes it)."""
        now = self.now_ms()
        verdict = decide(self.rules, Origin.WILL, will.topic, len(will.payload), will.retain, username=username,
                         client_id=client_id, now_ms=now)
        if type(verdict) is Refuse:
            return None
        message = rec.Message(verdict.topic, will.payload, MQTT_PUBLISH, will.qos, will.retain, client_id, now,
                              message_props.to_record(will.properties, now))
        return WillState(message, will.properties.will_delay_interval or 0)

    def publish_will(self, client_id: str, will, username: str | None) -> None:
        """Publish a client's will (its connection ended without DISCONNECT, or its will delay ran out), if the
        publish decision allows it as it would the same PUBLISH from that client; a refusal is logged."""
        now = self.now_ms()
        verdict = decide(self.rules, Origin.WILL, will.topic, len(will.payload), will.retain, username=username,
                         client_id=client_id, now_ms=now)
        if type(verdict) is Refuse:
            self.stats.messages_dropped += 1
            log.info("will_denied client=%s topic=%s reason=%s", client_id, will.topic, verdict.why)
            return
        message = rec.Message(verdict.topic, will.payload, MQTT_PUBLISH, will.qos, will.retain, client_id, now,
                              message_props.to_record(will.properties, now))

        def published(result):
            log.info("will_published client=%s topic=%s status=%s", client_id, will.topic, result.status.name)

        def failed(failure):
            self.stats.messages_dropped += 1
            reason = "retained quota" if failure.check(QuotaExceeded) else "store"
            log.info("will_denied client=%s topic=%s reason=%s: %s", client_id, will.topic, reason,
                     failure.getErrorMessage())

        if verdict.route is Route.RETAINED:
            self.inbound.flush()  # after what its client published
            self.store.put_retained(message).addCallbacks(published, failed)
        else:
            self.inbound.submit(message, published)

    def publish_stored_will(self, client_id: str, will: WillState) -> defer.Deferred:
        """Publish a will stored at its client's CONNECT whose connection went with the process that held it (a
        node's crash): as the publish decision took it then (``will_state``), born now. Fires with whether the
        store wrote it; a refusal is counted and logged (the caller keeps the will stored, to try again)."""
        message = rec.published_later(will.message, self.now_ms())
        done: defer.Deferred = defer.Deferred()

        def answered(result):
            status = getattr(result, "status", PUT_OK)
            if status in _WRITTEN:
                log.info("will_published client=%s topic=%s status=%s", client_id, message.topic, status.name)
                done.callback(True)
            else:
                refused(status.name)

        def refused(why: str) -> None:
            self.stats.messages_dropped += 1
            log.warning("will_denied client=%s topic=%s reason=store: %s", client_id, message.topic, why)
            done.callback(False)

        if message.retain and message.body:  # the route ``will_state``'s verdict gave it (``WillState``)
            self.inbound.flush()
            self.store.put_retained(message).addCallbacks(answered, lambda f: refused(f.getErrorMessage()))
        else:
            self.inbound.submit(message, answered)
        return done

    def publish_as_operator(self, topic: str, payload: bytes, qos: int, retain: bool):
        """An admin publish: the same decision (the ACL aside: the operator is not a client) and the same store
        interface as a client's; fires with the store's AppendResult, or fails with ``PublishRefused`` or the
        store's ``QuotaExceeded``."""
        now = self.now_ms()
        verdict = decide(self.rules, Origin.ADMIN, topic, len(payload), retain, now_ms=now)
        if type(verdict) is Refuse:
            self.stats.messages_dropped += 1
            return defer.fail(PublishRefused(verdict))
        message = rec.Message(verdict.topic, payload, MQTT_PUBLISH, qos, retain, "", now, {})
        self.inbound.flush()  # after what clients published before it
        if verdict.route is Route.RETAINED:
            return self.store.put_retained(message)
        return self.store.append(message)

    def _refuse(self, conn, qos: int, packet_id, refusal: int) -> None:
        self.stats.messages_dropped += 1
        if conn.level == MQTT_5 and qos:
            _ack(conn, qos, packet_id, refusal)
        elif conn.level != MQTT_5 and refusal == ReasonCode.QUOTA_EXCEEDED:
            conn.close(None)  # 3.1.1 has no way to refuse a publish: a limit closes the link
        elif qos:
            _ack(conn, qos, packet_id, ReasonCode.SUCCESS)  # 3.1.1 ACL deny: dropped, link stays up

    def _stored(self, result, conn, session, qos: int, packet_id) -> None:
        conn.put_finished()
        if result.status is not PUT_OK:
            log.error("put_failed client=%s status=%s reason=%s", session.client_id, result.status.name,
                      result.reason)
            _refuse_after_store(conn, session, qos, packet_id, result.status in _UNAVAILABLE)
            return
        if qos == 1:
            if conn.session is session:  # else the link is gone, and its in-flight count with it
                session.state.publish_stored(packet_id, 1)
                self._puback(conn, packet_id)
        elif qos == 2:  # held even with the link gone: the client's resend after it returns is not stored twice
            save = session.state.publish_stored(packet_id, 2)
            d = session.save_inbound_qos2(packet_id) if save else None

            def answer(durable=True):
                if conn.session is session:
                    if durable:
                        conn.send(PubRec(packet_id))
                    else:  # never promise exactly once without the packet id stored
                        _refuse_after_store(conn, session, 2, packet_id)
            if d is None:
                answer()
            else:
                d.addCallback(answer)

    def _put_failed(self, failure, conn, session, qos: int, packet_id) -> None:
        conn.put_finished()
        if failure.check(QuotaExceeded):
            self.refusals.event("retained_quota", "retained_quota_exceeded client=%s error=%s", session.client_id,
                                failure.getErrorMessage())
            if qos and conn.session is session:
                session.state.publish_failed(packet_id, qos)
            self._refuse(conn, qos, packet_id, ReasonCode.QUOTA_EXCEEDED)
            return
        log.error("put_failed client=%s error=%s", session.client_id, failure.getErrorMessage())
        _refuse_after_store(conn, session, qos, packet_id, bool(failure.check(Unavailable)))

    def handle_pubrel(self, conn, packet) -> None:
        """Second half of inbound QoS 2: forget the packet id (durably), then PUBCOMP."""
        session = conn.session
        pid = packet.packet_id
        try:
            delete = session.state.pubrel_received(pid)
        except PeerError as exc:
            conn.send(PubComp(pid, exc.reason_code if conn.level == MQTT_5 else 0))
            return

        def answer(_=None):
            if conn.session is session:  # a failed delete at worst refuses a late duplicate: answer anyway
                conn.send(PubComp(pid))
        d = session.delete_inbound_qos2(pid) if delete else None
        if d is None:
            answer()
        else:
            d.addCallback(answer)


# The group cannot take it now (unreachable, or its master could not replicate it in time): the client goes and
# sends it again.
_UNAVAILABLE = (AppendStatus.SERVICE_NOT_AVAILABLE, AppendStatus.FLUSH_SLAVE_TIMEOUT)


def _refuse_after_store(conn, session, qos: int, packet_id, unavailable: bool = False) -> None:
    if qos and conn.session is session:
        session.state.publish_failed(packet_id, qos)
    if unavailable:
        # The store (a broker group, for a proxy) cannot be reached: no acknowledgement, and the client goes,
        # so it reconnects and sends its unacknowledged messages again once the group is back.
        conn.close(ReasonCode.SERVER_BUSY)
        return
    if conn.level == MQTT_5 and qos:
        _ack(conn, qos, packet_id, ReasonCode.UNSPECIFIED_ERROR)
    else:
        conn.close(ReasonCode.UNSPECIFIED_ERROR)  # never acknowledge what was not stored


def _ack(conn, qos: int, packet_id: int, reason: int) -> None:
    conn.send(PubAck(packet_id, reason) if qos == 1 else PubRec(packet_id, reason))
