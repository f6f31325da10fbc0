"""Each analysis job on the published data set, every reported number checked against plain-Python truth."""

import os
import re

import pytest

from spark.jobs import anomalies, report, silent, talkers, telemetry
from tests.spark import truth
from tests.spark.checks import argv as _argv
from tests.spark.checks import check_anomalies as _check_anomalies
from tests.spark.checks import check_heat as _check_heat
from tests.spark.checks import check_stats as _check_stats
from tests.spark.checks import check_talkers as _check_talkers
from tests.spark.helpers import parquet_rows

pytestmark = pytest.mark.slow

LOOKBACK, MIN_POINTS, THRESHOLD = 20, 10, 4.0
TOP = 4


def test_telemetry_window_statistics_match_truth(spark, ground, tmp_path):
    """count, rate, min, max, mean and exact p95 per device, metric and window equal the plain-Python figures."""
    out = telemetry.main(_argv(ground, tmp_path), spark=spark)
    expect = truth.window_stats(ground["meas"], ground["window_ms"])
    assert len(expect) > 20
    _check_stats(parquet_rows(spark, out["telemetry_stats"]), expect, ground["window_ms"])


def test_anomalies_list_the_spikes_with_their_z_scores(spark, ground, tmp_path):
    """Every point whose rolling z-score exceeds the threshold is listed, and only those."""
    out = anomalies.main(_argv(ground, tmp_path, "--lookback", str(LOOKBACK), "--min-points", str(MIN_POINTS),
                               "--threshold", str(THRESHOLD)), spark=spark)
    expect = truth.anomalies(ground["meas"], LOOKBACK, MIN_POINTS, THRESHOLD)
    assert {(d, m) for d, m, _ in expect} >= {("dev-01", "temp"), ("dev-03", "temp")}  # the planted spikes
    _check_anomalies(parquet_rows(spark, out["anomalies"]), expect)


def test_silent_devices_are_those_not_heard_from(spark, ground, tmp_path):
    """The device that stopped talking is reported with its last message time and message count."""
    out = silent.main(_argv(ground, tmp_path, "--minutes", repr(ground["minutes"]), "--as-of", str(ground["as_of"])),
                      spark=spark)
    expect = truth.silent(ground["rows"], ground["minutes"], ground["as_of"])
    assert list(expect) == [ground["quiet"]]
    got = parquet_rows(spark, out["silent_devices"])
    assert {r["device"]: (r["last_seen"], r["messages"]) for r in got} == expect
    assert [r["silent_for_s"] for r in got] == [(ground["as_of"] - ts) / 1000 for ts, _ in expect.values()]


def test_top_talkers_and_topic_heat(spark, ground, tmp_path):
    """Talkers are ranked by messages then bytes with the right shares; topic heat counts every window."""
    out = talkers.main(_argv(ground, tmp_path, "--top", str(TOP)), spark=spark)
    _check_talkers(sorted(parquet_rows(spark, out["top_talkers"]), key=lambda r: (-r["messages"], -r["bytes"], r["device"])),
                   truth.talkers(ground["rows"], TOP))
    _check_heat(parquet_rows(spark, out["topic_heat"]), truth.topic_heat(ground["rows"], ground["window_ms"]))


def test_report_writes_every_table_and_a_readable_html_page(spark, ground, tmp_path):
    """The report job's tables equal the truth, its summary counts unparsed payloads, and the page links its charts."""
    out = report.main(_argv(ground, tmp_path, "--minutes", repr(ground["minutes"]), "--as-of", str(ground["as_of"]),
                            "--top", str(TOP)), spark=spark)
    rows, meas = ground["rows"], ground["meas"]
    _check_stats(parquet_rows(spark, out["telemetry_stats"]), truth.window_stats(meas, ground["window_ms"]), ground["window_ms"])
    _check_anomalies(parquet_rows(spark, out["anomalies"]), truth.anomalies(meas, LOOKBACK, MIN_POINTS, THRESHOLD))
    _check_talkers(sorted(parquet_rows(spark, out["top_talkers"]), key=lambda r: (-r["messages"], -r["bytes"], r["device"])),
                   truth.talkers(rows, TOP))
    _check_heat(parquet_rows(spark, out["topic_heat"]), truth.topic_heat(rows, ground["window_ms"]))
    rates = {(r["device"], r["window_start"]): (r["messages"], r["rate_per_s"])
             for r in parquet_rows(spark, out["device_rates"])}
    assert rates == truth.device_rates(rows, ground["window_ms"])
    assert {r["device"] for r in parquet_rows(spark, out["silent_devices"])} == {ground["quiet"]}

    (summary,) = parquet_rows(spark, out["summary"])
    with_metrics = len({m["offset"] for m in meas})
    assert ground["unparsed"] == 3  # not JSON, not UTF-8, JSON but not an object
    assert (summary["messages_analysed"], summary["unparsed_payloads"], summary["messages_with_metrics"],
            summary["measurements"], summary["devices"], summary["corrupt_records_skipped"]) == (
        len(rows), ground["unparsed"], with_metrics, len(meas), len({truth.device_of(r) for r in rows}), 0)

    page = open(out["report"], encoding="utf-8").read()
    charts = re.findall(r"<img src='([^']+)'", page)
    assert {"rates.png", "top_talkers.png", "topic_heat.png", "metric_temp.png"} <= set(charts)
    for name in charts:
        with open(os.path.join(str(tmp_path), name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    n_anom = len(truth.anomalies(meas, LOOKBACK, MIN_POINTS, THRESHOLD))
    assert f"Anomalies ({n_anom})" in page and "Silent devices (1)" in page
