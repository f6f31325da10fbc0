"""readStream over a live store: appended records appear exactly once, also across restarts from the checkpoint."""

import json
import os
import threading

import pytest

from store import record as rec
from tests.spark.dataset import T0, StoreWriter

pytestmark = pytest.mark.slow


def _items(n, start, tag):
    """``n`` MQTT publishes from ``start`` ms, plus a native record that must never become a row."""
    items = [(rec.Message(topic=f"devices/d{i % 3}/telemetry", body=b'{"temp": %d, "tag": "%s"}' % (i, tag.encode()),
                          client_id=f"d{i % 3}"), start + i) for i in range(n)]
    items.insert(n // 2, (rec.Message(topic="orders", body=b"native", kind=rec.RecordKind.NATIVE_MESSAGE), start + n // 2))
    return items


def _mqtt_offsets(published):
    return [p.offset for p in published if p.message.kind == rec.RecordKind.MQTT_PUBLISH]


def _sink_offsets(spark, sink):
    if not os.path.isdir(os.path.join(sink, "_spark_metadata")):
        return []
    return [r["offset"] for r in spark.read.parquet(sink).select("offset").collect()]


def _end_offset(progress) -> int:
    source = progress["sources"][0]
    end = source["endOffset"]
    return int((json.loads(end) if isinstance(end, str) else end)["offset"])


def _wait_caught_up(query, end, timeout=60.0):
    """Wait (bounded) until the query has committed everything in the log, which reaches commit-log offset ``end``."""
    waiter = threading.Thread(target=query.processAllAvailable, daemon=True)  # Spark's own wait, no polling
    waiter.start()
    waiter.join(timeout)
    if waiter.is_alive():
        query.stop()  # ends processAllAvailable too
        raise AssertionError(f"stream did not catch up in {timeout}s: {query.lastProgress}")
    if query.exception() is not None:
        raise AssertionError(f"stream failed: {query.exception()}")
    assert _end_offset(query.lastProgress) >= end, query.lastProgress


def _start(spark, data_dir, sink, checkpoint, trigger, columns=("offset", "topic", "payload", "store_ts"), **options):
    reader = spark.readStream.format("twistmq").option("path", data_dir)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = (reader.load().select(*columns).writeStream.format("parquet")
              .option("path", sink).option("checkpointLocation", checkpoint))
    return writer.trigger(**trigger).start()


def test_appended_records_appear_exactly_once_across_restarts(spark, tmp_path):
    """Records appended while a query runs, between runs, and across segment rolls each land in the sink once."""
    data_dir, sink, checkpoint = str(tmp_path / "data"), str(tmp_path / "sink"), str(tmp_path / "ckpt")
    writer = StoreWriter(data_dir, segment_bytes=4096)  # a live store: it holds the data dir lock throughout
    try:
        expected = _mqtt_offsets(writer.publish(_items(60, T0, "a")))

        # 1. first run, several micro-batches of at most 25 records
        q = _start(spark, data_dir, sink, checkpoint, {"availableNow": True}, maxRecordsPerTrigger="25")
        assert q.awaitTermination(90), "availableNow run did not finish"
        assert len([p for p in q.recentProgress if p["numInputRows"] > 0]) >= 3
        assert _sink_offsets(spark, sink) == expected or sorted(_sink_offsets(spark, sink)) == expected

        # 2. records appended while stopped: a restart from the checkpoint reads only them
        expected += _mqtt_offsets(writer.publish(_items(40, T0 + 1000, "b")))
        q = _start(spark, data_dir, sink, checkpoint, {"availableNow": True})
        assert q.awaitTermination(90), "availableNow restart did not finish"
        assert sorted(_sink_offsets(spark, sink)) == expected

        # 3. a running query: appends between its micro-batches
        q = _start(spark, data_dir, sink, checkpoint, {"processingTime": "200 milliseconds"})
        try:
            for k in range(2):
                expected += _mqtt_offsets(writer.publish(_items(15, T0 + 2000 + 100 * k, f"c{k}")))
                _wait_caught_up(q, writer.store.commit_log.max_offset)
        finally:
            q.stop()
        assert sorted(_sink_offsets(spark, sink)) == expected

        # 4. appended after the stop, read by another restart
        expected += _mqtt_offsets(writer.publish(_items(10, T0 + 3000, "d")))
        q = _start(spark, data_dir, sink, checkpoint, {"availableNow": True})
        assert q.awaitTermination(90), "final restart did not finish"
        got = _sink_offsets(spark, sink)
        assert len(got) == len(set(got)), "duplicates in the sink"
        assert sorted(got) == expected
        assert len(os.listdir(os.path.join(data_dir, "commitlog"))) > 4  # the stream crossed segment rolls
    finally:
        writer.close()


def test_starting_offsets_latest_skips_what_is_already_there(spark, tmp_path):
    """startingOffsets=latest starts at the end of the log: only later records are read."""
    data_dir, sink, checkpoint = str(tmp_path / "data"), str(tmp_path / "sink"), str(tmp_path / "ckpt")
    writer = StoreWriter(data_dir)
    try:
        writer.publish(_items(20, T0, "old"))
        q = _start(spark, data_dir, sink, checkpoint, {"availableNow": True}, startingOffsets="latest")
        assert q.awaitTermination(90)
        new = _mqtt_offsets(writer.publish(_items(7, T0 + 500, "new")))
        q = _start(spark, data_dir, sink, checkpoint, {"availableNow": True}, startingOffsets="latest")
        assert q.awaitTermination(90)
        assert sorted(_sink_offsets(spark, sink)) == new
    finally:
        writer.close()


def test_batch_only_option_is_refused_for_a_stream(spark, tmp_path):
    """output=stats describes a batch scan; a stream asked for it fails with a message naming the option."""
    StoreWriter(str(tmp_path / "data")).close()
    q = _start(spark, str(tmp_path / "data"), str(tmp_path / "sink"), str(tmp_path / "ckpt"), {"availableNow": True},
               columns=("records",), output="stats")
    with pytest.raises(Exception) as err:
        q.awaitTermination(60)
    q.stop()
    assert "output='stats'" in str(err.value)
