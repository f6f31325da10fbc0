"""The timer log: append-only files of fixed-size units, one per timer event.

A unit says "the commit-log record at ``cl_offset`` is due at ``deliver_at``";
units due in the same wheel slot are chained newest to oldest by ``prev_pos``,
so the wheel only has to remember the last unit of each slot (RocketMQ's
``TimerLog``). Units are never changed after they are written, except that
recovery may correct a ``prev_pos`` (``rewrite``).

Positions are byte offsets across all segments; a segment file is named by the
position of its first byte. Appends are buffered in memory and handed to the
operating system by ``write_out()`` (or when the buffer fills); ``flush()``
also fsyncs (``sync_later()`` hands that fsync to another thread). Opening the
log cuts a torn or corrupt tail and reports it.
"""

from __future__ import annotations

import bisect
import enum
import logging
import os
import struct
import mmap
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

from crc32c import crc32c
from store.files import fsync_dir

log = logging.getLogger("twistmq.store.timer_log")

SEGMENT_SUFFIX = ".tlog"
DEFAULT_SEGMENT_UNITS = 1 << 20  # 60 MiB per segment
MAGIC_BASE = 0x71AE_0000
MAGIC_MASK = 0xFFFF_0000
_BODY = struct.Struct(">IqIqqqqII")
_CRC = struct.Struct(">I")
UNIT_SIZE = _BODY.size + _CRC.size  # 60
_READ_CHUNK_UNITS = 4096


class UnitFlag(enum.IntFlag):
    """The low bits of a unit's magic."""

    NORMAL = 0
    ROLL = 1  # parked in a slot before its time: re-enqueue when the slot is due, do not deliver
    DELETE = 2  # a delete marker: cancels the normal unit with the same cl_offset in its slot
    REQUEUE = 4  # written by the timer itself (a roll coming due), not by a fresh enqueue


class TimerLogError(Exception):
    """A unit cannot be read or written (bad position, corrupt bytes, closed log)."""


class TimerUnit(NamedTuple):
    """One fixed-size unit of the timer log (60 bytes, big-endian)::

         0       4                12      16                24
         +-------+----------------+-------+-----------------+
         | size  | prev_pos (i64) | magic | write_time (i64)|
         +-------+----------------+-------+-----------------+
        24                32                   40
         +-----------------+-------------------+
         | slot_time (i64) | deliver_at (i64)  |
         +-----------------+-------------------+
        40                48          52           56       60
         +-----------------+-----------+------------+--------+
         | cl_offset (i64) | cl_size   | topic_hash | crc32c |
         +-----------------+-----------+------------+--------+

    - ``size``: always ``UNIT_SIZE``; a zero here is unwritten space.
    - ``prev_pos``: the previous unit chained into the same slot, -1 for none.
    - ``magic``: ``MAGIC_BASE | flags`` (see ``UnitFlag``).
    - ``write_time``: the wheel's read pointer (ms) when the unit was written;
      every unit's ``slot_time`` is below ``write_time`` + the wheel window,
      which is what lets retention drop a whole segment.
    - ``slot_time``: the slot (ms, a multiple of the precision) it is chained into.
    - ``deliver_at``: the real delivery time (ms); above ``slot_time`` for a roll.
    - ``cl_offset``/``cl_size``: the commit-log record to deliver.
    - ``topic_hash``: CRC32C of the topic (observability, filtering).
    - ``crc32c``: over bytes 0-55.

    A ``NamedTuple`` rather than a frozen dataclass: it is built once per unit
    read or written, and is twice as cheap to build.
    """

    prev_pos: int
    flags: int  # UnitFlag bits, kept a plain int on the hot path
    write_time: int
    slot_time: int
    deliver_at: int
    cl_offset: int
    cl_size: int
    topic_hash: int = 0

    def encode(self) -> bytes:
        return encode_unit(*self)


def encode_unit(prev_pos: int, flags: int, write_time: int, slot_time: int, deliver_at: int, cl_offset: int,
                cl_size: int, topic_hash: int) -> bytes:
    """The 60 bytes of a unit (``TimerUnit.encode`` without building the tuple)."""
    body = _BODY.pack(UNIT_SIZE, prev_pos, MAGIC_BASE | flags, write_time, slot_time, deliver_at,
                      cl_offset, cl_size, topic_hash)
    return body + _CRC.pack(crc32c(body))


def decode_unit(data: bytes | memoryview, offset: int = 0, pos: int = -1) -> TimerUnit:
    """Decode the unit at ``data[offset:]``; raise ``TimerLogError`` if it is not a valid unit."""
    if len(data) - offset < UNIT_SIZE:
        raise TimerLogError(f"unit at {pos}: only {len(data) - offset} bytes")
    size, prev, magic, write_time, slot_time, deliver_at, cl_offset, cl_size, topic_hash = _BODY.unpack_from(
        data, offset)
    if size != UNIT_SIZE or magic & MAGIC_MASK != MAGIC_BASE:
        raise TimerLogError(f"unit at {pos}: bad size {size} or magic {magic:#x}")
    (crc,) = _CRC.unpack_from(data, offset + _BODY.size)
    with memoryview(data) as view:
        if crc != crc32c(view[offset:offset + _BODY.size]):
            raise TimerLogError(f"unit at {pos}: CRC32C mismatch")
    return TimerUnit(prev, magic & 0xFFFF, write_time, slot_time, deliver_at, cl_offset, cl_size, topic_hash)


@dataclass
class TimerLogRecovery:
    """What opening the log found; logged once."""

    start: int = 0
    end: int = 0
    truncated_bytes: int = 0
    reason: str = ""


class TimerLog:
    """Segment files under ``directory``; one writer, not thread-safe."""

    def __init__(self, directory: str, segment_units: int = DEFAULT_SEGMENT_UNITS,
                 write_buffer_bytes: int = 64 * 1024) -> None:
        if segment_units < 1:
            raise ValueError(f"segment_units must be >= 1, got {segment_units}")
        self.directory = directory
        self.segment_bytes = segment_units * UNIT_SIZE
        self._buffer_limit = write_buffer_bytes
        self._bases: list[int] = []  # sorted segment bases; the last one is active
        self._read_fds: dict[int, int] = {}
        self._maps: dict[int, mmap.mmap] = {}  # read-only maps of written data, for read()
        self._write_fd: int | None = None
        self._written = 0  # end of what the operating system holds
        self._pending = bytearray()  # appended, not yet written out
        self._last_write_time: dict[int, int] = {}  # base -> write_time of the segment's last unit

    # -- lifecycle -------------------------------------------------------------

    def open(self) -> TimerLogRecovery:
        """Find the segments and cut a torn or corrupt tail; return what was done."""
        os.makedirs(self.directory, exist_ok=True)
        self._bases = sorted(int(n[:-len(SEGMENT_SUFFIX)]) for n in os.listdir(self.directory)
                             if n.endswith(SEGMENT_SUFFIX) and n[:-len(SEGMENT_SUFFIX)].isdigit())
        report = TimerLogRecovery()
        if not self._bases:
            self._create_segment(0)
        physical = self._bases[-1] + os.path.getsize(self._path(self._bases[-1]))
        end = self._valid_end(physical, report)
        if end < physical:
            report.truncated_bytes = physical - end
            self._cut(end)
            log.warning("timer_log_truncated at=%d bytes=%d reason=%s", end, report.truncated_bytes, report.reason)
        self._written = end
        self._write_fd = os.open(self._path(self._bases[-1]), os.O_WRONLY | os.O_APPEND)
        report.start, report.end = self.start, self.end
        return report

    def close(self) -> None:
        """Write out, fsync and close every file."""
        if self._write_fd is not None:
            self.flush()
            os.close(self._write_fd)
            self._write_fd = None
        self._drop_maps()
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    # -- positions ---------------------------------------------------------------

    @property
    def start(self) -> int:
        """Position of the oldest unit still on disk."""
        return self._bases[0]

    @property
    def end(self) -> int:
        """Position the next unit will get."""
        return self._written + len(self._pending)

    @property
    def written(self) -> int:
        """End of the units the operating system holds (they survive a kill -9)."""
        return self._written

    def segments(self) -> list[int]:
        """Bases of the segment files, oldest first; the last one is being written."""
        return list(self._bases)

    # -- writing -------------------------------------------------------------------

    def append(self, unit: TimerUnit) -> int:
        """Append ``unit``; return its position."""
        return self.append_bytes(unit.encode())

    def append_bytes(self, data: bytes) -> int:
        """Append one encoded unit (``TimerUnit.encode()``); return its position."""
        if self._write_fd is None:
            raise TimerLogError("timer log is not open")
        pos = self._written + len(self._pending)
        if pos - self._bases[-1] >= self.segment_bytes:
            self.write_out()
            self._create_segment(pos)
        self._pending += data
        if len(self._pending) >= self._buffer_limit:
            self.write_out()
        return pos

    def write_out(self) -> None:
        """Hand the buffered units to the operating system."""
        if self._pending:
            view = memoryview(self._pending)
            done = 0
            while done < len(view):
                done += os.write(self._write_fd, view[done:])
            view.release()
            self._written += len(self._pending)
            self._pending.clear()

    def flush(self) -> None:
        """Write out and fsync the active segment (sealed ones were fsynced when sealed)."""
        self.sync_later()()

    def sync_later(self) -> Callable[[], None]:
        """Write out now; return a call that fsyncs everything written so far, on any thread.

        The call owns a duplicate of the active segment's fd, so a segment roll
        on the writer's thread meanwhile cannot close it under the fsync.
        """
        self.write_out()
        if self._write_fd is None:
            return lambda: None
        fd = os.dup(self._write_fd)

        def fsync() -> None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        return fsync

    def rewrite(self, pos: int, unit: TimerUnit) -> None:
        """Overwrite the unit at ``pos`` (recovery corrects ``prev_pos`` this way)."""
        if pos >= self._written:
            off = pos - self._written
            self._pending[off:off + UNIT_SIZE] = unit.encode()
            return
        base = self._base_for(pos)
        fd = os.open(self._path(base), os.O_WRONLY)
        try:
            os.pwrite(fd, unit.encode(), pos - base)
        finally:
            os.close(fd)

    def truncate(self, pos: int) -> int:
        """Cut every unit at or after ``pos``; return the number of bytes cut."""
        if pos % UNIT_SIZE or pos > self.end or pos < self.start:
            raise TimerLogError(f"cannot truncate to {pos} (start {self.start}, end {self.end})")
        cut = self.end - pos
        if pos >= self._written:
            del self._pending[pos - self._written:]
            return cut
        self._pending.clear()
        if self._write_fd is not None:
            os.close(self._write_fd)
        self._cut(pos)
        self._written = pos
        self._write_fd = os.open(self._path(self._bases[-1]), os.O_WRONLY | os.O_APPEND)
        return cut

    # -- reading -------------------------------------------------------------------

    def read(self, pos: int) -> TimerUnit:
        """Read and verify the unit at ``pos``."""
        if pos % UNIT_SIZE or pos < self.start or pos + UNIT_SIZE > self.end:
            raise TimerLogError(f"no unit at {pos} (start {self.start}, end {self.end})")
        if pos >= self._written:
            return decode_unit(self._pending, pos - self._written, pos)
        base = self._base_for(pos)
        m = self._maps.get(base)
        if m is None or pos - base + UNIT_SIZE > len(m):
            m = self._map(base)
        return decode_unit(m, pos - base, pos)

    def iter_units(self, start: int, end: int | None = None) -> Iterator[tuple[int, TimerUnit]]:
        """Yield ``(pos, unit)`` from ``start`` (inclusive) to ``end`` (exclusive), reading in chunks."""
        end = self.end if end is None else min(end, self.end)
        pos = max(start, self.start)
        self.write_out()
        while pos < end:
            base = self._base_for(pos)
            seg_end = self._bases[self._bases.index(base) + 1] if base != self._bases[-1] else self._written
            n = min(end, seg_end, pos + _READ_CHUNK_UNITS * UNIT_SIZE) - pos
            data = os.pread(self._read_fd(base), n, pos - base)
            if len(data) < n:
                raise TimerLogError(f"short read at {pos}: {len(data)} of {n} bytes")
            for off in range(0, n, UNIT_SIZE):
                yield pos + off, decode_unit(data, off, pos + off)
            pos += n

    def last_write_time(self, base: int) -> int | None:
        """``write_time`` of the last unit of the segment at ``base`` (None if it is empty)."""
        if base in self._last_write_time:
            return self._last_write_time[base]
        i = self._bases.index(base)
        seg_end = self._bases[i + 1] if i + 1 < len(self._bases) else self.end
        if seg_end == base:
            return None
        value = self.read(seg_end - UNIT_SIZE).write_time
        if i + 1 < len(self._bases):  # sealed: it will not change
            self._last_write_time[base] = value
        return value

    def delete_segment(self, base: int) -> None:
        """Delete the oldest segment; it must not be the one being written."""
        if base != self._bases[0] or len(self._bases) == 1:
            raise TimerLogError(f"segment {base} is not the oldest sealed segment")
        m = self._maps.pop(base, None)
        if m is not None:
            m.close()
        fd = self._read_fds.pop(base, None)
        if fd is not None:
            os.close(fd)
        os.unlink(self._path(base))
        self._bases.pop(0)
        self._last_write_time.pop(base, None)
        log.info("timer_log_segment_deleted base=%d", base)

    # -- internals -------------------------------------------------------------------

    def _path(self, base: int) -> str:
        return os.path.join(self.directory, f"{base:020d}{SEGMENT_SUFFIX}")

    def _base_for(self, pos: int) -> int:
        i = bisect.bisect_right(self._bases, pos) - 1
        if i < 0:
            raise TimerLogError(f"position {pos} is before the first segment")
        return self._bases[i]

    def _map(self, base: int) -> mmap.mmap:
        """Map the written part of a segment (again, if it grew since)."""
        old = self._maps.pop(base, None)
        if old is not None:
            old.close()
        i = self._bases.index(base)
        seg_end = self._bases[i + 1] if i + 1 < len(self._bases) else self._written
        m = self._maps[base] = mmap.mmap(self._read_fd(base), seg_end - base, access=mmap.ACCESS_READ)
        return m

    def _drop_maps(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()

    def _read_fd(self, base: int) -> int:
        fd = self._read_fds.get(base)
        if fd is None:
            fd = self._read_fds[base] = os.open(self._path(base), os.O_RDONLY)
        return fd

    def _create_segment(self, base: int) -> None:
        fd = os.open(self._path(base), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if self._write_fd is None:
            os.close(fd)  # open() reopens the active segment once recovery is done
        else:
            os.fsync(self._write_fd)  # a sealed segment is durable before the next one exists
            os.close(self._write_fd)
            self._write_fd = fd
        self._bases.append(base)
        fsync_dir(self.directory)

    def _valid_end(self, physical: int, report: TimerLogRecovery) -> int:
        """End of the last complete, valid unit of the active segment."""
        base = self._bases[-1]
        end = base + (physical - base) // UNIT_SIZE * UNIT_SIZE
        if end < physical:
            report.reason = "partial unit at the tail (torn write)"
        fd = self._read_fd(base)
        while end > base:
            try:
                decode_unit(os.pread(fd, UNIT_SIZE, end - UNIT_SIZE - base), 0, end - UNIT_SIZE)
                break
            except TimerLogError as e:
                report.reason = str(e)
                end -= UNIT_SIZE
        return end

    def _cut(self, pos: int) -> None:
        """Physically remove everything at or after ``pos`` (later segments are deleted)."""
        self._drop_maps()  # a map past the end of a file faults
        while len(self._bases) > 1 and self._bases[-1] > pos:
            base = self._bases.pop()
            fd = self._read_fds.pop(base, None)
            if fd is not None:
                os.close(fd)
            self._last_write_time.pop(base, None)
            os.unlink(self._path(base))
        base = self._bases[-1]
        self._last_write_time.pop(base, None)
        with open(self._path(base), "r+b") as f:
            f.truncate(pos - base)
            os.fsync(f.fileno())
