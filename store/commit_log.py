"""The commit log: append-only segment files holding every record exactly once.

Appends are written to the operating system (``os.write``) before they return,
so a killed process loses nothing it acknowledged; fsync is the flush policy's
business and runs off the reactor thread. Segments are named by the physical
offset of their first byte and offsets are dense: a new segment starts where the
previous one ended. Recovery scans from the last fsync checkpoint, verifies
every CRC and truncates a torn or corrupt tail, reporting what it cut.
"""

from __future__ import annotations

import logging
import os
import threading
from itertools import accumulate
from dataclasses import dataclass, field
from typing import Iterator

from store import reader
from store import record as rec
from store.files import fsync_dir

log = logging.getLogger("twistmq.store.commit_log")

CHECKPOINT_FILE = "checkpoint"


class CommitLogError(Exception):
    """The commit log cannot do what was asked (bad offset, closed, disk error)."""


@dataclass
class RecoveryReport:
    """What recovery found and did; logged once at start-up."""

    scanned_from: int = 0
    end_offset: int = 0
    records_scanned: int = 0
    truncated_bytes: int = 0
    truncated_at: int | None = None
    reason: str = ""
    removed_segments: list[str] = field(default_factory=list)


class CommitLog:
    """Segment files under ``directory``; one writer per directory.

    Not thread-safe for writers: ``append`` runs on one thread (the reactor).
    ``sync`` may run concurrently on a worker thread.
    """

    def __init__(self, directory: str, segment_size: int = 1 << 30) -> None:
        if segment_size < rec.MIN_RECORD_SIZE * 4:
            raise ValueError(f"segment_size {segment_size} is too small")
        self.directory = directory
        self.segment_size = segment_size
        self._segments: list[reader.Segment] = []
        self._write_fd: int | None = None
        self._write_base = 0
        self._write_pos = 0  # bytes in the active segment
        self._read_fds: dict[int, int] = {}
        self._unsynced_fds: list[int] = []  # rolled segments not yet fsynced
        self._dir_unsynced = False  # a roll created a file whose directory entry is not fsynced yet
        self._sync_lock = threading.Lock()  # one fsync at a time
        self._fd_lock = threading.Lock()  # guards the active fd and offsets against a roll
        self.synced_offset = 0
        self.recovery: RecoveryReport | None = None

    # -- lifecycle -------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Recover the log: verify the tail after the checkpoint, cut what is bad."""
        os.makedirs(self.directory, exist_ok=True)
        self._segments = reader.list_segments(self.directory)
        report = RecoveryReport()
        checkpoint = self._read_checkpoint()
        if not self._segments:
            self._new_segment(0)
            report.end_offset = 0
        else:
            start = checkpoint if self._segments[0].base <= checkpoint <= self._physical_end() else self._segments[0].base
            report.scanned_from = start
            stats = reader.ScanStats()
            for _ in reader.iter_records(self.directory, start=start, stats=stats):
                pass
            report.records_scanned = stats.records
            end = stats.end_offset
            physical = self._physical_end()
            if end < physical:
                report.truncated_at = end
                report.truncated_bytes = physical - end
                report.reason = stats.stop_reason or "incomplete record at the tail (torn write)"
                self._truncate(end, report)
            report.end_offset = end
            last = self._segments[-1]
            self._write_base = last.base
            self._write_pos = end - last.base
            self._write_fd = os.open(last.path, os.O_WRONLY | os.O_APPEND)
        self.synced_offset = min(checkpoint, report.end_offset)
        if report.truncated_bytes:
            log.warning(
                "commitlog_truncated at=%d bytes=%d reason=%s removed_segments=%d",
                report.truncated_at, report.truncated_bytes, report.reason, len(report.removed_segments),
            )
        log.info("commitlog_recovered from=%d end=%d records_scanned=%d",
                 report.scanned_from, report.end_offset, report.records_scanned)
        self.recovery = report
        return report

    def close(self) -> None:
        """Fsync and close every file."""
        if self._write_fd is not None:
            self.sync()
            os.close(self._write_fd)
            self._write_fd = None
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    # -- offsets -----------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """Offset of the oldest byte still on disk."""
        return self._segments[0].base if self._segments else 0

    @property
    def max_offset(self) -> int:
        """Offset just past the last record written (where the next append goes)."""
        return self._write_base + self._write_pos

    def _physical_end(self) -> int:
        last = self._segments[-1]
        return last.base + os.path.getsize(last.path)

    def segments(self) -> list[reader.Segment]:
        """The current segments, oldest first."""
        return list(self._segments)

    # -- writing ------------------------------------------------------------------

    def append(self, records: list[bytes]) -> list[int]:
        """Write encoded records, in as few ``os.write`` calls as segment rolls allow.

        Returns each record's offset. On a disk error nothing of the batch stays
        in the log (the active segment is cut back) and CommitLogError is raised.
        """
        if self._write_fd is None:
            raise CommitLogError("commit log is not open")
        start_base, start_pos = self._write_base, self._write_pos
        sizes = list(map(len, records))
        if start_pos + sum(sizes) <= self.segment_size:
            # The batch fits the active segment (nearly every tick): offsets and write without a step per record.
            offsets = list(accumulate(sizes, initial=start_base + start_pos))
            offsets.pop()
            try:
                self._write(records)
            except OSError as exc:
                self._undo_to(start_base, start_pos)
                raise CommitLogError(f"append failed: {exc}") from exc
            return offsets
        offsets = []
        chunk: list[bytes] = []
        chunk_size = 0
        try:
            for data in records:
                if self._write_pos + chunk_size + len(data) > self.segment_size and (self._write_pos + chunk_size) > 0:
                    self._write(chunk)
                    chunk, chunk_size = [], 0
                    self._roll()
                offsets.append(self._write_base + self._write_pos + chunk_size)
                chunk.append(data)
                chunk_size += len(data)
            if chunk:
                self._write(chunk)
        except OSError as exc:
            self._undo_to(start_base, start_pos)
            raise CommitLogError(f"append failed: {exc}") from exc
        return offsets

    def _write(self, chunk: list[bytes]) -> None:
        if not chunk:
            return
        data = chunk[0] if len(chunk) == 1 else b"".join(chunk)
        view = memoryview(data)
        while view:
            n = os.write(self._write_fd, view)
            view = view[n:]
        self._write_pos += len(data)

    def _roll(self) -> None:
        """Start a new segment where the active one ends.

        Runs on the appending (reactor) thread, so it fsyncs nothing: the old
        segment's fsync and the directory's (the new file's entry) are owed to
        the next ``sync()``, which runs on the flush policy's executor and
        claims no offset in the new segment before both are done.
        """
        with self._fd_lock:
            self._unsynced_fds.append(self._write_fd)
            self._new_segment(self._write_base + self._write_pos, sync_dir=False)
            self._dir_unsynced = True

    def _new_segment(self, base: int, sync_dir: bool = True) -> None:
        path = os.path.join(self.directory, reader.segment_name(base))
        self._write_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._segments.append(reader.Segment(base, path))
        self._write_base, self._write_pos = base, 0
        if sync_dir:
            fsync_dir(self.directory)

    def _undo_to(self, base: int, pos: int) -> None:
        """Cut the log back to (base, pos) after a failed append."""
        try:
            self._truncate(base + pos, RecoveryReport())
            last = self._segments[-1]
            if self._write_fd is not None:
                os.close(self._write_fd)
            self._write_fd = os.open(last.path, os.O_WRONLY | os.O_APPEND)
            self._write_base, self._write_pos = last.base, base + pos - last.base
        except OSError:
            log.exception("commitlog_undo_failed base=%d pos=%d", base, pos)

    def _truncate(self, offset: int, report: RecoveryReport) -> None:
        """Drop everything from ``offset`` on: later segments go, the one holding it is cut."""
        while self._segments and self._segments[-1].base > offset:
            seg = self._segments.pop()
            fd = self._read_fds.pop(seg.base, None)
            if fd is not None:
                os.close(fd)
            os.remove(seg.path)
            report.removed_segments.append(seg.path)
        if not self._segments:
            self._new_segment(offset)
            return
        seg = self._segments[-1]
        with open(seg.path, "r+b") as f:
            f.truncate(offset - seg.base)
            os.fsync(f.fileno())

    def truncate_to(self, offset: int) -> int:
        """Cut the log back so that it ends at ``offset``, a record boundary; return the bytes removed.

        A replica's handshake does this (``store.ha_connection.Truncate``) with the
        same cut recovery makes of a torn tail. Everything written before is
        fsynced first, so the checkpoint never claims a byte that is gone.
        """
        if self._write_fd is None:
            raise CommitLogError("commit log is not open")
        end = self.max_offset
        if not self.min_offset <= offset <= end:
            raise CommitLogError(f"cannot truncate to {offset}: the log holds [{self.min_offset}, {end})")
        if offset == end:
            return 0
        seg = self._segment_for(offset)
        try:
            rec.check_header(os.pread(self._read_fd(seg), rec.HEADER_SIZE, offset - seg.base))
        except rec.RecordError as exc:
            raise CommitLogError(f"cannot truncate to {offset}: no record starts there ({exc})") from None
        self.sync()
        with self._sync_lock, self._fd_lock:
            os.close(self._write_fd)
            self._write_fd = None
            report = RecoveryReport(truncated_at=offset, truncated_bytes=end - offset, reason="replica truncation")
            self._truncate(offset, report)
            last = self._segments[-1]
            self._write_fd = os.open(last.path, os.O_WRONLY | os.O_APPEND)
            self._write_base, self._write_pos = last.base, offset - last.base
            fsync_dir(self.directory)
            self.synced_offset = min(self.synced_offset, offset)
            self._write_checkpoint(self.synced_offset)
        log.warning("commitlog_truncated at=%d bytes=%d reason=replica removed_segments=%d",
                    offset, end - offset, len(report.removed_segments))
        return end - offset

    def read_raw(self, offset: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` bytes of the log from ``offset``, from one segment (replication's reads)."""
        seg = self._segment_for(offset)
        stop = min(self.max_offset, offset + max_bytes)
        return os.pread(self._read_fd(seg), stop - offset, offset - seg.base)

    def append_at(self, offset: int, data: bytes, sizes: list[int] | None = None) -> None:
        """Append records someone else wrote (a replica's copy of its master's log) at exactly ``offset``.

        ``sizes`` are the records' sizes when the caller decoded them already.
        Offsets are dense, so every record keeps its master's offset; the
        segments roll as this log's own size says, like any append.
        """
        if offset != self.max_offset:
            raise CommitLogError(f"replicated records at {offset}, but this log ends at {self.max_offset}")
        if sizes is None:
            sizes = []
            pos = 0
            while pos < len(data):
                sizes.append(rec.check_header(data, pos))
                pos += sizes[-1]
        if sum(sizes) != len(data):
            raise CommitLogError(f"record sizes add up to {sum(sizes)}, the data has {len(data)} bytes")
        view = memoryview(data)
        chunks, pos = [], 0
        for size in sizes:
            chunks.append(view[pos:pos + size])
            pos += size
        self.append(chunks)

    # -- durability --------------------------------------------------------------

    def sync(self) -> int:
        """Fsync everything written so far; return the offset now durable.

        Safe to call from a worker thread while the reactor thread appends:
        the offset is taken before the fsync, so it never claims too much.
        """
        with self._sync_lock:
            with self._fd_lock:  # a consistent snapshot: no roll between these reads
                offset = self.max_offset
                fd = self._write_fd
                rolled, self._unsynced_fds = self._unsynced_fds, []
                dir_unsynced, self._dir_unsynced = self._dir_unsynced, False
            try:
                while rolled:
                    os.fsync(rolled[0])
                    os.close(rolled.pop(0))
                if dir_unsynced:
                    fsync_dir(self.directory)
            except OSError:
                with self._fd_lock:  # owed again: the next sync retries them
                    self._unsynced_fds[:0] = rolled
                    self._dir_unsynced = self._dir_unsynced or dir_unsynced
                raise
            if fd is not None:
                os.fsync(fd)
            if offset > self.synced_offset:
                self.synced_offset = offset
                self._write_checkpoint(offset)
            return self.synced_offset

    def _checkpoint_path(self) -> str:
        return os.path.join(self.directory, CHECKPOINT_FILE)

    def _read_checkpoint(self) -> int:
        try:
            with open(self._checkpoint_path(), "rb") as f:
                data = f.read()
            return int(data.decode("ascii").strip() or 0)
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            return 0

    def _write_checkpoint(self, offset: int) -> None:
        tmp = self._checkpoint_path() + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"%d\n" % offset)
        os.replace(tmp, self._checkpoint_path())

    # -- reading -------------------------------------------------------------------

    def _segment_for(self, offset: int) -> reader.Segment:
        segs = self._segments
        if not segs or offset < segs[0].base or offset >= self.max_offset:
            raise CommitLogError(f"offset {offset} is outside the log [{self.min_offset}, {self.max_offset})")
        lo, hi = 0, len(segs) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if segs[mid].base <= offset:
                lo = mid
            else:
                hi = mid - 1
        return segs[lo]

    def _read_fd(self, seg: reader.Segment) -> int:
        fd = self._read_fds.get(seg.base)
        if fd is None:
            fd = os.open(seg.path, os.O_RDONLY)
            self._read_fds[seg.base] = fd
        return fd

    def read(self, offset: int, size: int | None = None, queues: bool = True) -> rec.Record:
        """Decode the record at ``offset`` (``size`` saves a header read when known; ``queues``: see
        ``record.decode``)."""
        seg = self._segment_for(offset)
        fd = self._read_fd(seg)
        pos = offset - seg.base
        if size is None:
            head = os.pread(fd, rec.HEADER_SIZE, pos)
            size = rec.check_header(head)
        data = os.pread(fd, size, pos)
        return rec.decode(data, 0, offset, queues)

    def read_run(self, offset: int, sizes: list[int], queues: bool = True) -> list[rec.Record]:
        """Decode records that follow each other from ``offset`` with one read (a fan-in queue's backlog;
        ``queues``: see ``record.decode``)."""
        seg = self._segment_for(offset)
        pos = offset - seg.base
        total = sum(sizes)
        data = os.pread(self._read_fd(seg), total, pos)
        if len(data) < total:  # the run crosses into the next segment
            return [self.read(o, n, queues) for o, n in _offsets(offset, sizes)]
        out, at = [], 0
        decode = rec.decode
        for n in sizes:
            out.append(decode(data, at, offset + at, queues))
            at += n
        return out

    def iterate(self, start: int, end: int | None = None) -> Iterator[rec.Record]:
        """Records from ``start`` up to the end of what is written now (or ``end``)."""
        stop = self.max_offset if end is None else min(end, self.max_offset)
        return reader.iter_records(self.directory, start=max(start, self.min_offset), end=stop)

    # -- retention -------------------------------------------------------------------

    def delete_oldest(self, count: int, reason: str) -> list[str]:
        """Delete the ``count`` oldest segments (never the active one); return their paths.

        Which segments may go is retention's decision (``store.retention``); this
        only removes files, after making sure no fsync owed to the checkpoint is lost.
        """
        deleted: list[str] = []
        for _ in range(min(count, len(self._segments) - 1)):
            seg = self._segments[0]
            size = os.path.getsize(seg.path)
            if seg.base + size > self.synced_offset:
                self.sync()  # never drop bytes whose fsync is still owed to the checkpoint
            self._segments.pop(0)
            fd = self._read_fds.pop(seg.base, None)
            if fd is not None:
                os.close(fd)
            os.remove(seg.path)
            deleted.append(seg.path)
            log.info("commitlog_segment_deleted path=%s bytes=%d reason=%s", seg.path, size, reason)
        return deleted


def _offsets(offset: int, sizes: list[int]):
    for n in sizes:
        yield offset, n
        offset += n
