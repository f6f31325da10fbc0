"""Comparisons of a job's Parquet rows with the plain-Python truth, shared by the local and cluster tests."""

import math


def argv(ground, out, *extra):
    """A job's command line for the published data set (its window, devices/# only, quiet)."""
    return ["--data-dir", ground["data_dir"], "--out", str(out), "--window", ground["window"],
            "--topic-filter", "devices/#", "--quiet", *extra]


def check_stats(got_rows, expect, window_ms):
    """telemetry_stats rows equal the truth exactly, window by window."""
    got = {(r["device"], r["metric"], r["window_start"]): r for r in got_rows}
    assert set(got) == set(expect)
    for key, (count, rate, lo, hi, mean, p95) in expect.items():
        r = got[key]
        assert r["window_end"] - r["window_start"] == window_ms
        got_figures = (r["count"], r["rate_per_s"], r["min"], r["max"], r["mean"], r["p95"])
        assert got_figures == (count, rate, lo, hi, mean, p95), key


def check_anomalies(got_rows, expect):
    """The same anomalous points, with the same z-scores (to rounding)."""
    got = {(r["device"], r["metric"], r["offset"]): r for r in got_rows}
    assert set(got) == set(expect)
    for key, z in expect.items():
        assert math.isclose(got[key]["z"], z, rel_tol=1e-9), key


def check_talkers(got_rows, expect):
    """Talkers (sorted busiest first) in the truth's order with its counts and shares."""
    got = [(r["device"], r["messages"], r["bytes"], r["topics"]) for r in got_rows]
    assert got == [e[:4] for e in expect]
    for r, e in zip(got_rows, expect):
        assert math.isclose(r["share"], e[4], rel_tol=1e-12)


def check_heat(got_rows, expect):
    """One topic_heat row per topic and window, with the truth's counts."""
    assert {(r["topic"], r["window_start"]): (r["messages"], r["bytes"], r["devices"]) for r in got_rows} == expect
    assert len(got_rows) == len(expect)
