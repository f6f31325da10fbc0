"""Smoke test of the chaos benchmark (``bench/chaos.py``): a tiny fault-free run and tiny runs with faults.

Each runs the harness as an operator does (``python -m bench.chaos``) against a real cluster it starts
(3 controllers, a group of one broker, or of three for the master's partition, 2 proxies) under QoS 1
load, and reads its JSON lines: the fault-free run reports no election, loss or duplicate and exits 0;
a faulty run injects two SIGSTOP / SIGCONT of a controller minority, each verified and recovered from,
with nothing acknowledged lost; another cuts the master from the controllers once: verified, a new
master elected, the old one back in the SyncStateSet. No speed is asserted. The harness stops its
cluster itself; the test checks no process of it is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--rate", "200", "--replicas", "1", "--warmup", "1", "--drain-timeout", "10", "--drain-quiet", "2"]


def _chaos(tmp_path, *args: str) -> tuple[int, list[dict], str]:
    """Run the harness; its exit code, its JSON lines and its standard error."""
    done = subprocess.run([sys.executable, "-m", "bench.chaos", "--dir", str(tmp_path), *TINY, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, lines, done.stderr


def _left_running(tmp_path) -> list[str]:
    """Processes of this run's cluster still alive (their command line names its directory)."""
    out = subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if "twistd" in line]


def test_a_fault_free_run_shows_no_election_loss_or_duplicate(tmp_path):
    """--no-faults: exit 0, one summary line with every acknowledged message received once and no election."""
    code, lines, err = _chaos(tmp_path, "--no-faults", "--duration", "2")
    assert code == 0, err[-2000:]
    [summary] = lines
    assert summary["type"] == "summary" and summary["ok"] and summary["no_faults"]
    assert summary["acked"] > 0 and summary["received"] == summary["acked"]
    assert (summary["lost"], summary["duplicates"], summary["elections"]) == (0, 0, 0)
    assert "total: sent" in err  # the table
    assert _left_running(tmp_path) == []


def test_controller_minority_stops_are_verified_and_lose_nothing(tmp_path):
    """Two SIGSTOP/SIGCONT of one controller of three: a JSON line each (verified, recovered, nothing lost), the
    summary, exit 0."""
    code, lines, err = _chaos(tmp_path, "--types", "ctl-minority-stop", "--injections", "2", "--fault-window", "1",
                              "--gap", "0.5")
    assert code == 0, err[-2000:]
    *injections, summary = lines
    assert [r["type"] for r in injections] == ["ctl-minority-stop"] * 2
    for r in injections:
        assert len(r["targets"]) == 1 and r["targets"][0].startswith("controller-")
        assert r["verified_s"] < 5 and r["recovered"], r
        assert r["lost"] == 0 and r["elections"] == 0, r
        assert {"rto_s", "detect_s", "elect_s", "role_s", "route_s", "first_ack_s", "sss_full_s"} <= set(r)
    assert summary["type"] == "summary" and summary["injections"] == 2 and summary["lost"] == 0
    assert summary["acked"] > 0
    assert _left_running(tmp_path) == []


def test_a_master_cut_from_the_controllers_is_replaced_and_rejoins(tmp_path):
    """Every link between the master and the controllers cut for 2.5 s under load (a group of three): the cut is
    verified, the controllers elect another master, the SyncStateSet is full again after the heal; nothing
    acknowledged is lost."""
    code, lines, err = _chaos(tmp_path, "--replicas", "3", "--types", "partition-master-controllers",
                              "--injections", "1", "--fault-window", "2.5", "--gap", "0.5")
    assert code == 0, err[-2000:]
    *injections, summary = lines
    [r] = injections
    assert r["type"] == "partition-master-controllers" and r["targets"] == [r["master_before"]], r
    assert r["verified_s"] < 5 and r["recovered"] and r["sss_full_s"] is not None, r
    assert r["master_after"] not in (None, r["master_before"]) and r["elections"] >= 1, r
    assert summary["type"] == "summary" and summary["acked"] > 0 and summary["lost"] == 0, summary
    assert _left_running(tmp_path) == []
