"""Delayed delivery: the timer the store feeds with TIMER records and polls for due ones.

RocketMQ's design: a ``TimerLog`` holds one unit per scheduled record, chained
per slot, and a ``TimerWheel`` holds the head of each slot's chain. Time is never
read from a clock: every call takes ``now_ms``.

Rules (``p`` = precision, ``W`` = ``slot_count * p``, ``R`` = the read pointer,
the first slot time not yet consumed):

- An entry for time ``t`` goes to slot ``max(ceil_p(t), R)``; ``advance(now)``
  consumes every slot ``<= floor_p(now)``. So an entry is handed out by the first
  ``advance(now)`` with ``now >= ceil_p(t)`` (and never before ``t``), or by the
  next one if it was enqueued for a slot the wheel had already passed.
- Roll: a slot ``>= R + W`` would collide with a live slot, so the entry is
  parked in slot ``R + (slot_count // 2) * p`` with the ROLL flag; when that
  slot comes due it is placed again for its real time (RocketMQ's needRoll).
- ``cancel()`` writes a delete marker for the same time; when their slot comes
  due the marker and the entry meet and neither is handed out.

Durability and recovery. ``checkpoint()`` returns what the owner persists;
``flush()`` fsyncs the log and saves the wheel (keeping the previous snapshot).
Recommended order: ``cp = timer.checkpoint(); timer.flush(); save(cp);
timer.checkpoint_saved(cp)``. The constructor takes the last saved checkpoint
back and rolls the timer back to exactly that point:

- the timer log is cut at ``cp.log_pos`` (after its torn tail, if any, is cut):
  units written after the checkpoint are either fresh enqueues, which the owner
  replays from the commit log after ``timer.last_cl_offset``, or re-enqueues
  from rolls, which re-consuming the slots recreates;
- the newest wheel snapshot not newer than the checkpoint is loaded (or an
  empty wheel if none fits) and every unit written after it is re-chained
  (recoverAndRevise), skipping units whose slot was consumed before the
  checkpoint;
- the read pointer goes back to ``cp.read_time_ms``.

Guarantee: no entry whose commit-log record survives is lost; an entry is handed
out once, except that entries handed out by ``advance()`` after the saved
checkpoint was taken are handed out again after a crash (at-least-once; saving a
checkpoint after every ``advance()`` that returned entries closes that window).
Delete markers written after the saved checkpoint are cut too: cancellations
must be replayed by the owner like enqueues.

``enqueue`` is idempotent for replay: a commit-log offset at or below
``last_cl_offset`` is ignored (``EnqueueStatus.DUPLICATE``).
"""

from __future__ import annotations

import enum
import json
import logging
import operator
import os
from dataclasses import asdict, dataclass
from typing import Callable, NamedTuple

from crc32c import crc32c

from store.timer_log import DEFAULT_SEGMENT_UNITS, UNIT_SIZE, TimerLog, UnitFlag, encode_unit
from store.timer_wheel import (PREVIOUS_SUFFIX, WHEEL_FILE, TimerWheel, WheelFileError, WheelSnapshot,
                               write_snapshot)

log = logging.getLogger("twistmq.store.timer")

DEFAULT_PRECISION_MS = 100
DEFAULT_SLOT_COUNT = 4 * 3600 * 10  # 4 hours at 100 ms: 4 MB of wheel; longer delays roll every 2 hours
LOG_DIR = "log"
_ROLL, _DELETE, _REQUEUE = int(UnitFlag.ROLL), int(UnitFlag.DELETE), int(UnitFlag.REQUEUE)


_DELIVER_AT = operator.itemgetter(2)  # TimerEntry.deliver_at_ms


class EnqueueStatus(enum.Enum):
    """What ``enqueue``/``cancel`` did."""

    PUT_OK = "put_ok"  # chained into the slot of its time
    PUT_ROLLED = "put_rolled"  # beyond the wheel: parked, will be placed again
    DUPLICATE = "duplicate"  # commit-log offset already enqueued: ignored


class TimerConfigError(ValueError):
    """The checkpoint was taken with another wheel geometry (slot count or precision)."""


class TimerEntry(NamedTuple):
    """A due entry: deliver the commit-log record at ``cl_offset``.

    A tuple of ints, not a dataclass: a slot's entries wait in the backlog for
    up to a slot, long enough to be promoted by the garbage collector, whose
    full passes stop the reactor; a tuple of ints is cheaper to build and the
    collector stops tracking it (it cannot be part of a cycle).
    """

    cl_offset: int
    cl_size: int
    deliver_at_ms: int
    topic_hash: int


@dataclass(frozen=True, slots=True)
class TimerCheckpoint:
    """What the owner persists; hand it back to ``Timer(...)`` after a restart."""

    read_time_ms: int | None  # first slot time not yet consumed (None: never started)
    log_pos: int  # timer-log end: units before it belong to this checkpoint
    last_cl_offset: int  # highest commit-log offset enqueued (-1: none)
    precision_ms: int
    slot_count: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TimerCheckpoint":
        return cls(**json.loads(text))


@dataclass
class TimerRecovery:
    """What the constructor found and did; logged once."""

    torn_bytes: int = 0  # cut from the log's tail: partial or corrupt units
    rolled_back_bytes: int = 0  # cut because they were written after the checkpoint
    missing_bytes: int = 0  # the checkpoint names units the log no longer has (lost fsync)
    snapshot: str | None = None  # the wheel snapshot used (None: rebuilt from the log)
    rechained_from: int = 0
    units_scanned: int = 0
    units_rechained: int = 0
    units_revised: int = 0  # prev_pos corrected in place
    last_cl_offset: int = -1
    read_time_ms: int | None = None


def topic_hash(topic: str | bytes) -> int:
    """The 32-bit hash of a topic stored in each unit."""
    return crc32c(topic.encode() if isinstance(topic, str) else topic)


class Timer:
    """The timer of one store; single-threaded (the reactor), files under ``directory``."""

    def __init__(self, directory: str, checkpoint: TimerCheckpoint | None = None, *,
                 slot_count: int = DEFAULT_SLOT_COUNT, precision_ms: int = DEFAULT_PRECISION_MS,
                 segment_units: int = DEFAULT_SEGMENT_UNITS) -> None:
        self.directory = directory
        self.wheel = TimerWheel(slot_count, precision_ms)
        self._p = precision_ms
        self._half_ms = (slot_count // 2) * precision_ms
        self._window_ms = self.wheel.window_ms
        os.makedirs(directory, exist_ok=True)
        self.log = TimerLog(os.path.join(directory, LOG_DIR), segment_units)
        self._read_time: int | None = None
        self._last_cl = -1
        self.recovery = self._recover(checkpoint)

    # -- state ------------------------------------------------------------------------

    @property
    def precision_ms(self) -> int:
        return self._p

    @property
    def window_ms(self) -> int:
        return self.wheel.window_ms

    @property
    def read_time_ms(self) -> int | None:
        """The first slot time not yet consumed (None until the first call)."""
        return self._read_time

    @property
    def last_cl_offset(self) -> int:
        """Highest commit-log offset enqueued: after a restart, replay the records after it."""
        return self._last_cl

    def checkpoint(self) -> TimerCheckpoint:
        """What to persist now (buffered units are handed to the OS first, so a kill -9 keeps them)."""
        self.log.write_out()
        return TimerCheckpoint(self._read_time, self.log.end, self._last_cl, self._p, self.wheel.slot_count)

    def flush(self) -> None:
        """Blocking: fsync the timer log, then save the wheel snapshot."""
        self.flush_later()()

    def flush_later(self, wheel: bool = True) -> Callable[[], None]:
        """Take what ``flush()`` persists now; return the blocking part, to run on any thread.

        The timer log is written out and its fsync is returned; with ``wheel``
        a copy of the wheel snapshot is taken now and written by the call,
        after the fsync (the order ``flush()`` keeps).
        """
        sync_log = self.log.sync_later()
        end = self.log.end
        snapshot = self.wheel.snapshot(end, self._read_time, self._tail_crc(end)) if wheel else None
        directory = self.directory

        def persist() -> None:
            sync_log()
            if snapshot is not None:
                write_snapshot(directory, snapshot)

        return persist

    def checkpoint_saved(self, cp: TimerCheckpoint) -> list[int]:
        """The owner has persisted ``cp``: drop timer-log segments wholly consumed by it.

        Every unit's slot is below its ``write_time`` + the window, so a sealed
        segment whose last unit satisfies ``write_time + window <= cp.read_time``
        holds nothing a recovery from ``cp`` (or later) could need.
        """
        deleted = []
        if cp.read_time_ms is None:
            return deleted
        while len(self.log.segments()) > 1:
            base = self.log.segments()[0]
            last = self.log.last_write_time(base)
            if last is not None and last + self.window_ms > cp.read_time_ms:
                break
            self.log.delete_segment(base)
            deleted.append(base)
        return deleted

    def close(self) -> None:
        """Flush and close the files (the owner should save a checkpoint first)."""
        self.flush()
        self.log.close()

    # -- scheduling ---------------------------------------------------------------------

    def enqueue(self, deliver_at_ms: int, cl_offset: int, cl_size: int, topic: str | bytes,
                now_ms: int) -> EnqueueStatus:
        """Schedule the commit-log record at ``cl_offset`` for ``deliver_at_ms``.

        Offsets must grow; one at or below ``last_cl_offset`` is a replay and is ignored.
        """
        if cl_offset <= self._last_cl:
            return EnqueueStatus.DUPLICATE
        self._start(now_ms)
        status = self._place(0, deliver_at_ms, cl_offset, cl_size, topic_hash(topic))
        self._last_cl = cl_offset
        return status

    def cancel(self, cl_offset: int, deliver_at_ms: int, now_ms: int) -> EnqueueStatus:
        """Write a delete marker: the entry for ``cl_offset`` due at ``deliver_at_ms`` is not handed out.

        No effect if the entry has already been handed out.
        """
        self._start(now_ms)
        return self._place(_DELETE, deliver_at_ms, cl_offset, 0, 0)

    def advance(self, now_ms: int, max_units: int | None = None) -> list[TimerEntry]:
        """Consume every slot up to ``now_ms``; return the due entries, slot by slot, in time order.

        With ``max_units``, stop after the slot that brings the units read to
        that many (a slot is consumed whole): the caller's turn stays short,
        and the next call goes on from there.
        """
        self._start(now_ms)
        target = now_ms - now_ms % self._p
        due: list[TimerEntry] = []
        read = 0
        while self._read_time <= target:
            slot_time = self._read_time
            first, last, num = self.wheel.get_chain(slot_time)
            self._read_time = slot_time + self._p
            if num:
                due.extend(self._consume(slot_time, last, num))
                read += num
                if max_units is not None and read >= max_units:
                    break
        return due

    # -- internals -----------------------------------------------------------------------

    def _start(self, now_ms: int) -> None:
        if self._read_time is None:
            self._read_time = now_ms - now_ms % self._p

    def _place(self, flags: int, deliver_at: int, cl_offset: int, cl_size: int, thash: int) -> EnqueueStatus:
        base = self._read_time
        slot_time = max(-(-deliver_at // self._p) * self._p, base)
        status = EnqueueStatus.PUT_OK
        if slot_time - base >= self._window_ms:
            flags |= _ROLL
            slot_time = base + self._half_ms
            status = EnqueueStatus.PUT_ROLLED
        wheel = self.wheel
        first, last, num = wheel.get_chain(slot_time)
        pos = self.log.append_bytes(encode_unit(last, flags, base, slot_time, deliver_at, cl_offset, cl_size, thash))
        wheel.put_slot(slot_time, pos if num == 0 else first, pos, num + 1)
        return status

    def _consume(self, slot_time: int, last_pos: int, num: int) -> list[TimerEntry]:
        units = []
        pos = last_pos
        while pos != -1 and len(units) < num:
            unit = self.log.read(pos)
            if unit.slot_time != slot_time:
                log.error("timer_chain_broken slot=%d pos=%d unit_slot=%d", slot_time, pos, unit.slot_time)
                break
            units.append(unit)
            pos = unit.prev_pos
        units.reverse()  # oldest first
        self.wheel.reset_slot(slot_time)
        deleted = {u.cl_offset for u in units if u.flags & (_DELETE | _ROLL) == _DELETE}
        due = []
        new = tuple.__new__  # TimerEntry's own __new__ is a Python-level call per entry
        for u in units:
            if u.flags & _ROLL:
                self._place((u.flags & ~_ROLL) | _REQUEUE, u.deliver_at, u.cl_offset, u.cl_size, u.topic_hash)
            elif not u.flags & _DELETE and u.cl_offset not in deleted:
                due.append(new(TimerEntry, (u.cl_offset, u.cl_size, u.deliver_at, u.topic_hash)))
        due.sort(key=_DELIVER_AT)  # stable: ties stay oldest first
        return due

    # -- recovery --------------------------------------------------------------------------

    def _recover(self, cp: TimerCheckpoint | None) -> TimerRecovery:
        wheel = self.wheel
        if cp is None:
            cp = TimerCheckpoint(None, 0, -1, wheel.precision_ms, wheel.slot_count)
        elif (cp.precision_ms, cp.slot_count) != (wheel.precision_ms, wheel.slot_count):
            raise TimerConfigError(
                f"timer checkpoint was taken with {cp.slot_count} slots x {cp.precision_ms} ms, configured "
                f"{wheel.slot_count} x {wheel.precision_ms} ms: keep the old geometry, or delete "
                f"{self.directory} and replay the commit log")
        report = TimerRecovery()
        report.torn_bytes = self.log.open().truncated_bytes
        if self.log.end > cp.log_pos:
            report.rolled_back_bytes = self.log.truncate(max(cp.log_pos, self.log.start))
        elif self.log.end < cp.log_pos:
            report.missing_bytes = cp.log_pos - self.log.end
            log.warning("timer_log_behind_checkpoint log_end=%d checkpoint=%d", self.log.end, cp.log_pos)
        end = self.log.end
        self._read_time = cp.read_time_ms
        self._last_cl = cp.last_cl_offset if end == cp.log_pos else self._scan_last_cl()

        snapshot = self._pick_snapshot(end, cp.read_time_ms)
        start = self.log.start
        if snapshot is not None:
            self.wheel = snapshot.wheel
            report.snapshot = snapshot.path
            start = max(start, snapshot.log_pos)
        report.rechained_from = start
        if self._read_time is not None:
            for pos, unit in self.log.iter_units(start, end):
                report.units_scanned += 1
                if unit.slot_time < self._read_time:
                    continue  # consumed before the checkpoint
                slot = self.wheel.get_slot(unit.slot_time)
                if unit.prev_pos != slot.last_pos:
                    self.log.rewrite(pos, unit._replace(prev_pos=slot.last_pos))
                    report.units_revised += 1
                self.wheel.put_slot(unit.slot_time, pos if slot.num == 0 else slot.first_pos, pos, slot.num + 1)
                report.units_rechained += 1
        report.last_cl_offset, report.read_time_ms = self._last_cl, self._read_time
        log.info("timer_recovered snapshot=%s rechained_from=%d scanned=%d rechained=%d revised=%d torn_bytes=%d "
                 "rolled_back_bytes=%d missing_bytes=%d last_cl_offset=%d read_time=%s",
                 report.snapshot, start, report.units_scanned, report.units_rechained, report.units_revised,
                 report.torn_bytes, report.rolled_back_bytes, report.missing_bytes, self._last_cl, self._read_time)
        return report

    def _pick_snapshot(self, log_end: int, read_time: int | None) -> WheelSnapshot | None:
        """The newest saved wheel that is not ahead of the checkpoint."""
        for name in (WHEEL_FILE, WHEEL_FILE + PREVIOUS_SUFFIX):
            path = os.path.join(self.directory, name)
            try:
                snap = TimerWheel.load(path, self.wheel.slot_count, self.wheel.precision_ms)
            except WheelFileError as e:
                if os.path.exists(path):
                    log.warning("timer_wheel_unusable reason=%s", e)
                continue
            if read_time is None or snap.read_time_ms is None:
                continue
            if snap.log_pos <= log_end and snap.read_time_ms <= read_time:
                if snap.tail_crc == self._tail_crc(snap.log_pos):
                    return snap
                log.warning("timer_wheel_of_another_log path=%s log_pos=%d", path, snap.log_pos)
                continue
            log.info("timer_wheel_ahead_of_checkpoint path=%s log_pos=%d read_time=%d", path, snap.log_pos,
                     snap.read_time_ms)
        return None

    def _tail_crc(self, log_pos: int) -> int:
        """CRC32C of the unit just before ``log_pos`` (0 if there is none)."""
        if log_pos - UNIT_SIZE < self.log.start:
            return 0
        return crc32c(self.log.read(log_pos - UNIT_SIZE).encode())

    def _scan_last_cl(self) -> int:
        """Highest commit-log offset among fresh units (log shorter than the checkpoint)."""
        pos = self.log.end - UNIT_SIZE
        while pos >= self.log.start:
            unit = self.log.read(pos)
            if not unit.flags & (_REQUEUE | _DELETE):
                return unit.cl_offset
            pos -= UNIT_SIZE
        return -1
