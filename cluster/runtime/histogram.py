"""A latency histogram fed on hot paths: fixed buckets, no allocation, no lock.

Histograms are fed once per batch, not per message (the store observes each
commit-log batch, a session each batch of messages it read and sent to one
subscription), and ``observe`` only bisects a fixed tuple of bounds and bumps a
preallocated count (the reactor thread is the only writer).
"""

from __future__ import annotations

from bisect import bisect_left

LATENCY_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the latency buckets; one more bucket holds everything slower."""


class Histogram:
    """Counts of observations per fixed bucket, their sum and count (Prometheus' histogram, cumulated on read)."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds=LATENCY_BOUNDS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound as text, observations at or below it), ending with ``+Inf``: Prometheus' buckets."""
        out, total = [], 0
        for bound, n in zip(self.bounds + (float("inf"),), self.counts):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile ``q`` (0 with no observations; the last bound past it)."""
        if not self.count:
            return 0.0
        rank, seen = q * self.count, 0
        for bound, n in zip(self.bounds, self.counts):
            seen += n
            if seen >= rank:
                return bound
        return self.bounds[-1]
