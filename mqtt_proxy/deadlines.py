"""Every connection's deadline on one timer: CONNECT within a bound, then a packet within 1.5x keep-alive.

A ``DelayedCall`` per connection cost about 440 bytes (the call, its two bound
methods, its arguments) and a heap operation per reset: an idle broker with
10,000 clients held 4 MB of them. Here a connection sits in one bucket of a
hashed wheel (``tick`` seconds wide, keyed by when its deadline falls) and one
call, at the end of the earliest bucket, turns the wheel. Traffic does not
touch the wheel: a connection only notes when it last heard from its client,
and when its bucket comes due it says whether the deadline really passed or
names a later one (MQTT-3.1.2-24: the server acts once 1.5x the keep-alive has
passed, here at most one tick later).
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol


DEFAULT_TICK_S = 0.5


class HasDeadline(Protocol):
    """What the wheel needs of a connection: a slot for its bucket, and a check when the bucket is due."""

    deadline_bucket: dict | None

    def deadline_due(self, now: float) -> float | None:
        """The deadline came: act and return None, or return the later deadline to wait for."""


class _Bucket(dict):
    """{connection: None} whose deadlines fall in one tick, in insertion order; knows its own index."""

    __slots__ = ("index",)


class DeadlineWheel:
    """Connections keyed by the bucket their deadline falls in; one call pending, for the earliest bucket."""

    def __init__(self, clock, tick: float = DEFAULT_TICK_S) -> None:
        if tick <= 0:
            raise ValueError(f"wheel tick must be positive, not {tick}")
        self._clock = clock
        self.tick = tick
        self._buckets: dict[int, _Bucket] = {}  # bucket index -> the connections whose deadline falls in it
        self._due: list[int] = []  # heap of bucket indexes (some may be gone from _buckets: skipped)
        self._turning_upto: int | None = None  # while turning: buckets up to this one are being emptied
        self._call = None  # the pending turn, at the earliest bucket's end
        self._call_index: int | None = None

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def schedule(self, conn: HasDeadline, deadline: float) -> None:
        """Check ``conn`` once ``deadline`` (clock seconds) has passed; replaces its earlier deadline."""
        self.cancel(conn)
        index = math.ceil(deadline / self.tick)
        if self._turning_upto is not None and index <= self._turning_upto:
            index = self._turning_upto + 1  # never into a bucket being emptied (float rounding near the edge)
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = _Bucket()
            bucket.index = index
            heapq.heappush(self._due, index)
            if self._turning_upto is None:
                self._arm()
        bucket[conn] = None
        conn.deadline_bucket = bucket

    def cancel(self, conn: HasDeadline) -> None:
        """Forget ``conn``'s deadline (it connected, or it is gone)."""
        bucket = conn.deadline_bucket
        if bucket is not None:
            conn.deadline_bucket = None
            bucket.pop(conn, None)
            if not bucket and self._buckets.get(bucket.index) is bucket:
                del self._buckets[bucket.index]  # its index stays in the heap until its turn
                if not self._buckets and self._turning_upto is None:
                    self.stop()  # nothing to wait for: no timer left behind

    def stop(self) -> None:
        """Cancel the pending turn (connections keep their buckets; a new bucket arms it again)."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = self._call_index = None
        if not self._buckets:
            self._due.clear()

    def _arm(self) -> None:
        """Have a turn pending at the end of the earliest bucket."""
        due = self._due
        while due and due[0] not in self._buckets:
            heapq.heappop(due)
        if not due:
            self.stop()
            return
        first = due[0]
        if self._call is not None:
            if self._call_index <= first:
                return
            self._call.cancel()
        self._call_index = first
        self._call = self._clock.callLater(max(0.0, first * self.tick - self._clock.seconds()), self._turn)

    def _turn(self) -> None:
        armed = self._call_index
        self._call = self._call_index = None
        now = self._clock.seconds()
        upto = max(math.floor(now / self.tick), armed)  # armed for that bucket's end: float rounding aside
        due, buckets = self._due, self._buckets
        self._turning_upto = upto
        try:
            while due and due[0] <= upto:
                bucket = buckets.pop(heapq.heappop(due), None)
                if bucket is None:
                    continue
                for conn in list(bucket):
                    conn.deadline_bucket = None
                    later = conn.deadline_due(now)
                    if later is not None:
                        self.schedule(conn, later)
        finally:
            self._turning_upto = None
            self._arm()
