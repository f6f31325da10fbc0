"""Turn commit-log records into Arrow record batches with the data source's columns.

``read_range`` is what a Spark task runs: it walks one scan range with the
store's read-only reader, keeps the records the options select, and yields
``pyarrow.RecordBatch``es whose schema is exactly what Spark expects for
``SCHEMA`` (so Spark takes them as they are, with no per-row conversion).
"""

from __future__ import annotations

import sys
from typing import Iterator

import pyarrow as pa

from store import reader
from store import record as rec

from spark.columns import read_range_bulk
from spark.options import KIND_NAMES as OPTION_KINDS
from spark.options import ScanOptions
from spark.segments import ScanRange

COLUMNS = ("topic", "client_id", "qos", "retain", "payload", "store_ts", "born_ts", "properties", "offset")
KIND_NAMES = {int(kind): name for name, kind in OPTION_KINDS.items()}

_TS = pa.timestamp("us", tz="UTC")
ARROW_FIELDS = [
    pa.field("topic", pa.string()),
    pa.field("client_id", pa.string()),
    pa.field("qos", pa.int32()),
    pa.field("retain", pa.bool_()),
    pa.field("payload", pa.binary()),
    pa.field("store_ts", _TS),
    pa.field("born_ts", _TS),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("offset", pa.int64()),
]
ARROW_SCHEMA = pa.schema(ARROW_FIELDS)
ARROW_SCHEMA_WITH_KIND = pa.schema([*ARROW_FIELDS, pa.field("kind", pa.string())])

STATS_ARROW_SCHEMA = pa.schema([
    pa.field("partition", pa.int32()),
    pa.field("segment", pa.string()),
    pa.field("start_offset", pa.int64()),
    pa.field("end_offset", pa.int64()),
    pa.field("records", pa.int64()),
    pa.field("rows", pa.int64()),
    pa.field("corrupt", pa.int64()),
    pa.field("skipped_bytes", pa.int64()),
])


def user_properties(props) -> list[tuple[str, str]]:
    """The record's properties minus the broker's internal dispatch list."""
    return [(k, v) for k, v in props.items() if k != rec.QUEUES_PROPERTY]


class _Columns:
    """Column lists being filled for one batch."""

    def __init__(self, with_kind: bool):
        self.with_kind = with_kind
        self.clear()

    def clear(self) -> None:
        self.topic, self.client_id, self.qos, self.retain, self.payload = [], [], [], [], []
        self.store_ts, self.born_ts, self.properties, self.offset, self.kind = [], [], [], [], []

    def __len__(self) -> int:
        return len(self.offset)

    def add(self, r: rec.Record) -> None:
        self.topic.append(r.topic)
        self.client_id.append(r.client_id)
        self.qos.append(r.qos)
        self.retain.append(r.retain)
        self.payload.append(r.body)
        self.store_ts.append(r.store_ts * 1000)
        self.born_ts.append(r.born_ts * 1000)
        self.properties.append(user_properties(r.properties) if r.properties else [])
        self.offset.append(r.offset)
        if self.with_kind:
            self.kind.append(KIND_NAMES[int(r.kind)])

    def batch(self) -> pa.RecordBatch:
        arrays = [
            pa.array(self.topic, pa.string()),
            pa.array(self.client_id, pa.string()),
            pa.array(self.qos, pa.int32()),
            pa.array(self.retain, pa.bool_()),
            pa.array(self.payload, pa.binary()),
            pa.array(self.store_ts, pa.int64()).cast(_TS),
            pa.array(self.born_ts, pa.int64()).cast(_TS),
            pa.array(self.properties, pa.map_(pa.string(), pa.string())),
            pa.array(self.offset, pa.int64()),
        ]
        schema = ARROW_SCHEMA
        if self.with_kind:
            arrays.append(pa.array(self.kind, pa.string()))
            schema = ARROW_SCHEMA_WITH_KIND
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        self.clear()
        return batch


def scan(part: ScanRange, opts: ScanOptions, stats: reader.ScanStats) -> Iterator[rec.Record]:
    """The records of ``part`` that the options select (corrupt ones skipped, counted in ``stats``)."""
    matcher = opts.matcher()
    kinds = opts.kinds
    lo, hi = opts.start_ms, opts.end_ms
    segment = reader.Segment(part.base, part.path)
    for r in reader.scan_segment(segment, part.start, part.end, skip_corrupt=True, stats=stats):
        if r.kind not in kinds:
            continue
        if lo is not None and r.store_ts < lo:
            continue
        if hi is not None and r.store_ts >= hi:
            continue
        if matcher is not None and not matcher.matches(r.topic):
            continue
        yield r


def read_range(part: ScanRange, opts: ScanOptions) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the selected records of one scan range (in bulk when the range is clean)."""
    bulk = read_range_bulk(part, opts, ARROW_SCHEMA_WITH_KIND if opts.with_kind_column else ARROW_SCHEMA,
                           KIND_NAMES)
    if bulk is not None:
        yield from bulk
        return
    stats = reader.ScanStats()
    cols = _Columns(opts.with_kind_column)
    size = opts.batch_rows
    for r in scan(part, opts, stats):
        cols.add(r)
        if len(cols) >= size:
            yield cols.batch()
    if len(cols):
        yield cols.batch()
    report_corrupt(part, stats)


def read_stats(part: ScanRange, opts: ScanOptions) -> Iterator[pa.RecordBatch]:
    """One row describing what reading ``part`` saw: records, rows kept, corrupt skipped."""
    stats = reader.ScanStats()
    rows = sum(1 for _ in scan(part, opts, stats))
    yield pa.RecordBatch.from_pylist([{
        "partition": part.index, "segment": part.path, "start_offset": part.start,
        "end_offset": part.end, "records": stats.records, "rows": rows,
        "corrupt": stats.corrupt, "skipped_bytes": stats.skipped_bytes,
    }], schema=STATS_ARROW_SCHEMA)
    report_corrupt(part, stats)


def report_corrupt(part: ScanRange, stats: reader.ScanStats) -> None:
    """Tell the task's stderr (the executor log) about corrupt records stepped over."""
    if stats.corrupt:
        print(f"twistmq_corrupt_skipped segment={part.path} range={part.start}-{part.end} "
              f"corrupt={stats.corrupt} skipped_bytes={stats.skipped_bytes}", file=sys.stderr, flush=True)
