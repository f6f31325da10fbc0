"""The health flag reaches the controllers: a broker whose [cluster] CPU threshold is forced to 0 heartbeats
healthy false and is listed so in cluster/members; with the default threshold it is listed healthy.

One controller (its own majority) and two brokers registering with it, started for the module.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow

WAIT = 15.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    path = tmp_path_factory.mktemp("member-health")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        raft = s.getsockname()[1]
    ctl_conf = path / "controller.toml"
    ctl_conf.write_text('[cluster]\ncluster_id = "c-health"\n')
    controller = NodeProcess(str(path / "ctl"), listeners=("rpc", "http"), role="controller",
                             extra_args=["--config", str(ctl_conf), "--raft", f"127.0.0.1:{raft}"]).start()
    brokers = []
    for name, limit in (("b-busy", 0.0), ("b-calm", 1000.0)):
        conf = path / f"{name}.toml"
        rpc = controller.port("rpc")
        conf.write_text(f'[cluster]\ncluster_id = "c-health"\ncontrollers = ["tcp:127.0.0.1:{rpc}"]\n'
                        f"max_load_per_core = {limit}\n[discovery]\nheartbeat_interval = 0.2\nlease = 1.0\n")
        brokers.append(NodeProcess(str(path / name), listeners=("rpc", "http"), role="broker",
                                   extra_args=["--config", str(conf), "--node-id", name]).start())
    yield controller
    for b in brokers:
        b.stop()
    controller.stop()


def members(controller) -> dict:
    url = f"http://127.0.0.1:{controller.port('http')}/api/v1/cluster/members"
    with urllib.request.urlopen(url, timeout=5) as r:
        return {m["id"]: m for m in json.loads(r.read())["items"]}


def test_forced_low_cpu_threshold_lists_the_member_unhealthy(cluster):
    """max_load_per_core = 0 (any load is too much): listed joined but healthy false; the other broker healthy."""
    deadline = time.monotonic() + WAIT
    listed = {}
    while time.monotonic() < deadline:
        listed = members(cluster)
        if {"b-busy", "b-calm"} <= set(listed) and not listed["b-busy"]["healthy"]:
            break
        time.sleep(0.05)
    assert listed["b-busy"]["joined"] and not listed["b-busy"]["healthy"], listed
    assert listed["b-calm"]["joined"] and listed["b-calm"]["healthy"]
