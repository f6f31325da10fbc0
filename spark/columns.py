"""Arrow record batches built in bulk from segment bytes: column buffers, not rows.

``batches.read_range`` decodes every record into a Python object and appends its
fields to lists, a few microseconds per row. Here the record starts are found
with numpy (every place the header's version + magic appear, kept only if they
chain exactly: each start + its size is the next), each CRC32C is checked in
one comprehension (``record.py`` draws the layout), and every field is then
gathered for all records at once: fixed fields
by fancy indexing, variable ones (topic, client id, payload) as Arrow offsets +
data buffers cut straight out of the segment bytes. The one per-row Python
step left is for property blocks that hold more than the broker's ``QUEUES``
list (rare: MQTT 5 user properties, expiry).

Anything unusual (a record that fails its CRC or its field lengths, a string
that is not UTF-8) makes ``read_range_bulk`` return None and the caller falls
back to the row path, which steps over corrupt records and counts them: the
bulk path is only ever an exact, faster copy of what the row path yields.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from crc32c import crc32c

from store import record as rec

from spark.options import ScanOptions
from spark.segments import ScanRange

_HEADER = rec.HEADER
_FIXED_AT = rec.HEADER_SIZE  # kind, flags, store_ts, born_ts follow the header
_TOPIC_LEN_AT = _FIXED_AT + 18
_MARKER = np.frombuffer(bytes([rec.VERSION]) + rec.MAGIC.to_bytes(4, "big"), np.uint8)
_QUEUES_KEY = np.frombuffer(rec.QUEUES_PROPERTY.encode(), np.uint8)
_TS = pa.timestamp("us", tz="UTC")


def _be(a: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The big-endian unsigned integers of ``width`` bytes at positions ``at`` of ``a``, as int64."""
    raw = a[at[:, None] + np.arange(width)]
    return raw.view(f">u{width}").ravel().astype(np.int64)


def _var(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A string/binary array whose i-th value is ``a[starts[i]:starts[i] + lengths[i]]``."""
    n = len(starts)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 1 << 31:
        raise OverflowError("column larger than 2 GiB")
    # byte i of the column comes from a[i + (start - offset) of its value]: one gather for the whole column
    idx = np.repeat(starts - offsets[:-1], lengths)
    idx += np.arange(total, dtype=np.int64)
    data = a[idx]
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)])


def _chain(a: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Record starts and sizes found without a Python step per record, or None.

    Every position where the header's version + magic appear is a candidate; if
    the candidates chain exactly (each start + its size is the next start, the
    last ends the buffer), they are the records. A payload that happens to hold
    the marker breaks the chain: the caller then hops header by header.
    """
    size = len(a)
    if size < rec.HEADER_SIZE:
        return None
    m = _MARKER
    hit = a[:size - rec.HEADER_SIZE + 1] == m[0]
    for i in range(1, len(m)):
        hit &= a[i:size - rec.HEADER_SIZE + 1 + i] == m[i]
    starts = np.nonzero(hit)[0].astype(np.int64)
    if len(starts) == 0 or starts[0] != 0:
        return None
    sizes = _be(a, starts + 5, 4)
    ends = starts + sizes
    if not np.array_equal(ends[:-1], starts[1:]) or ends[-1] != size:
        return None
    if (sizes < rec.MIN_RECORD_SIZE).any() or (sizes > rec.MAX_RECORD_SIZE).any():
        return None
    return starts, sizes


def _crc_ok(buf: bytes, a: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> bool:
    """Every record's CRC32C matches its header."""
    view = memoryview(buf)
    hs = rec.HEADER_SIZE
    got = np.fromiter((crc32c(view[s + hs:e]) for s, e in zip(starts.tolist(), (starts + sizes).tolist())),
                      np.int64, len(starts))
    return bool(np.array_equal(got, _be(a, starts + 9, 4)))


def _hop(buf: bytes, view: memoryview) -> tuple[list[int], list[int]] | None:
    """Starts and sizes of the records in ``buf``, header by header (CRC checked); None if any is not clean."""
    starts: list[int] = []
    sizes: list[int] = []
    unpack = _HEADER.unpack_from
    version, magic = rec.VERSION, rec.MAGIC
    lo, hi = rec.MIN_RECORD_SIZE, rec.MAX_RECORD_SIZE
    hs = rec.HEADER_SIZE
    size = len(buf)
    pos = 0
    while pos + hs <= size:
        v, m, total, crc = unpack(buf, pos)
        if v != version or m != magic or not lo <= total <= hi or pos + total > size \
                or crc32c(view[pos + hs:pos + total]) != crc:
            return None
        starts.append(pos)
        sizes.append(total)
        pos += total
    if pos != size:
        return None  # a partial record at the end of a range: the row path knows what to do
    return starts, sizes


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
                    kind_names: dict[int, str]) -> list[pa.RecordBatch] | None:
    """The batches ``batches.read_range`` would yield for ``part``, or None (use the row path)."""
    try:
        with open(part.path, "rb") as f:
            f.seek(part.start - part.base)
            buf = f.read(part.end - part.start)
    except OSError:
        return None
    a = np.frombuffer(buf, np.uint8)
    chained = _chain(a)
    if chained is not None and _crc_ok(buf, a, *chained):
        starts, sizes = chained
    else:
        hopped = _hop(buf, memoryview(buf))
        if hopped is None:
            return None
        starts = np.array(hopped[0], np.int64)
        sizes = np.array(hopped[1], np.int64)
    n = len(starts)
    if n == 0:
        return []
    kind = a[starts + _FIXED_AT].astype(np.int64)
    flags = a[starts + _FIXED_AT + 1]
    store_ts = _be(a, starts + _FIXED_AT + 2, 8)
    keep = np.isin(kind, np.array(sorted(int(k) for k in opts.kinds), np.int64))
    if opts.start_ms is not None:
        keep &= store_ts >= opts.start_ms
    if opts.end_ms is not None:
        keep &= store_ts < opts.end_ms
    # Field positions of every record; a record whose fields do not end at its size is not clean.
    tlen = _be(a, starts + _TOPIC_LEN_AT, 2)
    cpos = starts + _TOPIC_LEN_AT + 2 + tlen
    if (cpos + 2 > starts + sizes).any():
        return None
    clen = _be(a, cpos, 2)
    ppos = cpos + 2 + clen
    if (ppos + 4 > starts + sizes).any():
        return None
    plen = _be(a, ppos, 4)
    bpos = ppos + 4 + plen
    if (bpos + 4 > starts + sizes).any():
        return None
    blen = _be(a, bpos, 4)
    if not np.array_equal(bpos + 4 + blen, starts + sizes):
        return None
    if not (np.isin(kind, np.array([int(k) for k in rec.RecordKind], np.int64))).all():
        return None
    sel = np.nonzero(keep)[0]
    try:
        topic = _var(a, starts[sel] + _TOPIC_LEN_AT + 2, tlen[sel], pa.string())
        topic.validate(full=True)  # UTF-8
        matcher = opts.matcher()
        if matcher is not None:
            import pyarrow.compute as pc  # only a topic filter needs it (importing it costs ~70 ms per worker)

            wanted = [t for t in pc.unique(topic).to_pylist() if matcher.matches(t)]
            mask = pc.is_in(topic, value_set=pa.array(wanted, pa.string())).to_numpy(zero_copy_only=False)
            sel = sel[mask]
            topic = topic.filter(pa.array(mask))
        client_id = _var(a, cpos[sel] + 2, clen[sel], pa.string())
        client_id.validate(full=True)
        payload = _var(a, bpos[sel] + 4, blen[sel], pa.binary())
        props = _properties(a, buf, ppos[sel] + 4, plen[sel])
        if props is None:
            return None
        props.validate(full=True)
    except (pa.ArrowInvalid, OverflowError):
        return None
    f = flags[sel]
    base = part.start
    columns = [
        topic,
        client_id,
        pa.array((f & 3).astype(np.int32), pa.int32()),
        pa.array((f & 4) != 0, pa.bool_()),
        payload,
        pa.array(store_ts[sel] * 1000, pa.int64()).cast(_TS),
        pa.array(_be(a, starts[sel] + _FIXED_AT + 10, 8) * 1000, pa.int64()).cast(_TS),
        props,
        pa.array(starts[sel] + base, pa.int64()),
    ]
    if len(schema) > len(columns):
        names = np.array([kind_names.get(k, "") for k in range(max(kind_names) + 1)], dtype=object)
        columns.append(pa.array(names[kind[sel]], pa.string()))
    whole = pa.RecordBatch.from_arrays(columns, schema=schema)
    size = max(1, opts.batch_rows)
    return [whole.slice(i, size) for i in range(0, whole.num_rows, size)]
