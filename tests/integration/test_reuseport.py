"""SO_REUSEPORT: two real node processes serve one MQTT port, and the kernel spreads clients over both."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from cluster.runtime.listeners import parse_listener
from store.config import ConfigError
from tests.integration.mqtt_raw import RawClient
from tests.integration.node import NodeProcess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connections(node: NodeProcess) -> int:
    url = f"http://127.0.0.1:{node.ports['http'][0]}/metrics"
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith("twistmq_clients_connected "):
            return int(float(line.split()[1]))
    raise AssertionError("no twistmq_clients_connected in /metrics")


def test_two_nodes_share_one_port(tmp_path):
    """Both processes bind the same port with reuseport=yes; 24 clients land on both, each gets a CONNACK."""
    port = _free_port()
    shared = ["--mqtt", f"tcp:{port}:interface=127.0.0.1:reuseport=yes"]
    nodes = [NodeProcess(str(tmp_path / f"n{i}"), listeners=("http",), extra_args=shared).start() for i in (1, 2)]
    clients = []
    try:
        assert nodes[0].ports["mqtt"] == nodes[1].ports["mqtt"] == [port]
        for i in range(24):
            client = RawClient(port, timeout=10)
            assert client.connect(f"rp-{i}").reason_code == 0
            clients.append(client)
        counts = [_connections(n) for n in nodes]
        assert sum(counts) == 24 and min(counts) > 0, counts
    finally:
        for client in clients:
            client.sock.close()
        for n in nodes:
            n.stop()


def test_a_bad_reuseport_value_is_named():
    """reuseport takes yes or no; anything else is a one-line ConfigError naming the value."""
    with pytest.raises(ConfigError, match="reuseport"):
        parse_listener("mqtt", "tcp:1883:interface=127.0.0.1:reuseport=maybe")
