"""Crash test: SIGKILL between a subscribe's commit-log append and its session KV update."""

import json
import os
import signal
import subprocess
import sys

CHILD = os.path.join(os.path.dirname(__file__), "session_crash_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _child(mode, data_dir):
    return subprocess.run([sys.executable, CHILD, mode, data_dir], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))


def test_sigkill_between_log_append_and_kv_update_keeps_the_session(tmp_path):
    """Writes acknowledged once appended survive a kill before the KV commit: the restart replays them, whole."""
    data_dir = str(tmp_path / "data")
    crashed = _child("crash", data_dir)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    assert "ACKED 7 OF 7" in crashed.stdout, crashed.stdout + crashed.stderr[-2000:]
    checked = _child("check", data_dir)
    assert checked.returncode == 0, checked.stderr[-2000:]
    state = json.loads(checked.stdout.strip().splitlines()[-1])
    assert state == {
        "expiry": 3600,
        "subscriptions": {f"crash/{i}/+": [1, [i]] for i in range(5)},
        "inbound_qos2": [77],
    }
    again = _child("check", data_dir)  # the replayed state was committed: a second start finds the same
    assert json.loads(again.stdout.strip().splitlines()[-1]) == state
