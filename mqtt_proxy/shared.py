"""Shared subscriptions (``$share/group/filter``): one offset per group, members served in turn.

The group reads the filter's light queue once, from its own offset, and hands
each message to the next member with room in its window. A message counts as
delivered only when that member completes it (PUBACK, or PUBREC for QoS 2);
if the member's connection drops first, the message goes back to the front of
the line for another member. The committed offset (the lowest message not yet
completed) is persisted, so a restart redelivers at most what was in flight.
"""

from __future__ import annotations

import logging

from mqtt_proxy import message_props

log = logging.getLogger("twistmq.mqtt.shared")

BATCH = 256


class SharedGroup:
    """Members of one ``$share/group/filter`` and the group's position in the queue."""

    def __init__(self, ctx, group: str, topic_filter: str, queue: str, start_offset: int) -> None:
        self.delivery = ctx.delivery  # reads, queue news, the clock and the counters
        self.sessions_db = ctx.sessions_db  # where the committed offset is kept
        self.group = group
        self.topic_filter = topic_filter
        self.queue = queue
        self.next_offset = start_offset
        self.committed = start_offset
        self.members: list[tuple[object, object]] = []  # (session, subscription), connected ones
        self.subscribers = 0  # sessions holding the subscription, connected or not
        self.inflight: dict[int, object] = {}  # queue offset -> session
        self.redeliver: list[int] = []
        self._rr = 0
        self.dropped = 0  # owed messages lost to a disk limit (retention)
        self._reading = False
        self._pump_scheduled = False
        self.delivery.watch(queue, id(self), lambda _q: self.pump())

    def close(self) -> None:
        self.delivery.unwatch(self.queue, id(self))

    def member_joined(self, session, sub) -> None:
        if all(s is not session for s, _ in self.members):
            self.members.append((session, sub))
        self.pump()

    def member_left(self, session, sub) -> None:
        self.members = [(s, x) for s, x in self.members if s is not session]
        lost = sorted(off for off, s in self.inflight.items() if s is session)
        for off in lost:
            del self.inflight[off]
        if lost:
            self.redeliver = sorted(set(self.redeliver) | set(lost))
            log.info("share_redeliver group=%s filter=%s messages=%d", self.group, self.topic_filter, len(lost))
        self.pump()

    def acked(self, queue_offset: int) -> None:
        self.inflight.pop(queue_offset, None)
        if not self._pump_scheduled:  # acknowledgements come in bursts: commit and pump once per tick
            self._pump_scheduled = True
            self.delivery.call_soon(self._after_acks)

    def _after_acks(self) -> None:
        self._pump_scheduled = False
        self._commit()
        self.pump()

    def _commit(self) -> None:
        pending = list(self.inflight) + self.redeliver
        committed = min(pending) if pending else self.next_offset
        if committed != self.committed:
            self.committed = committed
            self.sessions_db.save_group_offset(self.group, self.topic_filter, committed)

    def _gap(self, first_live: int) -> None:
        """Owed messages are gone (a disk limit deleted them): count, log, and resume after the gap."""
        lost = first_live - self.next_offset
        self.dropped += lost
        self.delivery.stats.messages_gap += lost
        log.warning("delivery_gap share=%s filter=%s queue_offsets=[%d,%d) messages=%d",
                    self.group, self.topic_filter, self.next_offset, first_live, lost)
        self.next_offset = first_live

    def _next_member(self, qos: int):
        n = len(self.members)
        for i in range(n):
            session, sub = self.members[(self._rr + i) % n]
            if session.conn is None or session.conn.paused:
                continue
            if min(qos, sub.qos) and session.window <= 0:
                continue
            self._rr = (self._rr + i + 1) % n
            return session, sub
        return None

    def pump(self) -> None:
        if self._reading or not self.members:
            return
        if self.redeliver:
            offset, count = self.redeliver[0], 1
        else:
            offset, count = self.next_offset, BATCH
        self._reading = True
        d = self.delivery.read(self.queue, offset, count)
        d.addCallback(self._deliver, bool(self.redeliver))
        d.addErrback(self._failed)

    def _failed(self, failure) -> None:
        self._reading = False
        log.error("share_read_failed group=%s error=%s", self.group, failure.getErrorMessage())

    def _deliver(self, messages, redelivery: bool) -> None:
        self._reading = False
        progressed = False
        if redelivery:
            off = self.redeliver.pop(0)
            if not messages or messages[0].queue_offset != off:
                self._commit()  # gone (retention): nothing to redeliver
                self.pump()
                return
        now = self.delivery.now_ms()
        if not redelivery and messages and messages[0].queue_offset > self.next_offset:
            self._gap(messages[0].queue_offset)
        for m in messages:
            if not redelivery and m.queue_offset < self.next_offset:
                continue
            record = m.record
            if record.properties and message_props.expired(record.properties, now):
                self.delivery.stats.messages_expired += 1
                if not redelivery:
                    self.next_offset = m.queue_offset + 1
                progressed = True
                continue
            target = self._next_member(record.qos)
            if target is None:
                if redelivery:
                    self.redeliver.insert(0, m.queue_offset)
                break
            session, sub = target
            qos = min(sub.qos, record.qos)
            if not redelivery:
                self.next_offset = m.queue_offset + 1
            pid = session.send_group_message(record, qos, sub, self, m.queue_offset)
            if pid is not None:
                self.inflight[m.queue_offset] = session
            progressed = True
        self._commit()
        if progressed and (redelivery or len(messages) == BATCH or self.redeliver):
            self.pump()
