"""Read-only walk over commit-log segment files.

No lock, no RocksDB, no writer state: recovery, replication and Spark all use
this to read segments, including those of a live broker. A walk stops at the
last complete record; what follows (a record still being written, or a torn
tail) is not returned. With ``skip_corrupt`` a reader that must not stop (Spark)
steps over corrupt records and counts them instead.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Iterator, NamedTuple

from store import record as rec

SEGMENT_NAME = re.compile(r"^\d{20}$")
CHUNK = 4 * 1024 * 1024


class Segment(NamedTuple):
    """One segment file; ``base`` is the physical offset of its first byte."""

    base: int
    path: str

    @property
    def size(self) -> int:
        """Bytes currently in the file."""
        return os.path.getsize(self.path)


def segment_name(base: int) -> str:
    """File name of the segment starting at ``base``: 20 zero-padded digits."""
    return f"{base:020d}"


def list_segments(directory: str) -> list[Segment]:
    """Every segment in ``directory``, ordered by base offset."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(Segment(int(n), os.path.join(directory, n)) for n in names if SEGMENT_NAME.match(n))


@dataclass
class ScanStats:
    """What a walk saw: how far it got and what it stepped over."""

    records: int = 0
    corrupt: int = 0  # corrupt records skipped (only with skip_corrupt)
    skipped_bytes: int = 0
    end_offset: int = 0  # offset just past the last complete record read
    stop_reason: str = ""  # why the walk stopped before the end of the data, if it did


def _find_next_header(buf: bytes | bytearray, start: int) -> int:
    """Position of the next plausible record header at or after ``start``, or -1."""
    marker = bytes([rec.VERSION]) + rec.MAGIC.to_bytes(4, "big")
    return buf.find(marker, start)


def scan_segment(
    segment: Segment,
    start: int | None = None,
    end: int | None = None,
    skip_corrupt: bool = False,
    stats: ScanStats | None = None,
    chunk: int = CHUNK,
) -> Iterator[rec.Record]:
    """Yield the complete records of ``segment`` from offset ``start``.

    Records that start at or after ``end`` are not read. Without
    ``skip_corrupt`` the walk stops at the first corrupt record and says why in
    ``stats.stop_reason``; with it, corrupt records are counted and stepped
    over by resynchronising on the next valid header.
    """
    stats = stats if stats is not None else ScanStats()
    pos_offset = segment.base if start is None else start
    stats.end_offset = pos_offset
    limit = end if end is not None else 1 << 62
    try:
        f = open(segment.path, "rb")
    except FileNotFoundError:
        stats.stop_reason = f"segment {segment.path} is gone (deleted by retention?)"
        return
    with f:
        f.seek(pos_offset - segment.base)
        buf = b""
        i = 0  # read position inside buf
        while pos_offset < limit:
            need = _bytes_needed(buf, i)
            if need:
                more = f.read(max(chunk, need))
                if not more:
                    break  # end of data: whatever is left is an incomplete tail
                buf = buf[i:] + more
                i = 0
                continue
            try:
                record = rec.decode(buf, i, offset=pos_offset)
            except rec.CorruptRecord as exc:
                if not skip_corrupt:
                    stats.stop_reason = f"corrupt record at offset {pos_offset}: {exc}"
                    return
                jump = _resync(f, buf, i, chunk)
                buf, i = jump[1], jump[2]
                stats.corrupt += 1
                stats.skipped_bytes += jump[0]
                pos_offset += jump[0]
                stats.end_offset = pos_offset
                continue
            stats.records += 1
            pos_offset += record.size
            i += record.size
            stats.end_offset = pos_offset
            yield record


def _resync(f, buf: bytes, i: int, chunk: int) -> tuple[int, bytes, int]:
    """Skip to the next plausible header; return (bytes skipped, buf, new i)."""
    nxt = _find_next_header(buf, i + 1)
    skipped_before = 0
    while nxt < 0:
        more = f.read(chunk)
        # keep the last 4 bytes: a marker may straddle the chunk boundary
        keep = max(len(buf) - 4, i + 1)
        skipped_before += keep - i
        buf = buf[keep:] + more
        i = 0
        if not more:
            return skipped_before + len(buf), b"", 0
        nxt = _find_next_header(buf, 0)
    return skipped_before + (nxt - i), buf, nxt


def _bytes_needed(buf: bytes, i: int) -> int:
    """How many more bytes ``buf[i:]`` needs to hold a whole record (0: enough).

    A corrupt header needs nothing more: decode reports it.
    """
    avail = len(buf) - i
    if avail < rec.HEADER_SIZE:
        return rec.HEADER_SIZE - avail
    try:
        total = rec.check_header(buf, i)
    except rec.CorruptRecord:
        return 0
    return max(0, total - avail)


def iter_records(
    directory: str,
    start: int = 0,
    end: int | None = None,
    skip_corrupt: bool = False,
    stats: ScanStats | None = None,
) -> Iterator[rec.Record]:
    """Yield records across all segments of ``directory`` from offset ``start``.

    A segment that ends early (the writer rolled to the next one) is followed
    by the next segment; the walk ends at the last complete record of the last
    segment, or at ``end``.
    """
    stats = stats if stats is not None else ScanStats()
    segments = list_segments(directory)
    stats.end_offset = start
    for idx, seg in enumerate(segments):
        nxt_base = segments[idx + 1].base if idx + 1 < len(segments) else None
        if nxt_base is not None and nxt_base <= start:
            continue
        seg_start = max(start, seg.base)
        seg_end = nxt_base if end is None else (min(end, nxt_base) if nxt_base is not None else end)
        yield from scan_segment(seg, seg_start, seg_end, skip_corrupt, stats)
        if stats.stop_reason and not skip_corrupt:
            return
        if end is not None and stats.end_offset >= end:
            return
