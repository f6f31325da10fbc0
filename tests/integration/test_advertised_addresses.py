"""Advertised addresses: a broker reached only through a relay it advertises, and a proxy's client addresses.

One controller, one broker whose RPC is bound on one port and advertised as a relay's
(``[cluster] advertise_rpc``), and one proxy that dials the broker at that relay address and
advertises a client-facing native address other than its bound one (``[cluster] advertise``).
Cutting the relay makes the proxy see the group as unreachable (its /health names the broker, a
native produce is refused naming the group); restoring it brings the group back.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from mqtt_proxy.native.client import BlockingClient
from tests.integration.node import NodeProcess
from bench.relay import Relay
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

WAIT = 20.0
CLUSTER = "c-adv"
NATIVE_ADVERTISED = "tcp:native.example.net:9876"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Controller, broker behind a relay, proxy: started once; every process and the relay closed after."""
    path = tmp_path_factory.mktemp("advertise")
    ctl_conf = path / "controller.toml"
    ctl_conf.write_text(f'[cluster]\ncluster_id = "{CLUSTER}"\n')
    started = []
    relay = Relay()
    try:
        controller = NodeProcess(str(path / "ctl"), listeners=("rpc", "http"), role="controller",
                                 extra_args=["--config", str(ctl_conf), "--raft", f"127.0.0.1:{_free_port()}"])
        started.append(controller.start())
        controllers = f'controllers = ["tcp:127.0.0.1:{controller.port("rpc")}"]\n'
        discovery = "[discovery]\nheartbeat_interval = 0.2\nlease = 1.0\n"
        broker_conf = path / "broker.toml"
        broker_conf.write_text(f'[cluster]\ncluster_id = "{CLUSTER}"\ngroup = "g1"\n{controllers}'
                               f'advertise_rpc = "{relay.address}"\n{discovery}')
        broker = NodeProcess(str(path / "b1"), listeners=("rpc", "http"), role="broker",
                             extra_args=["--config", str(broker_conf), "--node-id", "b1"])
        started.append(broker.start())
        relay.target = ("127.0.0.1", broker.port("rpc"))
        proxy_conf = path / "proxy.toml"
        proxy_conf.write_text(f'[mqtt]\nallow_anonymous = true\n[cluster]\ncluster_id = "{CLUSTER}"\n{controllers}'
                              f'call_timeout = 1.0\nheartbeat_interval = 0.3\n'
                              f'advertise = {{ native = "{NATIVE_ADVERTISED}" }}\n'
                              f'[[cluster.members]]\nid = "b1"\nrole = "broker"\ngroup = "g1"\nrpc = "{relay.address}"\n'
                              f'{discovery}')
        proxy = NodeProcess(str(path / "p1"), listeners=("native", "http"), role="proxy",
                            extra_args=["--config", str(proxy_conf), "--node-id", "p1"])
        started.append(proxy.start())
        yield {"controller": controller, "broker": broker, "proxy": proxy, "relay": relay}
    finally:
        for node in reversed(started):
            node.stop()
        relay.close()


def _get(port: int, path: str):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _metadata_members(cluster) -> dict:
    doc = _get(cluster["controller"].port("http"), "/api/v1/cluster/controllers/metadata")[1]
    return {m["node_id"]: m for m in doc["members"]}


def test_members_list_the_advertised_addresses_not_the_bound_ones(cluster):
    """The broker is listed at the relay's address, the proxy with its advertised native address."""
    members = wait_until(lambda: (lambda m: {"b1", "p1"} <= set(m) and m)(_metadata_members(cluster)),
                         timeout=WAIT, what="both members registered")
    assert members["b1"]["rpc_address"] == cluster["relay"].address
    assert str(cluster["broker"].port("rpc")) not in members["b1"]["rpc_address"]
    assert members["p1"]["addresses"]["native"] == NATIVE_ADVERTISED
    assert members["p1"]["addresses"]["http"].endswith(f":{cluster['proxy'].port('http')}")


def test_cutting_the_relay_makes_the_group_unreachable_and_restoring_brings_it_back(cluster):
    """The proxy's only way to the broker is the relay: cut, its /health names b1 and a native produce is
    refused naming g1; restored, /health is ok and produces are stored again."""
    relay, proxy = cluster["relay"], cluster["proxy"]
    http = proxy.port("http")
    wait_until(lambda: _get(http, "/health")[0] == 200, timeout=WAIT, what="proxy connected to b1")
    assert relay.connections >= 1
    with BlockingClient("127.0.0.1", proxy.port("native")) as c:
        assert c.request({"action": "produce", "queue": "adv", "data": "before"})["code"] == 0
        relay.cut()
        try:
            wait_until(lambda: _get(http, "/health") == (503, {"status": "degraded", "brokers_unreachable": ["b1"]}),
                       timeout=WAIT, what="proxy sees b1 unreachable")
            refused = c.request({"action": "produce", "queue": "adv", "data": "cut"})
            assert refused["code"] == -1 and "g1" in refused["reason"], refused
        finally:
            relay.restore()
        wait_until(lambda: _get(http, "/health")[0] == 200, timeout=WAIT, what="proxy reconnected to b1")
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            reply = c.request({"action": "produce", "queue": "adv", "data": "after"})
            if reply["code"] == 0:
                break
            time.sleep(0.05)
        assert reply["code"] == 0, reply
