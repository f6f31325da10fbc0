"""How late the reactor runs: a timer every ``interval`` and a histogram of its lateness.

Each probe asks to run ``interval`` seconds after the previous one ran; the
lateness is the time it actually ran minus that. Anything that holds the
reactor thread (an fsync, a long loop, a GIL held by a C call) shows up as a
late probe, at most one probe interval after it started. The histogram has
buckets 10 % apart from 10 µs to 100 s, so quantiles are upper bounds at most
10 % high; the maximum is exact. ``/metrics`` shows p50, p99 and max since start.
"""

from __future__ import annotations

import math
from array import array

DEFAULT_INTERVAL_S = 0.01
_FLOOR_S = 1e-5  # the first bucket: everything up to 10 µs
_RATIO = 1.1
_BUCKETS = int(math.ceil(math.log(1e7) / math.log(_RATIO))) + 1  # up to 100 s; the last takes the rest


class ReactorLagProbe:
    """``start()`` on a running clock (a reactor, or ``task.Clock`` in tests); ``stats()`` at any time."""

    def __init__(self, clock, interval: float = DEFAULT_INTERVAL_S) -> None:
        if interval <= 0:
            raise ValueError(f"probe interval must be positive, not {interval}")
        self._clock = clock
        self.interval = interval
        self._counts = array("q", [0] * _BUCKETS)
        self.samples = 0
        self.max_s = 0.0
        self._call = None

    def start(self) -> None:
        if self._call is None:
            self._schedule()

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _schedule(self) -> None:
        self._call = self._clock.callLater(self.interval, self._fire, self._clock.seconds() + self.interval)

    def _fire(self, expected: float) -> None:
        self.record(max(0.0, self._clock.seconds() - expected))
        self._schedule()

    def record(self, lateness: float) -> None:
        """Count one lateness, in seconds."""
        self.samples += 1
        self.max_s = max(self.max_s, lateness)
        self._counts[_bucket(lateness)] += 1

    def quantile(self, q: float) -> float:
        """Upper bound of the ``q`` quantile of all lateness recorded (0.0 before any), never above the max."""
        if not self.samples:
            return 0.0
        rank = max(1, math.ceil(q * self.samples))
        seen = 0
        for i, n in enumerate(self._counts):
            seen += n
            if seen >= rank:
                return min(_upper(i), self.max_s)
        return self.max_s

    def stats(self) -> dict[str, float]:
        """``{"0.5": s, "0.99": s, "1": max s}``: the quantiles /metrics shows."""
        return {"0.5": self.quantile(0.5), "0.99": self.quantile(0.99), "1": self.max_s}


def _bucket(lateness: float) -> int:
    if lateness <= _FLOOR_S:
        return 0
    return min(_BUCKETS - 1, int(math.ceil(math.log(lateness / _FLOOR_S) / math.log(_RATIO))))


def _upper(bucket: int) -> float:
    return _FLOOR_S * _RATIO ** bucket
