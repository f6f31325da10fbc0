"""The node role's contract: one-line exits on bad config, one node per data dir, /health, /metrics, SIGTERM."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request

import pytest

from tests.integration.node import TWISTD, NodeProcess


def run_node(*args, timeout=30):
    return subprocess.run([TWISTD, "-n", "--pidfile=", "twistmq", "node", *args], capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def test_unknown_config_key_is_named_on_exit(tmp_path):
    """A bad key in the config file exits non-zero with one line naming it."""
    conf = tmp_path / "bad.toml"
    conf.write_text("[mqtt]\nbogus = 1\n")
    r = run_node("--config", str(conf), "--data-dir", str(tmp_path / "d"))
    assert r.returncode != 0
    assert "mqtt.bogus" in r.stderr and len([l for l in r.stderr.splitlines() if "twistmq:" in l]) == 1


def test_wrong_type_and_bad_listener_are_refused(tmp_path):
    """A value of the wrong type, and a malformed UDP listener, exit non-zero naming the problem."""
    conf = tmp_path / "bad.toml"
    conf.write_text("[limits]\nmax_connections = \"many\"\n")
    r = run_node("--config", str(conf), "--data-dir", str(tmp_path / "d"))
    assert r.returncode != 0 and "limits.max_connections" in r.stderr
    r = run_node("--native-udp", "127.0.0.1:notaport", "--data-dir", str(tmp_path / "d2"))
    assert r.returncode != 0 and "native-udp" in r.stderr


def test_second_node_on_one_data_dir_refuses(tmp_path):
    """Two nodes on one data dir: the second exits with a clear error and the first keeps working."""
    first = NodeProcess(str(tmp_path / "data")).start()
    try:
        r = run_node("--mqtt", "tcp:0:interface=127.0.0.1", "--http", "tcp:0:interface=127.0.0.1",
                     "--data-dir", str(tmp_path / "data"))
        assert r.returncode != 0 and "in use by another process" in r.stderr
        health = urllib.request.urlopen(f"http://127.0.0.1:{first.port('http')}/health", timeout=5)
        assert health.status == 200
    finally:
        first.stop()


def test_metrics_and_clean_sigterm(tmp_path):
    """/metrics serves Prometheus text with the broker's counters; SIGTERM stops the node cleanly."""
    node = NodeProcess(str(tmp_path / "data")).start()
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{node.port('http')}/metrics", timeout=5).read().decode()
        assert "twistmq_messages_received" in text and "twistmq_clients_connected" in text
    finally:
        code = node.stop()
    assert code in (0, -15)  # twistd re-raises SIGTERM after a clean shutdown
    assert any("node_stopped" in line for line in open(str(tmp_path / "data") + ".stderr.log"))
    again = NodeProcess(str(tmp_path / "data")).start()  # the data dir was released
    again.stop()


def test_no_data_dir_and_no_default_one_asks_for_data_dir():
    """Run unprivileged with neither --data-dir nor a config, a node that cannot make /var/lib/twistmq/node says
    so in one line asking for --data-dir (exit 2), and makes nothing."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the node as nobody")
    if os.path.exists("/var/lib/twistmq"):
        pytest.skip("/var/lib/twistmq exists here: nobody might be able to use it")
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/"}
    probe = subprocess.run([*as_nobody, sys.executable, "-c", "import cluster"], capture_output=True, text=True,
                           timeout=60, cwd="/", env=env)
    if probe.returncode != 0:  # e.g. a pyenv interpreter under /root
        pytest.skip(f"nobody cannot run this interpreter: {probe.stderr.strip()[-200:]}")
    r = subprocess.run([*as_nobody, TWISTD, "-n", "--pidfile=", "twistmq", "node", "--mqtt",
                        "tcp:0:interface=127.0.0.1"], capture_output=True, text=True, timeout=60, cwd="/", env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ("twistmq: no data directory given and /var/lib/twistmq/node cannot be made "
                                "(Permission denied): pass --data-dir DIR or set node.data_dir"), r.stderr
    assert not os.path.exists("/var/lib/twistmq")
