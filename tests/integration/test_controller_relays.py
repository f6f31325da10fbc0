"""Controllers' Raft addresses: bound exactly as configured, and dialled only as advertised.

pysyncobj binds 0.0.0.0 at the Raft port unless it is given a bind address, which would expose the
port that unpickles what reaches it on every interface. And a controller may be reached through
another address than the one it binds (``[controller] raft_bind`` with ``raft`` the address its
peers dial): three controllers each behind a relay elect a leader through the relays, lose it when
every relay is cut, and elect one again when they are restored.
"""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest

from tests.integration.node import NodeProcess
from bench.relay import Relay
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

WAIT = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp has them) listening on ``port``."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, _, hexport = local.rpartition(":")
            if state == "0A" and int(hexport, 16) == port:
                out.add(address)
    return out


def _health(node) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.port('http')}/health", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


def test_the_raft_port_is_bound_on_loopback_only(tmp_path):
    """raft = 127.0.0.1:P: the listening socket is 127.0.0.1:P, not 0.0.0.0:P."""
    conf = tmp_path / "c.toml"
    conf.write_text('[cluster]\ncluster_id = "c-bind"\n')
    port = _free_port()
    node = NodeProcess(str(tmp_path / "c"), listeners=("rpc", "http"), role="controller",
                       extra_args=["--config", str(conf), "--raft", f"127.0.0.1:{port}"]).start()
    try:
        bound = wait_until(lambda: _listening(port), timeout=WAIT, what="the raft port listening")
        assert bound == {"0100007F"}, bound  # 127.0.0.1, little-endian hex
    finally:
        node.stop()


def test_controllers_behind_relays_talk_only_through_them(tmp_path):
    """Each controller binds one port and is dialled at its relay's: a leader is elected over connections the
    relays carry; all relays cut, no controller leads; restored, a leader again."""
    relays = [Relay() for _ in range(3)]
    nodes = []
    try:
        binds = [_free_port() for _ in relays]
        advertised = [f"127.0.0.1:{r.port}" for r in relays]
        for relay, port in zip(relays, binds):
            relay.target = ("127.0.0.1", port)
        conf = tmp_path / "c.toml"
        conf.write_text('[cluster]\ncluster_id = "c-relay"\n[controller]\nleader_fallback = 1.0\n')
        for i in range(3):
            peers = [arg for j in range(3) if j != i for arg in ("--peer", f"c{j}={advertised[j]}")]
            nodes.append(NodeProcess(str(tmp_path / f"c{i}"), listeners=("rpc", "http"), role="controller",
                                     extra_args=["--config", str(conf), "--node-id", f"c{i}", "--raft",
                                                 advertised[i], "--raft-bind", f"127.0.0.1:{binds[i]}", *peers]))
        for node in nodes:
            node.start()

        def leader():
            states = [_health(n) for n in nodes]
            leading = [i for i, s in enumerate(states) if s and s["is_leader"]]
            return len(leading) == 1 and all(s and s["leader"] == advertised[leading[0]] for s in states)
        wait_until(leader, timeout=WAIT, what="a leader elected through the relays")
        # pysyncobj dials a peer whose address sorts below its own: one connection per pair, all through relays
        wait_until(lambda: sum(r.connections for r in relays) >= 3, timeout=WAIT, what="a connection per pair")
        for relay in relays:
            relay.cut()
        wait_until(lambda: not any((_health(n) or {}).get("is_leader") for n in nodes), timeout=WAIT,
                   what="no leader once every relay is cut")
        for relay in relays:
            relay.restore()
        wait_until(leader, timeout=WAIT, what="a leader again once the relays are back")
    finally:
        for node in nodes:
            node.stop()
        for relay in relays:
            relay.close()
