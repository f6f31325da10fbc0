"""The ``twistmq`` Spark data source: batch and streaming reads of a node's commit log.

Usage::

    from spark.datasource import TwistmqDataSource
    spark.dataSource.register(TwistmqDataSource)
    df = spark.read.format("twistmq").option("path", DATA_DIR).load()
    stream = spark.readStream.format("twistmq").option("path", DATA_DIR).load()

Segments are opened read-only with no lock and no RocksDB, so this works on a
live broker's directory; reads stop at the last complete record. Batch
partitions follow segments (big ones are split at record boundaries), rows come
as Arrow batches. A streaming offset is ``{"offset": N}``, a commit-log offset
that is always a record boundary, so a micro-batch replayed from the checkpoint
reads exactly the same records. Options are documented in ``spark.options``;
with ``broker`` a batch read goes through a node's native listener instead
(``spark.broker``).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    BinaryType, BooleanType, IntegerType, LongType, MapType, StringType, StructField, StructType,
    TimestampType,
)

from spark import batches, segments
from spark.options import OptionError, ScanOptions, parse_options

SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("client_id", StringType()),
    StructField("qos", IntegerType()),
    StructField("retain", BooleanType()),
    StructField("payload", BinaryType()),
    StructField("store_ts", TimestampType()),
    StructField("born_ts", TimestampType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("offset", LongType()),
])
SCHEMA_WITH_KIND = StructType([*SCHEMA.fields, StructField("kind", StringType())])
STATS_SCHEMA = StructType([
    StructField("partition", IntegerType()),
    StructField("segment", StringType()),
    StructField("start_offset", LongType()),
    StructField("end_offset", LongType()),
    StructField("records", LongType()),
    StructField("rows", LongType()),
    StructField("corrupt", LongType()),
    StructField("skipped_bytes", LongType()),
])


class TwistmqPartition(InputPartition):
    """One Spark partition: a ``ScanRange`` of a segment."""

    def __init__(self, scan_range: segments.ScanRange):
        super().__init__(scan_range)


class TwistmqDataSource(DataSource):
    """A twistmq store read straight from its commit-log segments."""

    @classmethod
    def name(cls) -> str:
        return "twistmq"

    def schema(self) -> StructType:
        # schema() serves read and readStream alike and cannot tell them apart:
        # reader() rejects the stream-only options.
        opts = parse_options(self.options, streaming=True)
        if opts.output == "stats":
            return STATS_SCHEMA
        return SCHEMA_WITH_KIND if opts.with_kind_column else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = parse_options(self.options)
        if opts.broker is not None:
            return TwistmqBrokerReader(opts)
        return TwistmqBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_options(self.options, streaming=True)
        if opts.output == "stats":
            raise OptionError("twistmq option output='stats' applies to batch reads only")
        if opts.broker is not None:
            raise OptionError("twistmq option 'broker' applies to batch reads only: stream with 'path'")
        return TwistmqStreamReader(opts)


class TwistmqBatchReader(DataSourceReader):
    """Reads a snapshot of the log: every complete record present at planning time."""

    def __init__(self, opts: ScanOptions):
        self.opts = opts

    def partitions(self) -> list[TwistmqPartition]:
        ranges = segments.plan_ranges(self.opts.commitlog_dir, max_bytes=self.opts.max_partition_bytes)
        return [TwistmqPartition(r) for r in ranges]

    def read(self, partition: TwistmqPartition | None):
        if partition is None or partition.value is None:  # Spark plans one empty partition when we planned none
            return iter(())
        if self.opts.output == "stats":
            return batches.read_stats(partition.value, self.opts)
        return batches.read_range(partition.value, self.opts)


class TwistmqBrokerReader(DataSourceReader):
    """Consumes a topic consume queue through a broker's native listener (one partition: the broker's cursor)."""

    def __init__(self, opts: ScanOptions):
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition):
        from spark.broker import read_broker

        return read_broker(self.opts)


class TwistmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """New records as they are appended; offsets are commit-log record boundaries."""

    def __init__(self, opts: ScanOptions):
        self.opts = opts
        self._target: int | None = None  # Trigger.AvailableNow: do not read past this

    def initialOffset(self) -> dict:
        directory = self.opts.commitlog_dir
        start = self.opts.starting_offsets
        if start == "earliest":
            return {"offset": segments.first_offset(directory)}
        if start == "latest":
            return {"offset": segments.latest_boundary(directory, segments.last_segment_base(directory))[0]}
        return {"offset": int(start)}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["offset"])
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end, count = segments.latest_boundary(self.opts.commitlog_dir, begin, max_records, self._target)
        if isinstance(limit, ReadMinRows) and count < limit.min_rows:
            return start
        return {"offset": end}

    def prepareForTriggerAvailableNow(self) -> None:
        # records starting before the bytes written now; later appends wait for the next run
        self._target = segments.physical_end(self.opts.commitlog_dir)

    def reportLatestOffset(self) -> dict | None:
        return {"offset": segments.physical_end(self.opts.commitlog_dir)}

    def partitions(self, start: dict, end: dict) -> list[TwistmqPartition]:
        lo, hi = int(start["offset"]), int(end["offset"])
        if hi <= lo:
            return []
        ranges = segments.plan_ranges(self.opts.commitlog_dir, lo, hi, self.opts.max_partition_bytes)
        return [TwistmqPartition(r) for r in ranges]

    def read(self, partition: TwistmqPartition | None):
        if partition is None or partition.value is None:
            return iter(())
        return batches.read_range(partition.value, self.opts)

    def commit(self, end: dict) -> None:
        """Nothing to release: the log is read-only to us and offsets live in Spark's checkpoint."""
