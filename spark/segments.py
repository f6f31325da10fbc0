"""Where records start: header hops over segments, and partition planning.

Spark needs two things the plain reader does not give: offsets that are exact
record boundaries (a streaming offset must name the same records every time it
is replayed) and split points inside big segments (so one segment can feed
several tasks). Both come from hopping from header to header: only the 13-byte
header of each record is read, through a read-only ``mmap``, so planning is cheap
compared with decoding. A header that is not plausible (corruption) is stepped
over by searching for the next header whose record decodes with a good CRC; a
record that is not complete yet (the tail a live broker is writing) ends the hop.

A broker group's master (and its slaves) keep ``DATA_DIR/confirm_offset``
(``store.ha_sync.ConfirmOffsetFile``): records past it may be truncated by a
failover, so every plan stops there (``confirm_limit``). Without that file (a
node, a group of one) the whole log is read, as always.

Pure functions over files: no Spark, no lock, no writer state.
"""

from __future__ import annotations

import mmap
import os
from typing import NamedTuple

import numpy as np

from store import reader
from store import record as rec
from store.ha_sync import ConfirmOffsetFile

MARKER = bytes([rec.VERSION]) + rec.MAGIC.to_bytes(4, "big")
_MARKER_BYTES = np.frombuffer(MARKER, np.uint8)
_RARE_AT = 2  # the marker's byte 0x15: a control character, so text payloads seldom hold it
_WINDOW = 16 << 20  # bytes searched for headers at a time
_MAX_LOOKALIKES = 256  # marker look-alikes stepped over in numpy before the header hop takes the rest
_RESYNC_TRIES = 64  # marker look-alikes inside corrupt bytes checked before giving up


class ScanRange(NamedTuple):
    """Records starting in ``[start, end)`` of one segment: one Spark partition."""

    index: int
    path: str
    base: int
    start: int
    end: int


def _map(path: str, populate: bool = False):
    """A read-only map of ``path`` (None if the file is empty or gone); ``populate``: map every page up front
    (one call instead of a page fault per page, for a scan of the whole file)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return None
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            return mmap.mmap(f.fileno(), size, flags=flags, prot=mmap.PROT_READ)
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


def chain(a: np.ndarray, pos: int) -> np.ndarray:
    """Starts of the records that follow each other from boundary ``pos``, found with numpy (no CRC check).

    Every place the header's marker appears is a candidate; from ``pos`` each
    record whose size is plausible and whose end is the next candidate (or the
    end of ``a``) is taken. A candidate inside a payload (its bytes happen to
    hold the marker) is stepped over by following the size. Stops at the first
    record that does not end on a candidate (corrupt bytes, an incomplete tail):
    the header hop takes over from there. The last start returned ends where
    the chain ends (``chain_end``).
    """
    size = len(a)
    last = size - rec.HEADER_SIZE
    if pos > last:
        return np.zeros(0, np.int64)
    found = []
    for lo in range(pos, last + 1, _WINDOW):  # a window at a time: a 1 GiB segment needs no 1 GiB temporary
        hi = min(last, lo + _WINDOW - 1)
        cand = np.flatnonzero(a[lo + _RARE_AT:hi + _RARE_AT + 1] == _MARKER_BYTES[_RARE_AT]) + lo
        for i, byte in enumerate(_MARKER_BYTES):
            if i != _RARE_AT:
                cand = cand[a[cand + i] == byte]
        found.append(cand)
    cand = np.concatenate(found)
    if len(cand) == 0 or cand[0] != pos:
        return np.zeros(0, np.int64)
    sizes = np.ndarray((size - 3,), ">u4", a, 0, (1,))[cand + 5].astype(np.int64)
    ends = cand + sizes
    fits = (sizes >= rec.MIN_RECORD_SIZE) & (sizes <= rec.MAX_RECORD_SIZE) & (ends <= size)
    follows = np.zeros(len(cand), bool)
    follows[:-1] = ends[:-1] == cand[1:]
    breaks = np.flatnonzero(~(fits & follows))  # the candidates whose record does not end on the next one
    runs: list[np.ndarray] = []
    i = 0
    for _ in range(_MAX_LOOKALIKES):
        b = int(np.searchsorted(breaks, i))
        j = int(breaks[b]) if b < len(breaks) else len(cand)  # records i..j-1 each end where the next begins
        runs.append(cand[i:j])
        if j == len(cand) or not fits[j]:
            break
        runs.append(cand[j:j + 1])  # record j is complete; what follows it is not the next candidate
        k = int(np.searchsorted(cand, ends[j]))
        if k == len(cand) or cand[k] != ends[j]:
            break  # the end of the data, or bytes that are not a header: the header hop decides
        i = k  # cand[j + 1:k] were marker look-alikes inside record j
    return np.concatenate(runs) if runs else np.zeros(0, np.int64)


def hop_segment(segment: reader.Segment, start: int, max_records: int | None = None,
                split_bytes: int | None = None, stop_at: int | None = None) -> tuple[int, int, list[int]]:
    """Hop from boundary ``start`` to the end of ``segment``'s complete records.

    Returns ``(end, records, splits)``: ``end`` is the boundary where the hop
    stopped (end of data, incomplete tail, ``max_records`` reached, or the first
    record starting at or after ``stop_at``) and ``splits`` the boundaries at
    which each ``split_bytes`` chunk begins. The records that chain cleanly
    (nearly all) are found with numpy; the header hop goes on from where they
    stop.
    """
    # A hop of a few records (a micro-batch's max_records) stays a header hop: no need to scan the segment.
    whole = max_records is None
    buf = _map(segment.path, populate=whole)
    if buf is None:
        return start, 0, []
    try:
        size = len(buf)
        pos = start - segment.base
        limit = None if stop_at is None else stop_at - segment.base
        a = np.frombuffer(buf, np.uint8)
        starts = chain(a, pos) if whole and pos >= 0 else np.zeros(0, np.int64)
        if len(starts):
            chain_end = int(starts[-1]) + int(np.ndarray((size - 3,), ">u4", a, 0, (1,))[starts[-1] + 5])
        else:
            chain_end = pos
        del a  # the map can only close once no array views it
        return _hop(buf, segment.base, pos, starts, chain_end, max_records, split_bytes, limit)
    finally:
        buf.close()


def _hop(buf, base: int, pos: int, starts, chain_end: int, max_records: int | None, split_bytes: int | None,
         limit: int | None) -> tuple[int, int, list[int]]:
    """``hop_segment`` over the chained ``starts`` (ending at ``chain_end``), then header by header."""
    taken = starts
    if limit is not None:
        taken = taken[taken < limit]
    if max_records is not None:
        taken = taken[:max_records]
    n = len(taken)
    splits: list[int] = []
    last_split = pos
    if split_bytes is not None:
        while True:  # the first record at least split_bytes past the last split starts the next chunk
            k = int(np.searchsorted(taken, last_split + split_bytes))
            if k >= n:
                break
            last_split = int(taken[k])
            splits.append(base + last_split)
    if n < len(starts):  # stopped inside the chain by max_records or stop_at
        return base + int(starts[n]), n, splits
    if n:
        pos = chain_end
    size = len(buf)
    unpack = rec.HEADER.unpack_from
    lo, hi = rec.MIN_RECORD_SIZE, rec.MAX_RECORD_SIZE
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
            splits.append(base + pos)
            last_split = pos
        pos += total
        n += 1
    return base + pos, n, splits


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


def confirm_limit(directory: str) -> int | None:
    """The confirm offset of the broker whose commit log is ``directory`` (a record boundary), or None (no file)."""
    return ConfirmOffsetFile(os.path.dirname(os.path.normpath(directory))).read()


def _capped(end: int | None, limit: int | None) -> int | None:
    return end if limit is None else (limit if end is None else min(end, limit))


def physical_end(directory: str) -> int:
    """Offset just past the last byte written (not necessarily a record boundary), at most the confirm offset."""
    segments = reader.list_segments(directory)
    if not segments:
        return 0
    try:
        end = segments[-1].base + segments[-1].size
    except FileNotFoundError:
        end = segments[-1].base
    return _capped(end, confirm_limit(directory))


def last_segment_base(directory: str) -> int:
    """Base of the active (last) segment: a record boundary cheap to find."""
    segments = reader.list_segments(directory)
    return segments[-1].base if segments else 0


def latest_boundary(directory: str, start: int, max_records: int | None = None,
                    stop_at: int | None = None) -> tuple[int, int]:
    """The boundary just past the last complete record at or after boundary ``start``.

    Walks into later segments as the writer rolls. With ``max_records`` the hop
    stops after that many records; with ``stop_at`` before the first record
    that starts at or after that offset; never past the confirm offset. Returns ``(end, records)``.
    """
    stop_at = _capped(stop_at, confirm_limit(directory))
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


def _size(segment: reader.Segment) -> int:
    """The segment file's size now (0 if it is gone)."""
    try:
        return segment.size
    except FileNotFoundError:
        return 0


def _even(span: int, max_bytes: int) -> int:
    """The chunk size that cuts ``span`` bytes into the fewest chunks of at most ``max_bytes``, all about equal.

    Cutting 100 MiB at 64 MiB would leave 64 + 36: two tasks of unequal length,
    the longer one alone at the end; 50 + 50 finish together.
    """
    chunks = max(1, -(-span // max_bytes))
    return max(1, -(-span // chunks))


def plan_ranges(directory: str, start: int | None = None, end: int | None = None,
                max_bytes: int = 64 * 1024 * 1024) -> list[ScanRange]:
    """Split ``[start, end)`` of the log into scan ranges, one per segment or chunk.

    ``end=None`` snapshots the log: the last segment ends at its last complete
    record now, so every task reads the same records even while a broker appends.
    Segments bigger than ``max_bytes`` are split at record boundaries into
    chunks of about equal size. Nothing past the confirm offset is planned.
    """
    end = _capped(end, confirm_limit(directory))
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
            stop, _, splits = hop_segment(seg, seg_start, split_bytes=_even(_size(seg) - (seg_start - seg.base),
                                                                            max_bytes))
            if end is not None:
                stop = min(stop, end) if end >= seg_start else seg_start
                splits = [s for s in splits if s < stop]
        else:
            stop = nxt
            splits = []
            if nxt - seg_start > max_bytes:
                _, _, splits = hop_segment(seg, seg_start, split_bytes=_even(nxt - seg_start, max_bytes))
        bounds = [seg_start, *splits, stop]
        for a, b in zip(bounds, bounds[1:]):
            if b > a:
                ranges.append(ScanRange(len(ranges), seg.path, seg.base, a, b))
    return ranges
