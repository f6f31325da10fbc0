"""Shared subscriptions (``$share/group/filter``): one position per broker group, members served in turn.

The group reads the filter's light queue once, from its own position (one per
broker group holding the queue), and hands each message to the next member
with room in its window. A message counts as delivered only when that member
completes it (PUBACK, or PUBREC for QoS 2); if the member's connection drops
first, the message goes back to the front of the line for another member. The
committed position (the lowest message not yet completed) is made durable with
``put_share_position``, so a restart redelivers at most what was in flight.

``ShareCursor`` is that bookkeeping for one broker group's copy of the queue,
with no I/O; ``SharedGroup`` reads, sends and writes for it.
"""

from __future__ import annotations

import logging

from store.api import QueuePosition, ReadResult

log = logging.getLogger("twistmq.mqtt.shared")

BATCH = 256


class ShareCursor:
    """A share group's place in one broker group's copy of the queue: next, in flight, owed again, committed."""

    def __init__(self, start: QueuePosition) -> None:
        self.next = start
        self.committed = start
        self.inflight: dict[QueuePosition, object] = {}  # position -> the session it was sent to
        self.redeliver: list[QueuePosition] = []  # taken back from a member that left, oldest first
        self.reading = False

    def take_back(self, session) -> int:
        """A member left: what it had in flight goes to the front of the line again; how many."""
        lost = [p for p, s in self.inflight.items() if s is session]
        for p in lost:
            del self.inflight[p]
        if lost:
            self.redeliver = sorted(set(self.redeliver) | set(lost))
        return len(lost)

    def commit(self) -> QueuePosition | None:
        """The new committed position if it moved (the lowest still owed, else next), else None."""
        pending = list(self.inflight) + self.redeliver
        committed = min(pending) if pending else self.next
        if committed == self.committed:
            return None
        self.committed = committed
        return committed


class SharedGroup:
    """The members of one ``$share/group/filter`` and the group's positions in the queue."""

    def __init__(self, ctx, group: str, topic_filter: str, queue: str, starts: tuple[QueuePosition, ...]) -> None:
        self.delivery = ctx.delivery  # reads, queue news, the clock and the counters
        self.sessions = ctx.sessions  # where the committed positions are kept
        self.group = group
        self.topic_filter = topic_filter
        self.queue = queue
        self.cursors = {p.group: ShareCursor(p) for p in starts}  # broker group -> its cursor
        self.members: list[tuple[object, object]] = []  # (session, subscription), connected ones
        self.subscribers = 0  # sessions holding the subscription, connected or not
        self._rr = 0
        self.dropped = 0  # owed messages lost to a disk limit (retention)
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
        lost = sum(cursor.take_back(session) for cursor in self.cursors.values())
        if lost:
            log.info("share_redeliver group=%s filter=%s messages=%d", self.group, self.topic_filter, lost)
        self.pump()

    def acked(self, position: QueuePosition) -> None:
        cursor = self.cursors.get(position.group)
        if cursor is not None:
            cursor.inflight.pop(position, None)
        if not self._pump_scheduled:  # acknowledgements come in bursts: commit and pump once per tick
            self._pump_scheduled = True
            self.delivery.call_soon(self._after_acks)

    def _after_acks(self) -> None:
        self._pump_scheduled = False
        for cursor in self.cursors.values():
            self._commit(cursor)
        self.pump()

    def _commit(self, cursor: ShareCursor) -> None:
        committed = cursor.commit()
        if committed is not None:
            d = self.sessions.put_share_position(self.group, self.topic_filter, committed)
            d.addErrback(lambda f: log.error("share_commit_failed group=%s filter=%s error=%s", self.group,
                                             self.topic_filter, f.getErrorMessage()))

    def _offer(self, message, now_ms: int):
        """Offer ``message`` to the members in turn: (member, its Delivery) for the one that took it or found it
        expired, None when none had room. Each member's state machine decides (QoS, window, expiry, packet id)."""
        n = len(self.members)
        for i in range(n):
            session, sub = self.members[(self._rr + i) % n]
            if session.conn is None or session.conn.paused:
                continue
            d = session.send_group_message(message, sub, now_ms)
            if d.expired:
                return session, d
            if d.stopped:
                continue
            self._rr = (self._rr + i + 1) % n
            return session, d
        return None

    def pump(self) -> None:
        if not self.members:
            return
        for cursor in self.cursors.values():
            if cursor.reading:
                continue
            redelivery = bool(cursor.redeliver)
            position, count = (cursor.redeliver[0], 1) if redelivery else (cursor.next, BATCH)
            cursor.reading = True
            d = self.delivery.read(position, count)
            d.addCallback(self._deliver, cursor, position, redelivery)
            d.addErrback(self._failed, cursor)

    def _failed(self, failure, cursor: ShareCursor) -> None:
        cursor.reading = False
        log.error("share_read_failed group=%s error=%s", self.group, failure.getErrorMessage())

    def _deliver(self, result: ReadResult, cursor: ShareCursor, start: QueuePosition, redelivery: bool) -> None:
        cursor.reading = False
        messages = result.messages
        if redelivery:
            if not cursor.redeliver or cursor.redeliver[0] != start:
                self.pump()  # the line changed meanwhile
                return
            cursor.redeliver.pop(0)
            if not messages or messages[0].position != start:
                self._commit(cursor)  # gone (retention): nothing to redeliver
                self.pump()
                return
            messages = messages[:1]
        elif cursor.next != start:
            return
        elif result.lost:
            self.dropped += result.lost
            self.delivery.gap(f"share={self.group} filter={self.topic_filter}", self.queue, result.lost)
        progressed = False
        now = self.delivery.now_ms()
        stopped_at = None
        inflight = cursor.inflight
        for m in messages:
            # Held as in flight before it is offered: a member may be done with it within the offer (dropped as
            # too large: GroupAcked at once), and a completion must find what it completes.
            inflight[m.position] = None
            taken = self._offer(m, now)
            if taken is None:
                inflight.pop(m.position, None)
                stopped_at = m.position
                if redelivery:
                    cursor.redeliver.insert(0, m.position)
                break
            session, d = taken
            if m.position in inflight:
                if d.sends and d.sends[0][2] is not None:  # a packet id: the member owes the group its completion
                    inflight[m.position] = session
                else:
                    del inflight[m.position]
            progressed = True
        if not redelivery:
            cursor.next = result.next if stopped_at is None else stopped_at
        self._commit(cursor)
        if progressed and (redelivery or len(messages) == BATCH or cursor.redeliver):
            self.pump()
