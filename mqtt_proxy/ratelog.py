"""A log of repeated events that writes at most one line per reason per interval, counting the rest.

A client refused in a loop (a retained quota, a reserved topic, an ACL) would
otherwise write one line per refused packet: as many lines as it can send. The
first event of a reason in an interval is written; the ones after it are
counted, and the next line written for that reason says how many were left
out (``suppressed=N``).
"""

from __future__ import annotations

import logging


class RateLimitedLog:
    """``event(reason, fmt, *args)``: log at ``level`` unless ``reason`` was logged less than ``interval`` s ago."""

    def __init__(self, logger: logging.Logger, clock, interval: float = 1.0, level: int = logging.INFO) -> None:
        self.logger = logger
        self.clock = clock
        self.interval = interval
        self.level = level
        self._last: dict[str, float] = {}  # reason -> when its last line was written
        self._suppressed: dict[str, int] = {}  # reason -> events left out since that line

    def event(self, reason: str, fmt: str, *args) -> bool:
        """Log one event; True if a line was written, False if it was only counted."""
        now = self.clock.seconds()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return False
        self._last[reason] = now
        suppressed = self._suppressed.pop(reason, 0)
        if suppressed:
            fmt += " suppressed=%d"
            args += (suppressed,)
        self.logger.log(self.level, fmt, *args)
        return True
