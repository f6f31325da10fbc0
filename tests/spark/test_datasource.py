"""The twistmq batch data source against ground truth computed in plain Python."""

import os

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql.utils import AnalysisException

from store import reader
from store import record as rec

from spark import batches
from spark.datasource import SCHEMA
from spark.options import parse_options
from spark.segments import plan_ranges
from tests.spark import truth
from tests.spark.dataset import MINUTE, T0, publish_dataset, telemetry
from tests.spark.helpers import collect_rows, read

pytestmark = pytest.mark.slow

COLUMNS = ["topic", "client_id", "qos", "retain", "payload", "store_ts", "born_ts", "properties", "offset"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The telemetry data set spread over several dense segments."""
    data_dir = str(tmp_path_factory.mktemp("store"))
    return data_dir, publish_dataset(data_dir, telemetry(), segment_bytes=40_000)


def _expected(published, **kw):
    return [{k: r[k] for k in COLUMNS} for r in truth.rows(published, **kw)]


def test_reads_every_publish_with_the_documented_columns(spark, store):
    """Default read: MQTT publishes only, the exact column list and types, every value as stored."""
    data_dir, published = store
    df = read(spark, data_dir)
    assert df.columns == COLUMNS
    assert df.schema == SCHEMA
    assert collect_rows(df) == _expected(published)
    assert not any(r["properties"].get(rec.QUEUES_PROPERTY) for r in collect_rows(df.limit(5)))


def test_partitions_follow_segments_and_split_big_ones(spark, store):
    """One partition per segment by default; maxPartitionBytes splits them, with no row lost or repeated."""
    data_dir, published = store
    n_segments = len(reader.list_segments(os.path.join(data_dir, "commitlog")))
    assert n_segments >= 4
    assert read(spark, data_dir).rdd.getNumPartitions() == n_segments
    split = read(spark, data_dir, maxPartitionBytes=8_000)
    assert split.rdd.getNumPartitions() > 2 * n_segments
    assert [r["offset"] for r in collect_rows(split.select("offset"))] == [p["offset"] for p in _expected(published)]


def test_read_yields_arrow_batches_matching_spark_schema(store):
    """A partition is read as pyarrow RecordBatches whose schema is what Spark expects."""
    from pyspark.sql.pandas.types import to_arrow_schema

    data_dir, _ = store
    opts = parse_options({"path": data_dir, "batchRows": "100"})
    out = list(batches.read_range(plan_ranges(opts.commitlog_dir)[0], opts))
    assert out and all(isinstance(b, pa.RecordBatch) for b in out)
    assert all(b.schema.equals(to_arrow_schema(SCHEMA, timezone="UTC")) for b in out)
    assert max(b.num_rows for b in out) == 100


@pytest.mark.parametrize("topic_filter", ["devices/+/status", "devices/dev-01/#", "#", "$SYS/#", "nomatch/+"])
def test_topic_filter_option(spark, store, topic_filter):
    """topicFilter keeps exactly the topics MQTT matching selects."""
    data_dir, published = store
    got = collect_rows(read(spark, data_dir, topicFilter=topic_filter).select("offset"))
    assert [r["offset"] for r in got] == [r["offset"] for r in _expected(published, topic_filter=topic_filter)]


def test_time_range_options(spark, store):
    """startTime (inclusive) and endTime (exclusive) select on store_ts, as ISO-8601 or epoch ms."""
    data_dir, published = store
    start, end = T0 + 3 * MINUTE + 17, T0 + 7 * MINUTE
    got = read(spark, data_dir, startTime=str(start), endTime="2024-06-01T12:07:00Z")
    expect = _expected(published, start_ms=start, end_ms=end)
    assert len(expect) > 100
    assert [r["offset"] for r in collect_rows(got.select("offset"))] == [r["offset"] for r in expect]


def test_kinds_all_adds_a_kind_column(spark, store):
    """kinds=all returns native and system records too, labelled in a kind column."""
    data_dir, published = store
    got = collect_rows(read(spark, data_dir, kinds="all").select("offset", "kind", "topic"))
    expect = truth.rows(published, kinds=tuple(rec.RecordKind))
    assert [(r["offset"], r["kind"], r["topic"]) for r in got] == [(r["offset"], r["kind"], r["topic"]) for r in expect]
    assert {"native", "mqtt"} <= {r["kind"] for r in got}


def test_corrupt_record_is_skipped_and_counted(spark, tmp_path):
    """A record with a bad CRC is skipped, the rest is read, and the stats output counts it."""
    items = telemetry(minutes=2)
    published = publish_dataset(str(tmp_path), items)
    victim = published[40]
    path = os.path.join(str(tmp_path), "commitlog", "00000000000000000000")
    with open(path, "r+b") as f:
        f.seek(victim.offset + rec.HEADER_SIZE + 30)
        f.write(b"\x00\x01\x02")
    got = [r["offset"] for r in collect_rows(read(spark, str(tmp_path)).select("offset"))]
    assert got == [r["offset"] for r in _expected(published) if r["offset"] != victim.offset]
    stats = read(spark, str(tmp_path), output="stats").collect()
    assert sum(s["corrupt"] for s in stats) == 1
    assert sum(s["records"] for s in stats) == len(published) - 1


def test_torn_tail_is_not_read(spark, tmp_path):
    """Bytes of a record that is still being written are not returned (last complete record wins)."""
    published = publish_dataset(str(tmp_path), telemetry(minutes=1))
    tail = rec.encode(rec.Message(topic="devices/x/telemetry", body=b'{"temp": 1}'), T0)
    with open(os.path.join(str(tmp_path), "commitlog", "00000000000000000000"), "ab") as f:
        f.write(tail[:-4])
    assert read(spark, str(tmp_path)).count() == len(_expected(published))


def test_empty_store_reads_no_rows(spark, tmp_path):
    """A data dir whose commit log has no segment yet gives an empty frame with the schema."""
    os.makedirs(os.path.join(str(tmp_path), "commitlog"))
    df = read(spark, str(tmp_path))
    assert df.schema == SCHEMA and df.count() == 0


@pytest.mark.parametrize("options,named", [
    ({"path": "/nonexistent/twistmq-data"}, "/nonexistent/twistmq-data"),
    ({"topicFiltre": "a/#"}, "topicfiltre"),
    ({"topicFilter": "a/#/b"}, "topicFilter"),
    ({"startTime": "yesterday"}, "startTime"),
    ({"kinds": "mqtt,bogus"}, "kinds"),
    ({"maxPartitionBytes": "-5"}, "maxPartitionBytes"),
    ({"startingOffsets": "earliest"}, "startingOffsets"),
])
def test_bad_path_or_option_gets_a_clear_error(spark, store, options, named):
    """A wrong path or option fails at load time with a message naming it."""
    data_dir, _ = store
    options = {"path": data_dir, **options}
    with pytest.raises((PySparkException, AnalysisException)) as err:
        read(spark, **options).count()
    assert named in str(err.value)


def test_data_dir_without_commitlog_is_named(spark, tmp_path):
    """A directory that is not a node's data dir is rejected, naming it."""
    with pytest.raises((PySparkException, AnalysisException)) as err:
        read(spark, str(tmp_path)).count()
    assert str(tmp_path) in str(err.value) and "commitlog" in str(err.value)
