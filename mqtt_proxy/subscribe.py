"""SUBSCRIBE and UNSUBSCRIBE: register interest in the store, persist, answer, send retained messages.

A new subscription starts at the end of its filter's light queue (it gets what
is published from now on); a repeated subscription keeps its positions and
only changes its options. The subscription is durable before SUBACK goes out.

Retained messages obey the connection's back-pressure like live ones: they are
written while the socket's send buffer is under ``[limits] max_queued_bytes``
(and, at QoS > 0, while the in-flight window has room); what does not fit waits
in the session's ``RetainedBacklog`` and goes out as the client reads. The
backlog holds at most ``max_queued_bytes`` of messages; beyond that retained
messages are dropped and counted (``retained_dropped``), as Mosquitto drops
beyond ``max_queued_messages``. So a client that reads nothing and subscribes
to ``#`` again and again holds two buffers' worth, not the retained store once
per SUBSCRIBE.
"""

from __future__ import annotations

import collections
import logging

from twisted.internet import defer

from lightqueue.topic import TopicError, parse_shared
from mqtt_proxy import message_props
from mqtt_proxy.codec import MQTT_5, RetainHandling, ReasonCode, SubAck, UnsubAck
from mqtt_proxy.session import Subscription
from mqtt_proxy.session_state import SubOptions
from store.api import QuotaExceeded, StoreError

log = logging.getLogger("twistmq.mqtt.subscribe")

ENTRY_OVERHEAD = 100  # bytes a waiting retained message costs beyond its topic and payload (tuple, deque slot)


class RetainedBacklog:
    """Retained messages of one connection that did not fit its socket or window yet, oldest first."""

    __slots__ = ("conn", "items", "size", "limit")

    def __init__(self, conn, limit: int) -> None:
        self.conn = conn  # the connection they were found for: a reconnect starts without them
        self.items: collections.deque = collections.deque()
        self.size = 0
        self.limit = limit

    def offer(self, record, sub: Subscription) -> bool:
        """Keep one message to send later; False if the backlog is full (the caller counts the drop)."""
        cost = len(record.body) + len(record.topic) + ENTRY_OVERHEAD
        if self.size + cost > self.limit:
            return False
        self.items.append((record, sub, cost))
        self.size += cost
        return True

    def drain(self, session) -> None:
        """Send what the connection takes now; the rest waits for the next pump (a resume or an ack)."""
        conn = session.conn
        items = self.items
        if conn is not self.conn:  # the client left: its SUBSCRIBE's answer goes with it
            session.delivery.stats.retained_dropped += len(items)
            items.clear()
            session.retained_backlog = None
            return
        while items:
            record, sub, cost = items[0]
            if session.subs.get(sub.key) is sub:
                if not _fits(session, conn, record, sub):
                    return
                session.send_retained(record, sub)
            items.popleft()
            self.size -= cost
        session.retained_backlog = None


def _fits(session, conn, record, sub: Subscription) -> bool:
    """Whether the connection takes one more retained message now (socket not paused, window open)."""
    return not conn.paused and not (min(sub.options.qos, record.qos) and session.window <= 0)


@defer.inlineCallbacks
def handle_subscribe(router, conn, packet):
    """Answer one SUBSCRIBE with a SUBACK holding a code per filter, then retained messages."""
    session = conn.session
    limits = router.limits
    sub_ids = packet.properties.subscription_identifiers
    sub_id = sub_ids[0] if sub_ids else 0
    codes = []
    writes = []  # session writes SUBACK waits for
    retained_for: list[tuple[Subscription, bool]] = []
    for topic_filter, opts in packet.subscriptions:
        try:
            group, real_filter = parse_shared(topic_filter, limits.max_topic_length, limits.max_topic_levels)
        except TopicError as exc:
            log.info("subscribe_invalid client=%s filter=%r error=%s", session.client_id, topic_filter, exc)
            codes.append(ReasonCode.TOPIC_FILTER_INVALID)
            continue
        if group is not None and opts.no_local:
            conn.protocol_violation(ReasonCode.PROTOCOL_ERROR, "no local on a shared subscription (MQTT-3.8.3-4)")
            return
        if not router.acl.can_subscribe(conn.acl_username, session.client_id, real_filter):
            log.info("subscribe_denied client=%s user=%s filter=%s", session.client_id, conn.username, topic_filter)
            codes.append(ReasonCode.NOT_AUTHORIZED)
            continue
        existing = session.subs.get(topic_filter)
        if existing is None and len(session.subs) >= limits.max_subscriptions:
            codes.append(ReasonCode.QUOTA_EXCEEDED)
            continue
        qos = min(opts.qos, 2)
        if existing is not None:
            session.state.resubscribed(topic_filter, qos, opts.no_local, opts.retain_as_published, sub_id)
            sub = existing
            is_new = False
        else:
            try:
                queue = yield router.store.add_filter(real_filter)
            except QuotaExceeded as exc:  # the broker's filter-shape cap: bounded matching work per publish
                log.warning("subscribe_refused client=%s filter=%r error=%s", session.client_id, topic_filter, exc)
                codes.append(ReasonCode.QUOTA_EXCEEDED)
                continue
            sub = Subscription(topic_filter, real_filter, queue, SubOptions(qos, opts.no_local, opts.retain_as_published,
                                                                            sub_id))
            if group is not None:
                sub.share = yield router.shared_group(group, real_filter, queue)
                sub.share.subscribers += 1
            else:
                sub.positions = {p.group: p for p in (yield router.store.end_positions(queue))}
            if conn.session is not session or topic_filter in session.subs:
                router.remove_filter(real_filter)  # lost a race with a disconnect or a twin SUBSCRIBE
                if sub.share is not None:
                    router.drop_group_member(sub)
                if conn.session is not session:
                    return
                sub = session.subs[topic_filter]
            else:
                session.add_subscription(sub)
            is_new = True
        if session.persistent:
            writes.append(session.save_subscription(session.subscription_state(sub)))
        codes.append(qos)
        if sub.share is None and opts.retain_handling != RetainHandling.DO_NOT_SEND \
                and not (opts.retain_handling == RetainHandling.SEND_IF_NEW_SUBSCRIPTION and not is_new):
            retained_for.append((sub, is_new))
        if is_new and session.conn is not None:
            session.watch(sub)
    yield defer.gatherResults([d for d in writes if d is not None])
    if conn.session is not session:
        return
    conn.send(SubAck(packet.packet_id, tuple(codes)))
    for sub, _ in retained_for:
        yield send_retained(router, conn, session, sub)
    session.pump()


@defer.inlineCallbacks
def send_retained(router, conn, session, sub: Subscription):
    """Every retained message matching the subscription's filter that the client may read."""
    try:
        found = yield router.store.get_retained(sub.topic_filter)
    except StoreError as exc:
        log.warning("retained_lookup_failed client=%s filter=%s error=%s", session.client_id, sub.topic_filter, exc)
        return
    now = router.now_ms()
    dropped = 0
    for retained in found:
        if not router.acl.allowed(conn.acl_username, session.client_id, retained.topic, "read"):
            continue
        record = retained.record
        if record.properties and message_props.expired(record.properties, now):
            continue
        if conn.session is not session:
            return
        backlog = session.retained_backlog
        if backlog is not None and backlog.conn is not conn:
            backlog.drain(session)  # found for an earlier connection: dropped and counted
            backlog = None
        if backlog is None and _fits(session, conn, record, sub):
            session.send_retained(record, sub)
            continue
        if backlog is None:
            backlog = session.retained_backlog = RetainedBacklog(conn, router.limits.max_queued_bytes)
        if not backlog.offer(record, sub):
            dropped += 1
    if dropped:
        session.delivery.stats.retained_dropped += dropped
        log.info("retained_dropped client=%s filter=%s messages=%d reason=queue_full (max_queued_bytes)",
                 session.client_id, sub.topic_filter, dropped)


@defer.inlineCallbacks
def handle_unsubscribe(router, conn, packet):
    """Drop subscriptions; v5 says per filter whether one existed."""
    session = conn.session
    codes = []
    writes = []
    for topic_filter in packet.topic_filters:
        sub = session.subs.get(topic_filter)
        if sub is None:
            codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
            continue
        session.remove_subscription(topic_filter)
        if sub.share is not None:
            sub.share.member_left(session, sub)
            router.drop_group_member(sub)
        else:
            session.unwatch(sub)
        router.remove_filter(sub.topic_filter)
        if session.persistent:
            writes.append(session.delete_subscription(topic_filter))
        codes.append(ReasonCode.SUCCESS)
    yield defer.gatherResults([d for d in writes if d is not None])
    if conn.session is session:
        conn.send(UnsubAck(packet.packet_id, tuple(codes) if conn.level == MQTT_5 else ()))
