"""Which timer copies the commit log says are consumed: the part of the timer state a replica derives from its log.

A timer's copies are its TIMER records (the first one, then one per hop). A
copy is *consumed* when a later record names it in ``TIMER_FROM``: the real
message the master delivered for it, or the hopped copy that replaced it. So
whether a copy is still owed is a fact of the log, the same on every replica
that holds the log up to there, and a replica recomputes it by replaying the
log (recovery, truncation, promotion) instead of trusting what it did itself.

``TIMER_FROM`` is ``"COPY:AT"``: the copy's commit-log offset and the time it
was enqueued for (its wheel time). The wheel hands a copy out at the slot of
``AT``, or at the read pointer of the time it was placed if that was later;
both are at most ``max(ceil_p(AT), read pointer when the consuming record is
dispatched)``, so a consumed copy the wheel has not handed out yet is
forgotten once the read pointer passes that bound (``collect``).

The ledger holds, besides the wheel (``store.timer``):

- ``pending``: copies the wheel handed out while this broker only follows (a
  slave: its master delivers) and whose consuming record has not arrived.
  They are due: promoted to master, the broker delivers exactly these.
- ``done``: copies consumed in the log before the wheel handed them out here
  (a slave whose clock is behind its master's, or a replay after a crash or a
  truncation): when the wheel hands one out it is dropped, not delivered.
- ``inflight``: the ``TIMER_FROM`` marks of the copies this broker handed to
  the store itself and whose consuming record it has not dispatched yet
  (neither of the above); kept as the marks, so the master's own deliveries
  are recognised without parsing them.

``pending`` and ``done`` belong to a checkpoint (``to_json``); ``inflight`` is
empty whenever one is taken (the timer service's barrier).
"""

from __future__ import annotations

from typing import Iterable

from store.timer import TimerEntry

TIMER_FROM = "TIMER_FROM"


def consumed_mark(entry: TimerEntry) -> str:
    """The ``TIMER_FROM`` value of a record that consumes ``entry``."""
    return f"{entry.cl_offset}:{entry.deliver_at_ms}"


def parse_mark(text: str) -> tuple[int, int] | None:
    """``(copy offset, its wheel time)`` from a ``TIMER_FROM`` value; None if it is not one."""
    copy, sep, at = text.partition(":")
    try:
        return (int(copy), int(at)) if sep else None
    except ValueError:
        return None


class TimerLedger:
    """Consumed, pending and in-flight timer copies of one timer service (reactor thread only)."""

    def __init__(self, precision_ms: int) -> None:
        self.precision_ms = precision_ms
        self.pending: dict[int, TimerEntry] = {}
        self.done: dict[int, int] = {}  # copy offset -> the read pointer past which it can no longer come out
        self.inflight: set[str] = set()

    def clear(self) -> None:
        self.pending.clear()
        self.done.clear()
        self.inflight.clear()

    # -- what the log says -------------------------------------------------------------------

    def consumed(self, mark: str, read_time_ms: int | None) -> bool:
        """A dispatched record consumes the copy its ``TIMER_FROM`` value ``mark`` names; the wheel's read pointer is
        as given. False if ``mark`` is not one."""
        inflight = self.inflight
        if mark in inflight:
            inflight.discard(mark)  # this broker's own delivery: the wheel handed it out already
            return True
        parsed = parse_mark(mark)
        if parsed is None:
            return False
        copy, at_ms = parsed
        self.consumed_copy(copy, max(-(-at_ms // self.precision_ms) * self.precision_ms, read_time_ms or 0))
        return True

    def consumed_copy(self, copy: int, bound_ms: int) -> None:
        """``copy`` is consumed; if the wheel has not handed it out here, it cannot once the read pointer passed
        ``bound_ms``."""
        if self.pending.pop(copy, None) is None:
            self.done[copy] = bound_ms

    # -- what the wheel hands out ----------------------------------------------------------

    def take_done(self, copy: int) -> bool:
        """True (and forgotten) if ``copy`` was consumed in the log already: it must not go out again."""
        return self.done.pop(copy, None) is not None

    def follow(self, entries: Iterable[TimerEntry]) -> int:
        """A follower's hand-out: each entry waits in ``pending`` unless the log consumed it; returns how many wait."""
        n = 0
        done, pending = self.done, self.pending
        for e in entries:
            if done.pop(e.cl_offset, None) is None:
                pending[e.cl_offset] = e
                n += 1
        return n

    def take_pending(self) -> list[TimerEntry]:
        """Every pending entry, in due-time order (promotion: they are this broker's to deliver now)."""
        entries = sorted(self.pending.values(), key=lambda e: (e.deliver_at_ms, e.cl_offset))
        self.pending.clear()
        return entries

    def first_slot(self) -> int | None:
        """The slot time of the earliest pending entry (None: none pending)."""
        if not self.pending:
            return None
        p = self.precision_ms
        return min(-(-e.deliver_at_ms // p) * p for e in self.pending.values())

    def collect(self, read_time_ms: int) -> int:
        """Forget consumed copies the wheel can no longer hand out; returns how many went."""
        gone = [c for c, bound in self.done.items() if bound < read_time_ms]
        for c in gone:
            del self.done[c]
        return len(gone)

    # -- checkpoint --------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"pending": [list(e) for e in self.pending.values()],
                "done": {str(c): bound for c, bound in self.done.items()}}

    def load(self, data: dict) -> None:
        """Take back what ``to_json`` saved (absent keys: a checkpoint from before the ledger, nothing owed)."""
        self.clear()
        for row in data.get("pending", ()):
            e = TimerEntry(*(int(v) for v in row))
            self.pending[e.cl_offset] = e
        self.done.update((int(c), int(bound)) for c, bound in data.get("done", {}).items())
