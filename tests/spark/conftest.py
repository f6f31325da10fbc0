"""One SparkSession (local[2], loopback only, no UI) shared by every Spark test."""

import os
import sys

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    """The shared SparkSession with the twistmq data source registered."""
    pytest.importorskip("pyspark", reason="pyspark[sql] is not installed (the 'spark' extra)")
    from pyspark.sql import SparkSession

    from spark.datasource import TwistmqDataSource

    session = (
        SparkSession.builder.master("local[2]")
        .appName("twistmq-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.schemaInference", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(TwistmqDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def published(tmp_path_factory):
    """The known telemetry data set in a node's data dir: (data_dir, [Published], how).

    Published through a real node over MQTT (paho) when this checkout has the
    node role, else written by the real store; ``TWISTMQ_SPARK_DATASET=store``
    forces the store. Several segments either way.
    """
    from tests.spark.dataset import node_available, publish_dataset, publish_through_node, telemetry

    data_dir = str(tmp_path_factory.mktemp("published") / "data")
    use_node = node_available() and os.environ.get("TWISTMQ_SPARK_DATASET", "") != "store"
    if use_node:
        return data_dir, publish_through_node(data_dir, telemetry(), segment_bytes=40_000), "node"
    return data_dir, publish_dataset(data_dir, telemetry(), segment_bytes=40_000), "store"


# the store writes the data set's own times (12 minutes); a node stamps its own (a few seconds)
WINDOWS = {"store": ("1 minute", 60_000), "node": ("250 milliseconds", 250)}


@pytest.fixture(scope="session")
def ground(published):
    """The rows the jobs see and their measurements, computed without Spark."""
    from tests.spark import truth

    data_dir, pub, how = published
    rows = truth.rows(pub, topic_filter="devices/#")
    meas, unparsed = truth.measurements(rows)
    last = {}
    for r in rows:
        last[truth.device_of(r)] = max(last.get(truth.device_of(r), 0), r["store_ts"])
    quiet = min(last, key=last.get)  # the device that went silent
    as_of = max(last.values()) + 1
    minutes = (as_of - last[quiet]) / 2 / 60_000  # between its silence and everyone else's
    window, window_ms = WINDOWS[how]
    return {"window": window, "window_ms": window_ms, "data_dir": data_dir, "rows": rows, "meas": meas,
            "unparsed": unparsed, "quiet": quiet, "as_of": as_of, "minutes": minutes, "how": how}
