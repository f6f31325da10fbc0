"""A hashed-wheel timer, sans-IO: keys scheduled some ticks ahead come back when time passes them.

As Netty's ``HashedWheelTimer`` (which SOFARegistry's lease manager runs its evict tasks on): a
ring of ``slots`` buckets, one per tick; a key due at tick T sits in bucket ``T % slots`` and is
handed back by the first ``advance`` at or past T. Scheduling and expiry cost O(1) whatever the
number of keys; a deadline is rounded up to whole ticks, so a key is never due early and at most
one tick late. Nothing here reads a clock: the caller passes ``now`` (seconds).
"""

from __future__ import annotations

import math
from collections.abc import Hashable


class HashedWheel:
    """Keys with deadlines, handed back in deadline order (by tick) as ``advance`` passes them."""

    def __init__(self, tick: float, now: float, slots: int = 512) -> None:
        if tick <= 0:
            raise ValueError(f"tick must be positive, not {tick!r}")
        if slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots!r}")
        self.tick = tick
        self._start = now
        self._slots: list[list[tuple[int, Hashable]]] = [[] for _ in range(slots)]
        self._done = 0  # every tick up to this one has been handed back
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _tick_of(self, when: float) -> int:
        # a small epsilon keeps 0.3 / 0.1 from landing on tick 3.0000000004 -> 4
        return math.ceil((when - self._start) / self.tick - 1e-9)

    def schedule(self, key: Hashable, now: float, delay: float) -> None:
        """Hand *key* back once time reaches ``now + delay`` (rounded up to a tick; at least the next one)."""
        due = max(self._tick_of(now + max(delay, 0.0)), self._done + 1)
        self._slots[due % len(self._slots)].append((due, key))
        self._size += 1

    def advance(self, now: float) -> list:
        """The keys due at or before *now*, by tick, each once; keys due later stay."""
        target = math.floor((now - self._start) / self.tick + 1e-9)
        if target <= self._done:
            return []
        due_keys: list[tuple[int, Hashable]] = []
        ring = len(self._slots)
        for tick in range(self._done + 1, self._done + 1 + min(target - self._done, ring)):
            bucket = self._slots[tick % ring]
            if not bucket:
                continue
            keep = [entry for entry in bucket if entry[0] > target]
            if len(keep) != len(bucket):
                due_keys.extend(entry for entry in bucket if entry[0] <= target)
                self._slots[tick % ring] = keep
        self._done = target
        self._size -= len(due_keys)
        due_keys.sort(key=lambda entry: entry[0])
        return [key for _, key in due_keys]
