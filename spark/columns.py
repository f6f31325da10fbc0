"""Arrow record batches built in bulk from segment bytes: column buffers, not rows.

``batches.read_range`` decodes every record into a Python object and appends its
fields to lists, a few microseconds per row. Here no Python step runs per
record: the record starts are found with numpy (every place the header's
magic appears, kept only if they chain exactly: each start + its size is the
next), every CRC32C is checked by one ``crc32c`` call over the whole range
(``_crc_all_ok``), and every field is gathered for all records at once: fixed
fields by fancy indexing, variable ones (topic, client id, payload) by one Arrow
``take`` of the pieces of the segment bytes that hold them. ``record.py``
draws the layout. The one per-row Python step left is for property blocks that
hold more than the broker's ``QUEUES`` list (rare: MQTT 5 user properties,
expiry).

Anything unusual (a record that fails its CRC or its field lengths, a string
that is not UTF-8) makes ``read_range_bulk`` return None and the caller falls
back to the row path, which steps over corrupt records and counts them: the
bulk path is only ever an exact, faster copy of what the row path yields.
"""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np
import pyarrow as pa
from crc32c import crc32c
from numpy.lib.stride_tricks import as_strided

from store import record as rec

from spark.options import ScanOptions
from spark.segments import ScanRange

_HEADER = rec.HEADER
_FIXED_AT = rec.HEADER_SIZE  # kind, flags, store_ts, born_ts follow the header
_TOPIC_LEN_AT = _FIXED_AT + 18
_QUEUES_KEY = np.frombuffer(rec.QUEUES_PROPERTY.encode(), np.uint8)
_TS = pa.timestamp("us", tz="UTC")
_MARKER = np.frombuffer(bytes([rec.VERSION]) + rec.MAGIC.to_bytes(4, "big"), np.uint8)
_RARE_AT = 2  # the marker's byte 0x15: a control character, so text payloads seldom hold it
# The header, the fixed fields and the topic length: one gather of these 33 bytes per record gives them all.
_HEAD = np.dtype([("version", "u1"), ("magic", ">u4"), ("size", ">u4"), ("crc", ">u4"), ("kind", "u1"),
                  ("flags", "u1"), ("store_ts", ">u8"), ("born_ts", ">u8"), ("topic_len", ">u2")])
assert _HEAD.itemsize == _FIXED_AT + 18 + 2
_ALL_KINDS = np.array(sorted(int(k) for k in rec.RecordKind), np.int64)
_PAYLOAD = 4  # the payload's place among the columns
_PIECES = 6  # per record: topic, (client id length), client id, (property block), payload, (next header)
_MAX_RANGE = (1 << 31) - 8  # Arrow string/binary offsets are int32
_CRC_STATE_ZERO = 0xFFFF_FFFF  # crc32c's ``value`` that starts (and, as a result, means) a register of 0


def _windows(a: np.ndarray, width: int) -> np.ndarray:
    """``a`` seen as overlapping rows of ``width`` bytes, row i starting at byte i (no copy)."""
    return as_strided(a, (len(a) - width + 1, width), (1, 1), writeable=a.flags.writeable)


def _be(a: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The big-endian unsigned integers of ``width`` bytes at positions ``at`` of ``a``, as int64."""
    if len(at) == 0:
        return np.zeros(0, np.int64)
    # an integer starting at every byte (unaligned, stride 1): one plain gather, twice as fast as rows of bytes
    every = np.ndarray((len(a) - width + 1,), f">u{width}", a, 0, (1,))
    return every[at].astype(np.int64)


def _chain(a: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Record starts and sizes found without a Python step per record, or None.

    Every place where the header's version + magic appear is a candidate (found
    by one pass for the magic's byte 0x15, rare in text, then the other four
    bytes checked at those places only); if the candidates chain exactly (each
    start + its size is the next start, the last ends the buffer), they are the
    records. A payload that happens to hold the marker breaks the chain: the
    caller then hops header by header.
    """
    size = len(a)
    if size < rec.HEADER_SIZE:
        return None
    last = size - rec.HEADER_SIZE  # the last place a header fits
    starts = np.flatnonzero(a[_RARE_AT:last + _RARE_AT + 1] == _MARKER[_RARE_AT])
    for i, byte in enumerate(_MARKER):
        if i != _RARE_AT:
            starts = starts[a[starts + i] == byte]
    if len(starts) == 0 or starts[0] != 0:
        return None
    sizes = _be(a, starts + 5, 4)
    ends = starts + sizes
    if not np.array_equal(ends[:-1], starts[1:]) or ends[-1] != size:
        return None
    if (sizes < rec.MIN_RECORD_SIZE).any() or (sizes > rec.MAX_RECORD_SIZE).any():
        return None
    return starts, sizes


_SCRATCH_KEPT = 64 << 20
_scratch_kept = threading.local()  # one per thread: two readers in one process must not share it


def _scratch(size: int) -> np.ndarray:
    """A writable buffer of ``size`` bytes, reused from call to call (a Spark Python worker reads range after
    range: fresh memory would cost a page fault per 4 KiB each time); ranges above 64 MiB get their own."""
    if size > _SCRATCH_KEPT:
        return np.empty(size, np.uint8)
    kept = getattr(_scratch_kept, "buf", None)
    if kept is None or len(kept) < size:
        kept = _scratch_kept.buf = np.empty(max(size, 1 << 20), np.uint8)
    return kept[:size]


def _crc_all_ok(a: np.ndarray, starts: np.ndarray, sizes: np.ndarray, stored: np.ndarray) -> bool:
    """Every record's CRC32C matches its header, checked by one ``crc32c`` call over the whole range.

    CRC32C without its initial and final inversion (the "raw" CRC) is linear,
    and a message followed by its own raw CRC (little-endian) has a raw CRC of
    0; zero bytes in front change nothing. The stored CRC is the raw CRC of the
    record's covered bytes with their first 4 bytes inverted (that is what the
    initial value does), inverted. So in a copy of the range: zero each header,
    invert the first 4 covered bytes, and write each record's inverted stored
    CRC just after it (over the next, zeroed, header). Every record matches
    exactly when the raw CRC of the whole copy is 0: one wrong record always
    shows (a CRC shifted along is never 0), several cancel out only as rarely as
    a CRC32 collision, and then the per-record check would miss as often.
    """
    n = len(starts)
    c = _scratch(len(a) + 4)  # room for the last record's CRC
    c[:len(a)] = a
    _windows(c, rec.HEADER_SIZE)[starts] = 0
    first = _windows(c, 4)
    covered = starts + rec.HEADER_SIZE
    first[covered] ^= np.uint8(0xFF)
    first[starts + sizes] = (~stored).astype("<u4").view(np.uint8).reshape(n, 4)
    return crc32c(c, _CRC_STATE_ZERO) == _CRC_STATE_ZERO


def _hop(buf: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """Starts and sizes of the records in ``buf``, header by header; None if a header is not plausible."""
    starts: list[int] = []
    sizes: list[int] = []
    unpack = _HEADER.unpack_from
    version, magic = rec.VERSION, rec.MAGIC
    lo, hi = rec.MIN_RECORD_SIZE, rec.MAX_RECORD_SIZE
    hs = rec.HEADER_SIZE
    size = len(buf)
    pos = 0
    while pos + hs <= size:
        v, m, total, _crc = unpack(buf, pos)
        if v != version or m != magic or not lo <= total <= hi or pos + total > size:
            return None
        starts.append(pos)
        sizes.append(total)
        pos += total
    if pos != size:
        return None  # a partial record at the end of a range: the row path knows what to do
    return np.array(starts, np.int64), np.array(sizes, np.int64)


def _properties(a: np.ndarray, buf: bytes, pstart: np.ndarray, plen: np.ndarray) -> pa.Array | None:
    """The ``properties`` map column: empty for blocks holding nothing or only ``QUEUES``."""
    n = len(pstart)
    count = _be(a, pstart, 2) if n else np.zeros(0, np.int64)
    simple = count == 0
    one = np.nonzero(count == 1)[0]
    if len(one):
        klen = _be(a, pstart[one] + 2, 2)
        six = one[klen == len(_QUEUES_KEY)]
        if len(six):
            keys = a[(pstart[six] + 4)[:, None] + np.arange(len(_QUEUES_KEY))]
            simple[six[(keys == _QUEUES_KEY).all(axis=1)]] = True
    offsets = np.zeros(n + 1, np.int32)
    other = np.nonzero(~simple)[0]
    keys_out: list[str] = []
    values_out: list[str] = []
    if len(other):
        counts = np.zeros(n, np.int32)
        for i in other.tolist():
            s = int(pstart[i])
            try:
                props = rec.decode_properties(buf[s:s + int(plen[i])])
            except rec.CorruptRecord:
                return None
            kept = [(k, v) for k, v in props.items() if k != rec.QUEUES_PROPERTY]
            counts[i] = len(kept)
            for k, v in kept:
                keys_out.append(k)
                values_out.append(v)
        np.cumsum(counts, out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys_out, pa.string()),
                                   pa.array(values_out, pa.string()))


def read_range_bulk(part: ScanRange, opts: ScanOptions, schema: pa.Schema,
                    kind_names: dict[int, str]) -> Iterator[pa.RecordBatch] | None:
    """The batches ``batches.read_range`` would yield for ``part``, or None (use the row path)."""
    if part.end - part.start > _MAX_RANGE:
        return None
    try:
        with open(part.path, "rb") as f:
            f.seek(part.start - part.base)
            buf = f.read(part.end - part.start)
    except OSError:
        return None
    a = np.frombuffer(buf, np.uint8)
    found = _chain(a) or _hop(buf)
    if found is None:
        return None
    starts, sizes = found
    n = len(starts)
    if n == 0:
        return iter(())
    head = _windows(a, _HEAD.itemsize)[starts].view(_HEAD).ravel()
    if not _crc_all_ok(a, starts, sizes, head["crc"].astype(np.uint32)):
        return None
    ends = starts + sizes
    kind = head["kind"].astype(np.int64)
    flags = head["flags"]
    store_ts = head["store_ts"].astype(np.int64)
    keep = np.isin(kind, np.array(sorted(int(k) for k in opts.kinds), np.int64))
    if opts.start_ms is not None:
        keep &= store_ts >= opts.start_ms
    if opts.end_ms is not None:
        keep &= store_ts < opts.end_ms
    # Field positions of every record; a record whose fields do not end at its size is not clean.
    tpos = starts + _TOPIC_LEN_AT + 2
    cpos = tpos + head["topic_len"]
    if (cpos + 2 > ends).any():
        return None
    ppos = cpos + 2 + _be(a, cpos, 2)
    if (ppos + 4 > ends).any():
        return None
    plen = _be(a, ppos, 4)
    bpos = ppos + 4 + plen
    if (bpos + 4 > ends).any():
        return None
    if not np.array_equal(bpos + 4 + _be(a, bpos, 4), ends):
        return None
    if not np.isin(kind, _ALL_KINDS).all():
        return None
    # The segment bytes cut at every field boundary: piece 6i is record i's topic, 6i+2 its client id,
    # 6i+4 its payload (the pieces between are length fields, property blocks and headers).
    bounds = np.stack([tpos, cpos, cpos + 2, ppos, bpos + 4, ends], axis=1).astype(np.int32).ravel()
    pieces = pa.Array.from_buffers(pa.binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(buf)])
    sel = np.nonzero(keep)[0]
    try:
        topic = pieces.take(pa.array(sel * _PIECES)).view(pa.string())
        topic.validate(full=True)  # UTF-8
        matcher = opts.matcher()
        if matcher is not None:
            import pyarrow.compute as pc  # only a topic filter needs it here

            wanted = [t for t in pc.unique(topic).to_pylist() if matcher.matches(t)]
            mask = pc.is_in(topic, value_set=pa.array(wanted, pa.string())).to_numpy(zero_copy_only=False)
            sel = sel[mask]
            topic = topic.filter(pa.array(mask))
        client_id = pieces.take(pa.array(sel * _PIECES + 2)).view(pa.string())
        client_id.validate(full=True)
        props = _properties(a, buf, ppos[sel] + 4, plen[sel])
        if props is None:
            return None
        props.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowCapacityError, OverflowError):
        return None
    f = flags[sel]
    base = part.start
    columns = [
        topic,
        client_id,
        pa.array((f & 3).astype(np.int32), pa.int32()),
        pa.array((f & 4) != 0, pa.bool_()),
        None,  # payload: cut batch by batch
        pa.array(store_ts[sel] * 1000, pa.int64()).cast(_TS),
        pa.array(head["born_ts"][sel].astype(np.int64) * 1000, pa.int64()).cast(_TS),
        props,
        pa.array(starts[sel] + base, pa.int64()),
    ]
    if len(schema) > len(columns):
        names = np.array([kind_names.get(k, "") for k in range(max(kind_names) + 1)], dtype=object)
        columns.append(pa.array(names[kind[sel]], pa.string()))
    return _batches(columns, pieces, sel * _PIECES + 4, schema, max(1, opts.batch_rows))


def _batches(columns: list, pieces: pa.Array, payload_at: np.ndarray, schema: pa.Schema,
             size: int) -> Iterator[pa.RecordBatch]:
    """Record batches of ``size`` rows; each one's payloads (most of the bytes) are copied only when it is asked for.

    Everything that could fail was checked before, so nothing here can make the
    row path necessary half-way; and Spark converts one batch while the next is cut.
    """
    at = _PAYLOAD
    for i in range(0, len(payload_at), size):
        batch = [c.slice(i, size) if k != at else pieces.take(pa.array(payload_at[i:i + size]))
                 for k, c in enumerate(columns)]
        yield pa.RecordBatch.from_arrays(batch, schema=schema)
