"""Calls without a fixed target avoid an unhealthy member: a member reads the metadata from a healthy controller.

Three controllers; one is unhealthy (``[cluster] min_free_memory = 1.0``: never that much free) and is
made the Raft leader (``cluster/elect-leader``). Two brokers register and heartbeat with the leader
(a fixed target), but read the metadata (any controller answers it) from the healthy followers: the
unhealthy leader serves no ``controller.metadata`` call, and says it is unhealthy in ``cluster/members``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.integration.node import NodeProcess
from tests.integration.waiting import wait_until
from cluster.tools.launcher import free_ports

pytestmark = pytest.mark.slow

WAIT = 20.0
CLUSTER = "c-avoid"



def _http(node, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{node.port('http')}{path}", data=data, method=method,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read()) if path.startswith("/api") or path == "/health" else r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None, None


def _metadata_calls(node) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.port('http')}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith("twistmq_rpc_calls") and 'type="controller.metadata"' in line
               and not line.startswith(("twistmq_rpc_calls_created", "twistmq_rpc_call_")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Controllers c0 (unhealthy, the leader), c1, c2; brokers registered with all three (c0 listed first)."""
    path = tmp_path_factory.mktemp("avoid")
    raft = [f"127.0.0.1:{p}" for p in free_ports(3)]
    started = []
    try:
        controllers = []
        for i, address in enumerate(raft):
            conf = path / f"c{i}.toml"
            conf.write_text(f'[cluster]\ncluster_id = "{CLUSTER}"\n' + ("min_free_memory = 1.0\n" if i == 0 else ""))
            peers = [arg for other in raft if other != address for arg in ("--peer", other)]
            node = NodeProcess(str(path / f"c{i}"), listeners=("rpc", "http"), role="controller",
                               extra_args=["--config", str(conf), "--node-id", f"c{i}", "--raft", address, *peers])
            controllers.append(node)
        for node in controllers:
            started.append(node.start())

        def leader():
            states = [_http(n, "GET", "/health")[1] for n in controllers]
            return next((i for i, s in enumerate(states) if s and s["is_leader"]), None)

        now = wait_until(lambda: leader() is not None and leader() + 1, timeout=WAIT, what="a leader") - 1
        if now != 0:
            status, answer = _http(controllers[now], "POST", "/api/v1/cluster/elect-leader", {"id": raft[0]})
            assert status == 200, answer
        wait_until(lambda: leader() == 0 or None, timeout=WAIT, what="c0 leading")
        rpcs = ", ".join(f'"tcp:127.0.0.1:{n.port("rpc")}"' for n in controllers)
        for name in ("b1", "b2"):
            conf = path / f"{name}.toml"
            conf.write_text(f'[cluster]\ncluster_id = "{CLUSTER}"\ngroup = "g-{name}"\ncontrollers = [{rpcs}]\n'
                            "[discovery]\nheartbeat_interval = 0.2\nlease = 1.0\n")
            started.append(NodeProcess(str(path / name), listeners=("rpc", "http"), role="broker",
                                       extra_args=["--config", str(conf), "--node-id", name]).start())
        yield controllers
    finally:
        for node in reversed(started):
            node.stop()


def test_metadata_reads_avoid_the_unhealthy_leader(cluster):
    """Both brokers registered with c0 (the leader, unhealthy) and read the metadata; c0
    served no metadata read: the healthy followers did."""
    c0 = cluster[0]

    def listed():
        status, answer = _http(c0, "GET", "/api/v1/cluster/members")
        rows = {m["id"]: m for m in answer["items"]} if status == 200 else {}
        return {"b1", "b2"} <= {k for k, m in rows.items() if m["joined"]} and rows
    wait_until(listed, timeout=WAIT, what="both brokers registered")
    wait_until(lambda: sum(_metadata_calls(n) for n in cluster[1:]) >= 2, timeout=WAIT,
               what="metadata read by both brokers")
    assert _metadata_calls(c0) == 0
    assert _http(c0, "GET", "/health")[1]["is_leader"]
