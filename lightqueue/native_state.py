"""The retry / invisible-time rules, as a pure state machine (no I/O, time passed in as ms).

A ``Cursor`` is one consumer group's position in one queue (RocketMQ POP's
checkpoint): ``offset`` is the next queue offset never handed out, and
``inflight`` the messages handed out but not yet acknowledged, each with the
time it becomes visible again. Rules:

- A message taken with ``invisible_ms == 0`` (a native consume of a ``retry=0``
  message) only moves the offset: at-most-once, it is gone.
- A message taken with ``invisible_ms > 0`` stays in ``inflight`` until acked.
  At ``visible_at`` it is due again and the next consumer of the group gets it
  (before any new message), invisible for another ``invisible_ms``.
- A message whose ``expire_at`` has passed is never handed out: it is dropped
  when it comes due (``due`` reports it in ``expired``) or skipped as new.
- ``change_invisible`` moves ``visible_at`` of a message in flight.
- An id already in flight is not taken a second time (a duplicate record, e.g.
  a timer redelivery after a crash, is skipped while the first copy is in flight).

The engine persists what these methods change (offset and in-flight entries,
see ``encode_inflight``) before it answers the client.
"""

from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass

NO_EXPIRY = -1
_INFLIGHT = struct.Struct(">qqIqqqI")  # queue_offset, cl_offset, size, visible_at, expire_at, invisible_ms, attempts


@dataclass(slots=True)
class InFlight:
    """A message handed out and not acknowledged yet."""

    msg_id: int
    queue_offset: int
    cl_offset: int
    size: int
    visible_at: int  # ms: when it comes back
    expire_at: int  # ms, or NO_EXPIRY
    invisible_ms: int  # how long each hand-out hides it
    attempts: int = 1  # hand-outs so far

    def expired(self, now_ms: int) -> bool:
        return self.expire_at != NO_EXPIRY and self.expire_at <= now_ms


def encode_inflight(e: InFlight) -> bytes:
    """The durable form of an in-flight entry (the key carries the msg id)."""
    return _INFLIGHT.pack(e.queue_offset, e.cl_offset, e.size, e.visible_at, e.expire_at, e.invisible_ms, e.attempts)


def decode_inflight(msg_id: int, data: bytes) -> InFlight:
    """Inverse of ``encode_inflight``."""
    return InFlight(msg_id, *_INFLIGHT.unpack(data))


class Cursor:
    """One group's progress through one queue."""

    def __init__(self, queue: str, group: str, offset: int = 0) -> None:
        self.queue = queue
        self.group = group
        self.offset = offset
        self.inflight: dict[int, InFlight] = {}
        self._heap: list[tuple[int, int]] = []  # (visible_at, msg_id); stale pairs are skipped lazily

    # -- restoring -------------------------------------------------------------------------

    def restore(self, entry: InFlight) -> None:
        """Put back an in-flight entry loaded from durable state."""
        self.inflight[entry.msg_id] = entry
        heapq.heappush(self._heap, (entry.visible_at, entry.msg_id))

    # -- the rules ---------------------------------------------------------------------------

    def due(self, now_ms: int, expired: list[InFlight] | None = None) -> InFlight | None:
        """The in-flight message that is visible again at ``now_ms`` (oldest first), if any.

        Expired ones met on the way are removed and appended to ``expired``.
        The returned entry stays in flight: ``redeliver`` it or leave it.
        """
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            visible_at, msg_id = heap[0]
            e = self.inflight.get(msg_id)
            if e is None or e.visible_at != visible_at:
                heapq.heappop(heap)  # acked or moved since
                continue
            if e.expired(now_ms):
                heapq.heappop(heap)
                del self.inflight[msg_id]
                if expired is not None:
                    expired.append(e)
                continue
            return e
        return None

    def next_visible_at(self) -> int | None:
        """When the next in-flight message comes back (None: nothing in flight)."""
        while self._heap:
            visible_at, msg_id = self._heap[0]
            e = self.inflight.get(msg_id)
            if e is not None and e.visible_at == visible_at:
                return visible_at
            heapq.heappop(self._heap)
        return None

    def redeliver(self, entry: InFlight, now_ms: int, invisible_ms: int | None = None) -> InFlight:
        """Hand ``entry`` (from ``due``) out again: hidden for ``invisible_ms`` (default: its own)."""
        if invisible_ms is not None:
            entry.invisible_ms = invisible_ms
        entry.visible_at = now_ms + entry.invisible_ms
        entry.attempts += 1
        heapq.heappush(self._heap, (entry.visible_at, entry.msg_id))
        return entry

    def is_inflight(self, msg_id: int) -> bool:
        return msg_id in self.inflight

    def take(self, queue_offset: int, msg_id: int, cl_offset: int, size: int, expire_at: int,
             invisible_ms: int, now_ms: int) -> InFlight | None:
        """Hand out the new message at ``queue_offset``; returns its in-flight entry (None: at-most-once)."""
        self.offset = max(self.offset, queue_offset + 1)
        if invisible_ms <= 0:
            return None
        e = InFlight(msg_id, queue_offset, cl_offset, size, now_ms + invisible_ms, expire_at, invisible_ms)
        self.inflight[msg_id] = e
        heapq.heappush(self._heap, (e.visible_at, msg_id))
        return e

    def skip(self, queue_offset: int) -> None:
        """Move past a message that will never be handed out (expired, duplicate, unreadable)."""
        self.offset = max(self.offset, queue_offset + 1)

    def ack(self, msg_id: int) -> InFlight | None:
        """Acknowledge: the message is done (None: it was not in flight)."""
        return self.inflight.pop(msg_id, None)  # its heap pair goes stale

    def change_invisible(self, msg_id: int, now_ms: int, invisible_ms: int) -> InFlight | None:
        """Make an in-flight message visible again ``invisible_ms`` from now (None: not in flight)."""
        e = self.inflight.get(msg_id)
        if e is None:
            return None
        e.visible_at = now_ms + invisible_ms
        heapq.heappush(self._heap, (e.visible_at, msg_id))
        return e
