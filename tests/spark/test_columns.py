"""Unit tests of the bulk Arrow path (spark/columns.py): the same rows as the row path, or a fallback (no Spark)."""

import os

import numpy as np
import pyarrow as pa
import pytest
from crc32c import crc32c

from store import reader
from store import record as rec

from spark import batches, columns, segments
from spark.options import ScanOptions
from tests.spark.dataset import publish_dataset

KINDS = (rec.RecordKind.MQTT_PUBLISH, rec.RecordKind.NATIVE_MESSAGE)


def _items(n):
    """A mix of kinds, QoS, retain, empty and non-UTF-8 payloads, user properties and expiry, on several topics."""
    out = []
    for i in range(n):
        props = {"unit": f"c{i}", rec.EXPIRES_AT: "99"} if i % 5 == 0 else {}
        body = bytes([0xff, i % 256]) if i % 9 == 0 else ("é%d" % i).encode() * (i % 4)
        out.append((rec.Message(topic=f"dev/{i % 7}/t", body=body, kind=KINDS[i % 6 == 0], qos=i % 3,
                                retain=i % 4 == 0, client_id="" if i % 8 == 0 else f"c{i % 3}", born_ts=500 + i,
                                properties=props), 1_000 + i // 10))
    return out


def _row_path(part, opts):
    schema = batches.ARROW_SCHEMA_WITH_KIND if opts.with_kind_column else batches.ARROW_SCHEMA
    cols = batches._Columns(opts.with_kind_column)
    for r in batches.scan(part, opts, reader.ScanStats()):
        cols.add(r)
    return pa.Table.from_batches([cols.batch()] if len(cols) else [], schema=schema)


def _bulk(part, opts):
    schema = batches.ARROW_SCHEMA_WITH_KIND if opts.with_kind_column else batches.ARROW_SCHEMA
    out = columns.read_range_bulk(part, opts, schema, batches.KIND_NAMES)
    return None if out is None else pa.Table.from_batches(out, schema=schema)


@pytest.mark.parametrize("options", [
    {},
    {"kinds": frozenset({1, 2}), "with_kind_column": True},
    {"topic_filter": "dev/3/#"},
    {"start_ms": 1_010, "end_ms": 1_030},
    {"batch_rows": 7},
])
def test_bulk_rows_equal_the_row_path(tmp_path, options):
    """Every scan range gives exactly the row path's rows, values and order, under each option."""
    publish_dataset(str(tmp_path), _items(400), segment_bytes=6000)
    directory = os.path.join(str(tmp_path), "commitlog")
    opts = ScanOptions(directory, **options)
    ranges = segments.plan_ranges(directory, max_bytes=2500)
    assert len(ranges) > 4
    total = 0
    for part in ranges:
        bulk = _bulk(part, opts)
        assert bulk is not None, part
        assert bulk.to_pylist() == _row_path(part, opts).to_pylist()
        total += bulk.num_rows
    assert total > 0
    if "batch_rows" in options:
        out = columns.read_range_bulk(ranges[0], opts, batches.ARROW_SCHEMA, batches.KIND_NAMES)
        assert max(b.num_rows for b in out) == 7


def test_corrupt_range_falls_back_to_the_row_path(tmp_path):
    """A record with a bad CRC makes the bulk path decline; read_range then skips just that record."""
    pub = publish_dataset(str(tmp_path), _items(30))
    directory = os.path.join(str(tmp_path), "commitlog")
    seg = reader.list_segments(directory)[0]
    with open(seg.path, "r+b") as f:
        f.seek(pub[4].offset + rec.HEADER_SIZE + 20)
        f.write(b"\x00\x01\x02")  # inside record 4: its CRC no longer matches
    (part,) = segments.plan_ranges(directory)
    opts = ScanOptions(directory, kinds=frozenset({1, 2}), with_kind_column=True)
    assert _bulk(part, opts) is None
    rows = pa.Table.from_batches(list(batches.read_range(part, opts))).to_pylist()
    assert [r["offset"] for r in rows] == [p.offset for i, p in enumerate(pub) if i != 4]


def test_payload_holding_the_record_marker_still_reads(tmp_path):
    """A payload containing the header's version + magic bytes breaks the fast chain, not the result."""
    marker = bytes([rec.VERSION]) + rec.MAGIC.to_bytes(4, "big")
    items = [(rec.Message(topic="m", body=b"a" + marker * 3 + b"z", client_id="c"), 1_000 + i) for i in range(5)]
    pub = publish_dataset(str(tmp_path), items)
    directory = os.path.join(str(tmp_path), "commitlog")
    (part,) = segments.plan_ranges(directory)
    table = _bulk(part, ScanOptions(directory))
    assert table is not None
    assert table.column("offset").to_pylist() == [p.offset for p in pub]
    assert table.column("payload").to_pylist() == [b"a" + marker * 3 + b"z"] * 5


def _clean_range(tmp_path, n=40):
    """A published range's bytes as a numpy array, with its record starts and sizes."""
    publish_dataset(str(tmp_path), _items(n))
    directory = os.path.join(str(tmp_path), "commitlog")
    (part,) = segments.plan_ranges(directory)
    with open(part.path, "rb") as f:
        buf = f.read(part.end - part.start)
    starts, sizes = columns._chain(np.frombuffer(buf, np.uint8))
    return bytearray(buf), starts, sizes


def _stored(buf, starts):
    """The CRC32C each record's header holds."""
    return np.array([int.from_bytes(buf[s + 9:s + 13], "big") for s in starts.tolist()], np.uint32)


def test_whole_range_crc_accepts_a_clean_range(tmp_path):
    """One crc32c over the rearranged range says yes when every record's own CRC32C matches."""
    buf, starts, sizes = _clean_range(tmp_path)
    view = memoryview(buf)
    assert all(crc32c(view[s + rec.HEADER_SIZE:s + z]) == int.from_bytes(buf[s + 9:s + 13], "big")
               for s, z in zip(starts.tolist(), sizes.tolist()))
    assert columns._crc_all_ok(np.frombuffer(bytes(buf), np.uint8), starts, sizes, _stored(buf, starts))


@pytest.mark.parametrize("where", ["first covered byte", "fourth covered byte", "last byte", "stored crc",
                                   "two records"])
@pytest.mark.parametrize("record", [0, 17, -1])
def test_whole_range_crc_rejects_any_corrupt_record(tmp_path, where, record):
    """A flipped bit in any record (its first bytes, its last, its stored CRC, or in two records) is caught."""
    buf, starts, sizes = _clean_range(tmp_path)
    s, z = int(starts[record]), int(sizes[record])
    at = {"first covered byte": s + rec.HEADER_SIZE, "fourth covered byte": s + rec.HEADER_SIZE + 3,
          "last byte": s + z - 1, "stored crc": s + 10, "two records": s + z - 1}[where]
    buf[at] ^= 0x10
    if where == "two records":
        other = int(starts[(record + 5) % len(starts)])
        buf[other + rec.HEADER_SIZE + 7] ^= 0x01
    assert not columns._crc_all_ok(np.frombuffer(bytes(buf), np.uint8), starts, sizes, _stored(buf, starts))


def test_corrupt_record_behind_a_marker_payload_falls_back(tmp_path):
    """When the payload breaks the fast chain, the header hop's records are still CRC-checked."""
    marker = bytes([rec.VERSION]) + rec.MAGIC.to_bytes(4, "big")
    items = [(rec.Message(topic="m", body=b"a" + marker + b"z" * 20, client_id="c"), 1_000 + i) for i in range(5)]
    pub = publish_dataset(str(tmp_path), items)
    directory = os.path.join(str(tmp_path), "commitlog")
    seg = reader.list_segments(directory)[0]
    with open(seg.path, "r+b") as f:
        f.seek(pub[3].offset - 3)  # inside record 2's payload, after the marker
        f.write(b"!")
    (part,) = segments.plan_ranges(directory)
    assert _bulk(part, ScanOptions(directory)) is None
    rows = pa.Table.from_batches(list(batches.read_range(part, ScanOptions(directory)))).to_pylist()
    assert [r["offset"] for r in rows] == [p.offset for i, p in enumerate(pub) if i != 2]
