"""Inbound PUBLISH and PUBREL: checks, storing once, and the acknowledgement after it is durable.

A QoS 1 PUBACK and a QoS 2 PUBREC go out only after ``store.put`` resolved
(the bytes reached the operating system, or the disk under sync flush). For
QoS 2 the packet id is also made durable before PUBREC, so a duplicate that
arrives after a restart is recognised and not stored twice (exactly once).
"""

from __future__ import annotations

import logging

from lightqueue.topic import TopicError, validate_topic_name
from mqtt_proxy import message_props
from mqtt_proxy.codec import MQTT_5, NO_PROPERTIES, PubAck, PubComp, PubRec, ReasonCode
from store import record as rec
from store.api import AppendStatus as PutStatus

log = logging.getLogger("twistmq.mqtt.publish")

DELAYED_PREFIX = "$delayed/"
MAX_DELAY_S = 40 * 24 * 3600
VALID_TOPICS_CACHE = 100_000
MQTT_PUBLISH = rec.RecordKind.MQTT_PUBLISH


def handle_publish(front, conn, packet) -> None:
    """One PUBLISH from a connected client."""
    topic = packet.topic
    if (packet.properties is NO_PROPERTIES and topic in front.valid_topics and not packet.retain
            and packet.qos < 2 and not front.acl.configured and len(packet.payload) <= front.limits.max_payload
            and conn.inbound_inflight < front.config.receive_maximum and topic[0] != "$"):
        # The common case (a device reporting on a known topic, QoS 0 or 1, no properties):
        # every check below would pass, so go straight to the store.
        payload = packet.payload
        stats = front.stats
        stats.messages_received += 1
        stats.bytes_received += len(payload)
        qos = packet.qos
        message = rec.Message(topic, payload, MQTT_PUBLISH, qos, False, conn.client_id, front.now_ms(), {})
        conn.put_started()
        if qos == 0:
            front.store.submit(message, conn.qos0_stored)
        else:
            conn.inbound_inflight += 1
            session, packet_id = conn.session, packet.packet_id
            front.store.submit(message, lambda result: _stored(result, front, conn, session, 1, packet_id))
        return
    session = conn.session
    level = conn.level
    props = packet.properties
    qos = packet.qos
    topic = packet.topic
    front.stats.received(len(packet.payload))

    if level == MQTT_5 and props.topic_alias is not None:
        alias = props.topic_alias
        if alias == 0 or alias > front.config.topic_alias_maximum:
            conn.protocol_violation(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} is out of range")
            return
        if topic:
            conn.inbound_aliases[alias] = topic
        else:
            topic = conn.inbound_aliases.get(alias)
            if topic is None:
                conn.protocol_violation(ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} is not set")
                return
    if qos:
        if packet.packet_id in session.inbound_qos2 and qos == 2:
            # A resend of a QoS 2 message already stored: acknowledge, do not store again.
            conn.send(PubRec(packet.packet_id))
            return
        if conn.inbound_inflight >= front.config.receive_maximum:
            conn.protocol_violation(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                                    f"more than {front.config.receive_maximum} unacknowledged QoS 1/2 PUBLISHes")
            return
    limits = front.limits
    if topic not in front.valid_topics:  # devices publish to the same topics again and again
        try:
            validate_topic_name(topic, limits.max_topic_length, limits.max_topic_levels)
        except TopicError as exc:
            conn.protocol_violation(ReasonCode.TOPIC_NAME_INVALID, str(exc))
            return
        if len(front.valid_topics) >= VALID_TOPICS_CACHE:
            front.valid_topics.clear()
        front.valid_topics.add(topic)
    if len(packet.payload) > limits.max_payload:
        conn.protocol_violation(ReasonCode.PACKET_TOO_LARGE,
                                f"payload of {len(packet.payload)} bytes exceeds max_payload {limits.max_payload}")
        return
    if packet.retain and not front.config.retain_available:
        conn.protocol_violation(ReasonCode.RETAIN_NOT_SUPPORTED, "retained messages are not available")
        return

    now = front.now_ms()
    deliver_at = None
    if topic.startswith(DELAYED_PREFIX) and front.timers is not None:
        # The ACL and limits apply to the topic the message will really be published on.
        seconds, _, real_topic = topic[len(DELAYED_PREFIX):].partition("/")
        try:
            delay = int(seconds)
            if not 0 <= delay <= MAX_DELAY_S or not real_topic:
                raise ValueError(seconds)
            validate_topic_name(real_topic, limits.max_topic_length, limits.max_topic_levels)
        except (ValueError, TopicError):
            conn.protocol_violation(ReasonCode.TOPIC_NAME_INVALID,
                                    f"{topic!r} is not $delayed/{{seconds}}/{{topic}}")
            return
        topic, deliver_at = real_topic, now + delay * 1000

    refusal = None
    if topic.startswith("$"):
        # $SYS/... and other $ topics belong to the broker: a client may not publish fake values there.
        refusal = ReasonCode.NOT_AUTHORIZED
        log.info("publish_denied client=%s topic=%s reason=reserved", session.client_id, topic)
    elif front.acl.configured and not front.acl.allowed(conn.acl_username, session.client_id, topic, "write"):
        refusal = ReasonCode.NOT_AUTHORIZED
        log.info("publish_denied client=%s user=%s topic=%s", session.client_id, conn.username, topic)
    elif packet.retain and packet.payload and front.retained is not None \
            and front.retained.would_exceed(topic, len(packet.payload)):
        refusal = ReasonCode.QUOTA_EXCEEDED
        log.info("retained_quota_exceeded client=%s topic=%s", session.client_id, topic)
    if refusal is not None:
        front.stats.messages_dropped += 1
        if level == MQTT_5 and qos:
            _ack(conn, qos, packet.packet_id, refusal)
        elif level != MQTT_5 and refusal == ReasonCode.QUOTA_EXCEEDED:
            conn.close(None)  # 3.1.1 has no way to refuse a publish: a limit closes the link
        elif qos:
            _ack(conn, qos, packet.packet_id, ReasonCode.SUCCESS)  # 3.1.1 ACL deny: dropped, link stays up
        return

    record_props = message_props.to_record(props, now) if level == MQTT_5 else {}
    message = rec.Message(topic, packet.payload, rec.RecordKind.MQTT_PUBLISH, qos, packet.retain,
                          session.client_id, now, record_props)
    if qos:
        conn.inbound_inflight += 1
    conn.put_started()
    packet_id = packet.packet_id
    if deliver_at is not None:
        d = front.timers.schedule(message, deliver_at)
        d.addCallback(_stored, front, conn, session, qos, packet_id)
        d.addErrback(_put_failed, conn, qos, packet_id)
    elif qos == 0:
        front.store.submit(message, conn.qos0_stored)
    else:
        front.store.submit(message, lambda result: _stored(result, front, conn, session, qos, packet_id))


def _stored(result, front, conn, session, qos: int, packet_id) -> None:
    conn.put_finished()
    if result.status is not PutStatus.PUT_OK:
        log.error("put_failed client=%s status=%s reason=%s", session.client_id, result.status.name, result.reason)
        _refuse_after_store(conn, qos, packet_id)
        return
    if qos == 1:
        conn.inbound_inflight -= 1
        if conn.session is session:
            conn.send(PubAck(packet_id))
    elif qos == 2:
        session.inbound_qos2.add(packet_id)
        d = front.sessions_db.save_inbound_qos2(session.client_id, packet_id) if session.persistent else None

        def answer(_=None):
            if conn.session is session:
                conn.send(PubRec(packet_id))
        if d is None:
            answer()
        else:
            d.addCallback(answer)


def _put_failed(failure, conn, qos: int, packet_id) -> None:
    conn.put_finished()
    log.error("put_failed error=%s", failure.getErrorMessage())
    _refuse_after_store(conn, qos, packet_id)


def _refuse_after_store(conn, qos: int, packet_id) -> None:
    if qos:
        conn.inbound_inflight -= 1
    if conn.level == MQTT_5 and qos:
        _ack(conn, qos, packet_id, ReasonCode.UNSPECIFIED_ERROR)
    else:
        conn.close(ReasonCode.UNSPECIFIED_ERROR)  # never acknowledge what was not stored


def _ack(conn, qos: int, packet_id: int, reason: int) -> None:
    conn.send(PubAck(packet_id, reason) if qos == 1 else PubRec(packet_id, reason))


def handle_pubrel(front, conn, packet) -> None:
    """Second half of inbound QoS 2: forget the packet id (durably), then PUBCOMP."""
    session = conn.session
    pid = packet.packet_id
    if pid not in session.inbound_qos2:
        conn.send(PubComp(pid, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND if conn.level == MQTT_5 else 0))
        return
    session.inbound_qos2.discard(pid)
    conn.inbound_inflight = max(0, conn.inbound_inflight - 1)

    def answer(_=None):
        if conn.session is session:
            conn.send(PubComp(pid))
    if session.persistent:
        front.sessions_db.delete_inbound_qos2(session.client_id, pid).addCallback(answer)
    else:
        answer()
