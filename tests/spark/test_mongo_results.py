"""The device-stream jobs' result tables in MongoDB (a real wire-protocol server process): a rerun leaves the same documents."""

from datetime import timezone

import pytest

from spark.jobs import anomalies, silent, talkers, telemetry
from tests.spark.checks import argv as _argv
from tests.spark.helpers import parquet_rows

pytestmark = pytest.mark.slow

DB = "analytics"


@pytest.fixture(scope="module")
def mongo(tmp_path_factory):
    """One secantusd-py process for the module, killed and removed afterwards."""
    pytest.importorskip("pymongo", reason="pymongo is not installed (the 'mongodb' extra)")
    from tests.mongo_server import MongoServer

    server = MongoServer(str(tmp_path_factory.mktemp("mongo") / "db")).start()
    yield server
    server.remove()


def _documents(server, names):
    """Every document of the collections ``names``, sorted by _id, per collection."""
    client = server.client()
    try:
        db = client[DB]
        return {name: sorted(db[name].find(), key=repr) for name in names}
    finally:
        client.close()


def _run_all(spark, ground, out, uri):
    mongo = ["--mongo-uri", uri, "--mongo-db", DB]
    paths = {}
    paths.update(telemetry.main(_argv(ground, out / "t", *mongo), spark=spark))
    paths.update(anomalies.main(_argv(ground, out / "a", "--lookback", "20", "--min-points", "10",
                                      "--threshold", "4.0", *mongo), spark=spark))
    paths.update(silent.main(_argv(ground, out / "s", "--minutes", repr(ground["minutes"]), "--as-of",
                                   str(ground["as_of"]), *mongo), spark=spark))
    paths.update(talkers.main(_argv(ground, out / "k", "--top", "4", *mongo), spark=spark))
    return paths


def test_rerun_over_the_same_store_leaves_the_same_documents(spark, ground, mongo, tmp_path):
    """Each result table becomes a collection of its name, one document per row keyed by its natural key; a second
    run over the same store (same --as-of) leaves exactly the same documents."""
    paths = _run_all(spark, ground, tmp_path / "first", mongo.uri)
    names = sorted(paths)
    assert names == ["anomalies", "silent_devices", "telemetry_stats", "top_talkers", "topic_heat"]
    first = _documents(mongo, names)
    for name in names:
        rows = parquet_rows(spark, paths[name])
        assert len(first[name]) == len(rows) > 0, name
    assert [d["_id"] for d in first["silent_devices"]] == [{"device": ground["quiet"]}]
    # The documents hold the Parquet rows: times as UTC dates (ms), the key repeated in _id.
    rows = {(r["device"], r["metric"], r["window_start"]): r for r in parquet_rows(spark, paths["telemetry_stats"])}
    for doc in first["telemetry_stats"]:
        start = int(doc["window_start"].replace(tzinfo=timezone.utc).timestamp() * 1000)
        assert doc["_id"] == {"device": doc["device"], "metric": doc["metric"], "window_start": doc["window_start"]}
        row = rows.pop((doc["device"], doc["metric"], start))
        assert {k: doc[k] for k in ("count", "min", "max", "mean", "p95")} == \
            {k: row[k] for k in ("count", "min", "max", "mean", "p95")}
    assert not rows

    _run_all(spark, ground, tmp_path / "second", mongo.uri)
    assert _documents(mongo, names) == first
