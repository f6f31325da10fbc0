"""The ``broker`` option: reading a topic consume queue through a running node's native listener."""

import os

import pytest

from store import reader
from store import record as rec
from tests.spark.dataset import Node, mqtt_publish, node_available, telemetry

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not node_available(), reason="no node role (cluster/roles/node.py) in this checkout")]


def _broker_read(spark, node, **options):
    r = spark.read.format("twistmq").option("broker", f"127.0.0.1:{node.native_port}").option("topic", "devices")
    for key, value in options.items():
        r = r.option(key, value)
    # one action only, no sort: each run of the read consumes (a sort samples its input first)
    rows = [row.asDict() for row in r.load().select("offset", "topic", "client_id", "qos", "payload").collect()]
    for row in rows:
        row["payload"] = bytes(row["payload"])
    return sorted(rows, key=lambda row: row["offset"])


def test_broker_option_consumes_the_topic_queue_once_per_group(spark, tmp_path):
    """Every publish under devices/ comes back once per consumer group, in log order, as the files hold it."""
    data_dir = str(tmp_path / "data")
    items = [(m, ts) for m, ts in telemetry(devices=4, minutes=2, per_minute=10, extras=False)]
    node = Node(data_dir, native=True).start()
    try:
        mqtt_publish(node.port, items)
        stored = [r for r in reader.iter_records(os.path.join(data_dir, "commitlog"))
                  if r.kind == rec.RecordKind.MQTT_PUBLISH and r.topic.startswith("devices/")]
        assert len(stored) == len(items)

        got = _broker_read(spark, node, group="g1")
        assert [(r["offset"], r["topic"], r["client_id"], r["qos"], r["payload"]) for r in got] == \
            [(r.offset, r.topic, r.client_id, r.qos, r.body) for r in stored]
        assert _broker_read(spark, node, group="g1") == []  # the broker kept g1's offset

        first = _broker_read(spark, node, group="g2", maxRecords="7", topicFilter="devices/dev-01/#")
        assert [r["offset"] for r in first] == [r.offset for r in stored[:7] if r.topic.startswith("devices/dev-01/")]
    finally:
        node.stop()


def test_broker_option_names_what_is_wrong(spark, tmp_path):
    """An unreachable broker fails the read naming it; bad option combinations are refused naming the option."""
    from spark.options import OptionError, parse_options

    port = "127.0.0.1:1"
    for options, named in [({"broker": port}, "topic"), ({"broker": "nohostport", "topic": "d"}, "broker"),
                           ({"broker": port, "topic": "d", "startTime": "0"}, "startTime"),
                           ({"path": str(tmp_path), "broker": port, "topic": "d"}, "exclude each other"),
                           ({"path": str(tmp_path), "group": "g"}, "group")]:
        with pytest.raises(OptionError, match=named):
            parse_options(options)
    with pytest.raises(Exception, match=f"twistmq broker {port}: cannot connect"):
        spark.read.format("twistmq").option("broker", port).option("topic", "devices").load().collect()
