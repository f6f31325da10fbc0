"""The broker role's configuration ([cluster], --rpc), its retention holder, and the RPC health flag."""

from __future__ import annotations

import subprocess

import pytest
from twisted.internet import task

from cluster.local.parts import stored_sessions_owed
from cluster.roles.broker import BrokerOptions, broker_config
from cluster.roles.table import role
from cluster.rpc.health import HealthLimits, HealthProbe
from cluster.runtime.config import load_config
from store import api
from store.config import ConfigError
from store.session_store import SessionStore
from tests.contract.conftest import T0, Parts
from tests.integration.node import TWISTD


def options(*argv: str) -> BrokerOptions:
    o = BrokerOptions()
    o.parseOptions(list(argv))
    return o


def test_broker_is_a_row_of_the_roles_table():
    """``twistd twistmq broker`` exists."""
    assert role("broker").name == "broker"


def test_flags_choose_the_listeners_and_the_identity(tmp_path):
    """--rpc and --http are exactly the listeners; node id and group come from the flags, else defaults."""
    cfg = broker_config(options("--data-dir", str(tmp_path / "b7"), "--rpc", "tcp:0:interface=127.0.0.1"))
    assert [(l.key, l.port) for l in cfg.listeners] == [("rpc", 0)]
    assert (cfg.cluster.node_id, cfg.cluster.group, cfg.cluster.cluster_id) == ("b7", "g1", "twistmq")
    cfg = broker_config(options("--data-dir", str(tmp_path / "d"), "--node-id", "b-1", "--group", "g2",
                                "--rpc", "tcp:0:interface=127.0.0.1", "--http", "tcp:0:interface=127.0.0.1"))
    assert [l.key for l in cfg.listeners] == ["rpc", "http"]
    assert (cfg.cluster.node_id, cfg.cluster.group) == ("b-1", "g2")


@pytest.mark.parametrize("argv, message", [
    (("--rpc", "7800"), "--rpc 7800: a bare port is not a listener: say its type and interface; "
                        "for example --rpc tcp:7800:interface=127.0.0.1"),
    (("--http", "tcp:0:interface=127.0.0.1"), "a broker needs an RPC listener"),
    (("--rpc", "tcp:0:interface=127.0.0.1", "--http", "tcp:8080"), "must name its interface"),
])
def test_bad_listeners_are_one_line_errors(tmp_path, argv, message):
    """A listener Twisted would reject, or a broker without RPC, is a ConfigError naming the flag."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        broker_config(options("--data-dir", str(tmp_path), *argv))


def test_cluster_members_are_read_and_checked(tmp_path):
    """[[cluster.members]] tables become members; a bad one is named by its index and key."""
    good = tmp_path / "good.toml"
    good.write_text('[cluster]\ncluster_id = "c"\n'
                    '[[cluster.members]]\nid = "b1"\nrole = "broker"\ngroup = "g1"\nrpc = "tcp:127.0.0.1:7800"\n'
                    '[[cluster.members]]\nid = "p1"\nrole = "proxy"\nrpc = "tcp:127.0.0.1:7900"\n')
    members = load_config(str(good)).cluster.members
    assert [(m.id, m.role, m.group, m.rpc) for m in members] == [
        ("b1", "broker", "g1", "tcp:127.0.0.1:7800"), ("p1", "proxy", "", "tcp:127.0.0.1:7900")]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[cluster.members]]\nid = "b1"\nrole = "master"\nrpc = "tcp:127.0.0.1:7800"\n')
    with pytest.raises(ConfigError, match=r"cluster.members\[0\].role must be broker or proxy"):
        load_config(str(bad))
    bad.write_text('[cluster]\ncall_timeout = 0\n')
    with pytest.raises(ConfigError, match="cluster.call_timeout must be positive"):
        load_config(str(bad))


@pytest.mark.parametrize("rpc, secret, refused", [
    ("tcp:0:interface=127.0.0.1", "", False), ("unix:/tmp/twistmq-rpc.sock", "", False),
    ("tcp:0:interface=0.0.0.0", "", True), ("tcp:0", "", True), ("tcp:0:interface=10.1.2.3", "", True),
    ("tcp:0:interface=0.0.0.0", "s3cret", False)])
def test_rpc_listener_off_loopback_needs_a_secret(tmp_path, rpc, secret, refused):
    """An RPC listener that other hosts can reach needs [cluster] secret: without it the config is refused in one
    line naming the key and the listener."""
    conf = tmp_path / "b.toml"
    conf.write_text(f'[cluster]\nsecret = "{secret}"\n' if secret else "")
    opts = options("--config", str(conf), "--data-dir", str(tmp_path / "d"), "--rpc", rpc)
    if refused:
        with pytest.raises(ConfigError, match=rf"--rpc {rpc} is not on loopback: set \[cluster\] secret"):
            broker_config(opts)
    else:
        assert broker_config(opts).listeners[0].description == rpc


def test_rpc_members_and_controllers_may_be_dialled_over_tls(tmp_path):
    """tls: and ssl: client endpoints are accepted for members' rpc, controllers and advertise_rpc; a bare port
    is still refused."""
    conf = tmp_path / "tls.toml"
    conf.write_text('[cluster]\ncontrollers = ["tls:10.0.0.5:7910:trustRoots=/etc/twistmq/ca"]\n'
                    'advertise_rpc = "ssl:host=10.0.0.9:port=7800:caCertsDir=/etc/twistmq/ca"\n'
                    '[[cluster.members]]\nid = "b1"\nrole = "broker"\ngroup = "g1"\n'
                    'rpc = "tls:10.0.0.9:7800:trustRoots=/etc/twistmq/ca"\n')
    cluster = load_config(str(conf)).cluster
    assert cluster.members[0].rpc.startswith("tls:") and cluster.controllers[0].startswith("tls:")
    conf.write_text('[[cluster.members]]\nid = "b1"\nrole = "broker"\ngroup = "g1"\nrpc = "tls:7800"\n')
    with pytest.raises(ConfigError, match=r"rpc must be a client endpoint like tcp:127.0.0.1:7800"):
        load_config(str(conf))


def test_an_exposed_rpc_listener_without_secret_stops_twistd_with_one_line(tmp_path):
    """twistd twistmq broker --rpc on every interface and no [cluster] secret exits 2 with one line naming the
    key, before opening anything."""
    proc = subprocess.run([TWISTD, "-n", "--pidfile=", "twistmq", "broker", "--data-dir", str(tmp_path / "d"),
                           "--rpc", "tcp:0:interface=0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "twistmq: --rpc tcp:0:interface=0.0.0.0 is not on loopback: set [cluster] secret (members prove it to each "
        "other when they connect), or bind it to this host: --rpc tcp:0:interface=127.0.0.1"]
    assert not (tmp_path / "d").exists()


def test_a_bad_config_exits_with_one_line(tmp_path):
    """twistd twistmq broker with a bad --rpc prints one line and exits 2, no traceback."""
    proc = subprocess.run([TWISTD, "-n", "--pidfile=", "twistmq", "broker", "--data-dir", str(tmp_path),
                           "--rpc", "7800"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "twistmq: --rpc 7800: a bare port is not a listener: say its type and interface; "
        "for example --rpc tcp:7800:interface=127.0.0.1"]


def test_stored_sessions_owe_from_their_oldest_message_in_flight(tmp_path):
    """A broker's retention holder: each stored subscription owes from its oldest outbound, else its next."""
    clock = task.Clock()
    clock.advance(T0)
    parts = Parts(str(tmp_path), clock)
    try:
        local = parts.local()
        queue = local.add_filter("h/#")
        clock.advance(0)
        (end,) = local.end_positions(queue.result).result
        far = api.QueuePosition(end.queue, end.group, end.offset + 9)
        claims = [local.claim_session(cid, "p1") for cid in ("c1", "c2")]
        clock.advance(0)
        e1, e2 = (d.result for d in claims)
        local.put_session(api.SessionMeta("c1", 3600, 5), e1)
        local.put_subscription("c1", api.SubscriptionState("h/#", 1, (far,)), e1)
        local.put_session(api.SessionMeta("c2", 3600, 5), e2)
        local.put_subscription("c2", api.SubscriptionState("h/#", 1, (far,)), e2)
        local.put_outbound("c2", api.OutboundState(5, "h/#", api.QueuePosition(end.queue, end.group, end.offset + 2),
                                                    1), e2)
        clock.advance(1)
        owed = sorted(stored_sessions_owed(SessionStore(parts.kv)))
        assert owed == [api.Owed("session c1", queue.result, far.offset),
                        api.Owed("session c2", queue.result, end.offset + 2)]
    finally:
        parts.close(clock)


def test_health_flag_follows_load_and_memory():
    """Healthy under the limits; unhealthy when the load per core or the free memory crosses one."""
    limits = HealthLimits(max_load_per_core=2.0, min_free_memory=0.1)
    assert HealthProbe(limits, load=lambda: 1.0, memory=lambda: 0.5)()
    assert not HealthProbe(limits, load=lambda: 2.5, memory=lambda: 0.5)()
    assert not HealthProbe(limits, load=lambda: 0.1, memory=lambda: 0.05)()
    assert HealthProbe(limits, load=lambda: None, memory=lambda: None)()
    assert isinstance(HealthProbe()(), bool)  # the real kernel readings


def test_the_session_keeper_judges_homes_by_the_controllers_slot_table():
    """Slots the metadata moved to another group are not homed here any more; no slot table keeps the config's."""
    from cluster.roles.broker import homed_by_metadata
    from cluster.routing import slot_of

    client = "device-7"
    mine = slot_of(client)
    before = {"slots": {"g1": [[0, 1023]], "g2": []}}
    moved = {"slots": {"g1": [[s, s] for s in range(1024) if s != mine], "g2": [[mine, mine]]}}
    assert homed_by_metadata(before, "g1")(client) is True
    assert homed_by_metadata(moved, "g1")(client) is False and homed_by_metadata(moved, "g2")(client) is True
    assert homed_by_metadata({"members": []}, "g1") is None
