"""Where records start: header hops over segments, and partition planning.

Spark needs two things the plain reader does not give: offsets that are exact
record boundaries (a streaming offset must name the same records every time it
is replayed) and split points inside big segments (so one segment can feed
several tasks). Both come from hopping from header to header: only the 13-byte
header of each record is read, through a read-only ``mmap``, so planning is cheap
compared with decoding. A header that is not plausible (corruption) is stepped
over by searching for the next header whose record decodes with a good CRC; a
record that is not complete yet (the tail a live broker is writing) ends the hop.

Pure functions over files: no Spark, no lock, no writer state.
"""

from __future__ import annotations

import mmap
import os
from typing import NamedTuple

from store import reader
from store import record as rec

MARKER = bytes([rec.VERSION]) + rec.MAGIC.to_bytes(4, "big")
_RESYNC_TRIES = 64  # marker look-alikes inside corrupt bytes checked before giving up


class ScanRange(NamedTuple):
    """Records starting in ``[start, end)`` of one segment: one Spark partition."""

    index: int
    path: str
    base: int
    start: int
    end: int


def _map(path: str):
    """A read-only map of ``path`` (None if the file is empty or gone)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None
            return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except (FileNotFoundError, ValueError):
        return None


def _resync(buf, pos: int) -> int:
    """Position of the next record after ``pos`` that decodes cleanly, else -1.

    -1 also when the candidate is still incomplete: the hop must stop before the
    corrupt bytes and try again once the writer has finished.
    """
    find_from = pos + 1
    for _ in range(_RESYNC_TRIES):
        cand = buf.find(MARKER, find_from)
        if cand < 0:
            return -1
        try:
            rec.decode(buf, cand)
            return cand
        except rec.TruncatedRecord:
            return -1
        except rec.CorruptRecord:
            find_from = cand + 1
    return -1


def hop_segment(segment: reader.Segment, start: int, max_records: int | None = None,
                split_bytes: int | None = None, stop_at: int | None = None) -> tuple[int, int, list[int]]:
    """Hop from boundary ``start`` to the end of ``segment``'s complete records.

    Returns ``(end, records, splits)``: ``end`` is the boundary where the hop
    stopped (end of data, incomplete tail, ``max_records`` reached, or the first
    record starting at or after ``stop_at``) and ``splits`` the boundaries at
    which each ``split_bytes`` chunk begins.
    """
    buf = _map(segment.path)
    if buf is None:
        return start, 0, []
    try:
        size = len(buf)
        pos = start - segment.base
        n = 0
        splits: list[int] = []
        last_split = pos
        unpack = rec.HEADER.unpack_from
        lo, hi = rec.MIN_RECORD_SIZE, rec.MAX_RECORD_SIZE
        limit = None if stop_at is None else stop_at - segment.base
        while pos + rec.HEADER_SIZE <= size:
            if max_records is not None and n >= max_records:
                break
            if limit is not None and pos >= limit:
                break
            version, magic, total, _crc = unpack(buf, pos)
            if version != rec.VERSION or magic != rec.MAGIC or not lo <= total <= hi:
                nxt = _resync(buf, pos)
                if nxt < 0:
                    break
                pos = nxt
                continue
            if pos + total > size:
                break  # the record is still being written (or torn)
            if split_bytes is not None and pos - last_split >= split_bytes:
                splits.append(segment.base + pos)
                last_split = pos
            pos += total
            n += 1
        return segment.base + pos, n, splits
    finally:
        buf.close()


def segment_index_for(segments: list[reader.Segment], offset: int) -> int:
    """Index of the segment holding ``offset`` (the last one whose base <= offset)."""
    idx = 0
    for i, seg in enumerate(segments):
        if seg.base <= offset:
            idx = i
        else:
            break
    return idx


def first_offset(directory: str) -> int:
    """The oldest offset still present (0 for an empty log)."""
    segments = reader.list_segments(directory)
    return segments[0].base if segments else 0


def physical_end(directory: str) -> int:
    """Offset just past the last byte written (not necessarily a record boundary)."""
    segments = reader.list_segments(directory)
    if not segments:
        return 0
    try:
        return segments[-1].base + segments[-1].size
    except FileNotFoundError:
        return segments[-1].base


def last_segment_base(directory: str) -> int:
    """Base of the active (last) segment: a record boundary cheap to find."""
    segments = reader.list_segments(directory)
    return segments[-1].base if segments else 0


def latest_boundary(directory: str, start: int, max_records: int | None = None,
                    stop_at: int | None = None) -> tuple[int, int]:
    """The boundary just past the last complete record at or after boundary ``start``.

    Walks into later segments as the writer rolls. With ``max_records`` the hop
    stops after that many records; with ``stop_at`` before the first record
    that starts at or after that offset. Returns ``(end, records)``.
    """
    segments = reader.list_segments(directory)
    if not segments:
        return start, 0
    pos = max(start, segments[0].base)  # older segments were deleted by retention
    total = 0
    for i in range(segment_index_for(segments, pos), len(segments)):
        seg = segments[i]
        remaining = None if max_records is None else max_records - total
        if remaining is not None and remaining <= 0:
            break
        if stop_at is not None and max(pos, seg.base) >= stop_at:
            break
        pos = max(pos, seg.base)
        pos, n, _ = hop_segment(seg, pos, remaining, stop_at=stop_at)
        total += n
        if max_records is not None and total >= max_records:
            break
        # the next segment starts where this one ended; bytes we could not
        # hop over (a torn tail of a rolled segment) are left behind
    return pos, total


def plan_ranges(directory: str, start: int | None = None, end: int | None = None,
                max_bytes: int = 64 * 1024 * 1024) -> list[ScanRange]:
    """Split ``[start, end)`` of the log into scan ranges, one per segment or chunk.

    ``end=None`` snapshots the log: the last segment ends at its last complete
    record now, so every task reads the same records even while a broker appends.
    Segments bigger than ``max_bytes`` are split at record boundaries.
    """
    segments = reader.list_segments(directory)
    ranges: list[ScanRange] = []
    if not segments:
        return ranges
    lo = segments[0].base if start is None else max(start, segments[0].base)
    for i in range(segment_index_for(segments, lo), len(segments)):
        seg = segments[i]
        nxt = segments[i + 1].base if i + 1 < len(segments) else None
        seg_start = max(lo, seg.base)
        if end is not None and seg_start >= end:
            break
        if nxt is None or (end is not None and end < nxt):
            # the active segment or the last one the range touches: hop to know where it ends
            stop, _, splits = hop_segment(seg, seg_start, split_bytes=max_bytes)
            if end is not None:
                stop = min(stop, end) if end >= seg_start else seg_start
                splits = [s for s in splits if s < stop]
        else:
            stop = nxt
            splits = []
            if nxt - seg_start > max_bytes:
                _, _, splits = hop_segment(seg, seg_start, split_bytes=max_bytes)
        bounds = [seg_start, *splits, stop]
        for a, b in zip(bounds, bounds[1:]):
            if b > a:
                ranges.append(ScanRange(len(ranges), seg.path, seg.base, a, b))
    return ranges
