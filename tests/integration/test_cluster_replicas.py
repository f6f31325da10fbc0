"""``./dev cluster up --replicas 2``: a master and its slave per group behind a proxy, real paho clients; what the
clients were acknowledged is in the slave's commit log, byte for byte."""

from __future__ import annotations

import os

import pytest

from cluster.tools import launcher
from store.reader import list_segments
from tests.integration.security_support import Paho
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One group of two brokers and one proxy, no controllers (static membership)."""
    root = tmp_path_factory.mktemp("replicas")
    base = root / "base.toml"
    base.write_text("[mqtt]\nallow_anonymous = true\n")
    doc = launcher.up(str(root / "c"), groups=1, proxies=1, replicas=2, controllers=0, base_config=str(base))
    yield doc
    launcher.down(str(root / "c"))


def _log_bytes(data_dir: str) -> bytes:
    out = b""
    for seg in list_segments(os.path.join(data_dir, "commitlog")):
        with open(seg.path, "rb") as f:
            out += f.read()
    return out


def test_up_returns_with_the_slave_in_the_sync_state_set(cluster):
    """cluster.json lists both brokers with an ha port, and the master's SyncStateSet already holds both."""
    brokers = [p for p in cluster["processes"] if p["role"] == "broker"]
    assert [p["id"] for p in brokers] == ["broker-g1-1", "broker-g1-2"]
    assert all("ha" in p["ports"] for p in brokers)
    assert launcher.sync_state_set_size(brokers[0]) == 2


def test_acknowledged_publishes_are_on_the_slave(cluster):
    """QoS 1 publishes through the proxy, each PUBACKed, reach the slave's log byte-identical to the master's."""
    proxy = next(p for p in cluster["processes"] if p["role"] == "proxy")
    master, slave = [p for p in cluster["processes"] if p["role"] == "broker"]
    c = Paho(proxy["ports"]["mqtt"])
    assert c.connect() == 0
    try:
        for i in range(100):
            assert c.publish(f"sensors/{i % 7}", b"reading %d" % i, qos=1) == 0
    finally:
        c.close()
    want = _log_bytes(master["data_dir"])
    assert b"reading 99" in want
    wait_until(lambda: _log_bytes(slave["data_dir"]).startswith(want), 15, what="the slave to hold the master's log")
