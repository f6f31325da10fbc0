"""Smoke test of the benchmark harness (bench/): every scenario, tiny, against a twistmq node.

Each case starts the broker in its own process (for twistmq: ``twistd -n
--pidfile= twistmq node --mqtt ... --http ... --data-dir <fresh tmp dir>``),
runs ``bench/loadgen.py`` against it with a few hundred messages (a few dozen
connections for scenario 5), and checks that every message sent was
delivered, counted exactly at the subscribers. No speed is asserted.

Switch: ``BENCH_SMOKE_BROKERS`` (comma-separated, default ``twistmq``) picks
the brokers, e.g. ``BENCH_SMOKE_BROKERS=twistmq,mosquitto`` to run Mosquitto
as a control for the harness itself, or ``mosquitto`` alone when the node is
broken. Mosquitto is skipped if it is not installed (``./dev test`` installs it).
"""

import os

import pytest

from bench.brokers import BROKERS
from bench.compare import run_one

SMOKE_BROKERS = [b.strip() for b in os.environ.get("BENCH_SMOKE_BROKERS", "twistmq").split(",") if b.strip()]
CAP = 10.0  # seconds per phase: a stuck broker fails the case quickly

# Scenario parameters small enough for the test suite: a few hundred messages each.
SMOKE_PARAMS = {
    1: {"messages": 400},
    2: {"messages": 400},
    3: {"messages": 30, "subscribers": 10},
    4: {"seconds": 0.3},
    5: {"connections": 20},
    6: {"messages": 400},
    7: {"messages": 400, "filters": 200},
    8: {"sessions": 30, "messages": 200, "sample": 5},
}


def _broker(name):
    if name not in BROKERS:
        pytest.fail(f"BENCH_SMOKE_BROKERS names an unknown broker {name!r} (known: {', '.join(BROKERS)})")
    broker = BROKERS[name]
    ok, reason = broker.available()
    if not ok:
        pytest.skip(reason)
    return broker


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", [1, 2, 3, 4, 6, 7, 8])
@pytest.mark.parametrize("broker_name", SMOKE_BROKERS)
def test_every_message_is_delivered(broker_name, scenario):
    """A tiny run of a message scenario delivers every message sent, exactly counted at the subscribers."""
    result = run_one(_broker(broker_name), scenario, params=SMOKE_PARAMS[scenario], cap=CAP)
    assert "error" not in result, result
    assert result["errors"] == [], result["errors"]
    assert not result["partial"], result
    assert result["expected"] > 0
    assert result["delivered"] == result["expected"], result
    assert result["figures"]["loss"] == 0, result
    assert result["malformed"] == 0


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("broker_name", SMOKE_BROKERS)
def test_idle_connections_all_connect(broker_name):
    """A tiny idle-connection run gets a CONNACK for every connection and measures the broker's RSS."""
    result = run_one(_broker(broker_name), 5, params=SMOKE_PARAMS[5], cap=CAP)
    assert "error" not in result, result
    assert result["errors"] == [], result["errors"]
    assert result["delivered"] == SMOKE_PARAMS[5]["connections"], result
    assert result["rss_before"] and result["rss_after"], result


@pytest.mark.slow
def test_stall_bench_prints_its_table(capsys):
    """bench/stall_bench.py runs a tiny before/after pair (both this checkout) and prints lateness and msg/s."""
    from bench import stall_bench
    from bench.brokers import REPO

    assert stall_bench.main(["--repo", str(REPO), "--reps", "1", "--messages", "400", "--cap", str(CAP)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert len(rows) == 2 and all("400/400" in row for row in rows), out
    after = next(row for row in rows if "after" in row)
    assert after.split("|")[6].strip() != "-", "the node's own twistmq_reactor_lag_seconds was scraped"


@pytest.mark.slow
def test_cost_bench_prints_its_table(capsys):
    """bench/cost_bench.py runs a tiny old/new pair (both this checkout) per scenario and prints CPU-µs/msg."""
    from bench import cost_bench
    from bench.brokers import REPO

    argv = ["--repo", str(REPO), "--reps", "1", "--fan-in", "400", "--fan-out", "20", "--subscribers", "10",
            "--native-pairs", "20", "--cap", str(CAP)]
    assert cost_bench.main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines()
            if line.startswith("| fan-") or line.startswith("| native")}
    assert sorted(rows) == ["fan-in", "fan-in-0", "fan-out", "native"], out
    for cells in rows.values():
        assert cells[2].strip() != "-" and cells[3].strip() != "-", out  # a tiny run may round to 0 CPU ticks
        assert cells[5].strip() in ("yes", "**no**", "-"), out
        assert cells[6].strip() == "1/1", out


def test_topic_match_bench_prints_its_table(capsys):
    """bench/topic_match_bench.py runs tiny adversarial filter sets, capped and not, and prints µs per publish."""
    from bench import topic_match_bench

    argv = ["--filters", "3000", "--uncapped-filters", "300", "--publishes", "100", "--max-shapes", "256"]
    assert topic_match_bench.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert {cells[1].strip() for cells in rows} == {"mixed", "mixed-matching", "plus-tail", "literal", "hash-ladder"}
    capped = [cells for cells in rows if cells[2].strip() == "256"]
    assert len(capped) == 5 and all(int(cells[6]) <= 256 for cells in capped), out
    assert int(next(c for c in capped if c[1].strip() == "mixed")[5]) > 0, "the cap refused none"
