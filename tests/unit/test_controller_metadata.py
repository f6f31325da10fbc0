"""The controllers' metadata state machine and config: deterministic commands, fencing, worker ids, snapshots."""

from __future__ import annotations

import subprocess

import pytest

from cluster.controller.config import ControllerConfig
from cluster.controller.metadata import Metadata
from cluster.discovery.members import MemberRecord
from cluster.runtime.config import ClusterConfig, MemberConfig
from store.config import ConfigError, from_mapping


def _record(node_id: str, generation: int, **kw) -> dict:
    return MemberRecord("twistmq", node_id, kw.pop("node_type", "proxy"), generation=generation, **kw).as_dict()


def test_seed_happens_once():
    """The first seed takes slots and routes; a later one (another leader's config) changes nothing."""
    m = Metadata()
    assert m.seed({"g1": [[0, 1023]]}, {"a": "g1"})
    assert not m.seed({"g2": [[0, 1023]]}, {})
    assert m.slots == {"g1": [[0, 1023]]} and m.routes == {"a": "g1"} and m.version == 1


def test_join_leases_the_lowest_free_worker_id_and_keeps_it_across_rejoins():
    """Each member gets the lowest unused worker id; registering again keeps it; forgetting frees it."""
    m = Metadata()
    assert m.join(_record("a", 1)) == 0
    assert m.join(_record("b", 2)) == 1
    assert m.join(_record("a", 3)) == 0
    assert m.forget("a", 3)
    assert m.join(_record("c", 4)) == 0
    assert m.workers == {"b": 1, "c": 0}


def test_worker_ids_run_out_at_256():
    """The 257th member gets no worker id (None), the others keep theirs."""
    m = Metadata()
    for i in range(256):
        assert m.join(_record(f"n{i}", i + 1)) == i
    assert m.join(_record("late", 999)) is None


def test_older_generation_is_fenced():
    """An update or join carrying an older generation than the stored one (a deposed leader's) is ignored."""
    m = Metadata()
    m.join(_record("a", (2 << 32) + 1))
    version = m.version
    assert not m.update(_record("a", (1 << 32) + 5, joined=False))
    m.join(_record("a", (1 << 32) + 6))
    assert m.members["a"]["generation"] == (2 << 32) + 1 and m.members["a"]["joined"] and m.version == version
    assert m.update(_record("a", (2 << 32) + 1, joined=False)) and not m.members["a"]["joined"]


def test_forget_spares_a_member_that_registered_again():
    """Forgetting with the generation that left does nothing once the member registered with a newer one."""
    m = Metadata()
    m.join(_record("a", 1))
    m.join(_record("a", 2))
    assert not m.forget("a", 1) and "a" in m.members


def test_groups_list_brokers_and_every_slotted_group():
    """groups(): each group with slots, with the brokers registered in it."""
    m = Metadata()
    m.seed({"g1": [[0, 511]], "g2": [[512, 1023]]}, {})
    m.join(_record("b1", 1, node_type="broker", group="g1"))
    m.join(_record("p1", 2))
    assert m.groups() == {"g1": ["b1"], "g2": []}


def test_snapshot_round_trips_and_refuses_another_schema():
    """to_dict/from_dict keep everything; a snapshot of another schema is refused, not misread."""
    m = Metadata()
    m.seed({"g1": [[0, 1023]]}, {"x": "g1"})
    m.join(_record("a", 1))
    again = Metadata.from_dict(m.to_dict())
    assert again.view() == m.view() and again.seeded
    with pytest.raises(ValueError, match="schema"):
        Metadata.from_dict({**m.to_dict(), "schema": 99})


def test_two_replicas_applying_the_same_commands_agree():
    """Determinism: the same commands in the same order give the same state (what Raft relies on)."""
    commands = [("seed", ({"g1": [[0, 1023]]}, {})), ("join", (_record("a", 1),)), ("join", (_record("b", 2),)),
                ("update", (_record("a", 1, joined=False),)), ("forget", ("a", 1)), ("join", (_record("c", 3),))]
    replicas = [Metadata(), Metadata()]
    for replica in replicas:
        for name, args in commands:
            getattr(replica, name)(*args)
    assert replicas[0].to_dict() == replicas[1].to_dict()


@pytest.mark.parametrize("values, key", [
    ({"raft": "nohost"}, "raft"),
    ({"peers": ["127.0.0.1:7900"]}, "own raft address"),
    ({"peers": ["127.0.0.1:1", "127.0.0.1:1"]}, "twice"),
    ({"peers": ["c2=127.0.0.1:1", "c3=127.0.0.1:1"]}, "twice"),
    ({"peers": ["c2=127.0.0.1:1", "c2=127.0.0.1:2"]}, "alike"),
    ({"peers": ["=127.0.0.1:1"]}, "names no controller"),
    ({"peers": ["127.0.0.1:7900"], "raft": "127.0.0.1:7900"}, "own raft address"),
    ({"tick": 0}, "tick"),
    ({"append_period": 0.3}, "append_period"),
    ({"election_min": 0.9, "election_max": 0.5}, "election_max"),
])
def test_controller_config_names_the_bad_key(values, key):
    """A bad [controller] value is a ConfigError naming its key."""
    with pytest.raises(ConfigError, match=key):
        from_mapping(ControllerConfig, "controller", {k: tuple(v) if isinstance(v, list) else v
                                                       for k, v in values.items()})


def test_named_peers_give_their_ids_and_raft_only_their_addresses():
    """--peer ID=HOST:PORT names a controller; pysyncobj is given the addresses alone."""
    cfg = ControllerConfig(peers=("c2=127.0.0.1:7901", "127.0.0.1:7902"))
    cfg.validate()
    assert cfg.peer_addresses() == ("127.0.0.1:7901", "127.0.0.1:7902")
    assert cfg.peer_ids() == {"127.0.0.1:7901": "c2"}


def test_seed_follows_the_cluster_config():
    """The first leader's seed is the slot table a proxy of the same [cluster] config builds."""
    from cluster.roles.controller import seed_from
    cluster = ClusterConfig(members=(MemberConfig("b1", "broker", "tcp:127.0.0.1:1", "g1"),
                                     MemberConfig("b2", "broker", "tcp:127.0.0.1:2", "g2")), routes={"s": "g2"})
    assert seed_from(cluster) == ({"g1": [[0, 511]], "g2": [[512, 1023]]}, {"s": "g2"})
    assert seed_from(ClusterConfig()) == ({"g1": [[0, 1023]]}, {})
    with pytest.raises(ConfigError, match="slots"):
        seed_from(ClusterConfig(routes={"s": "nowhere"}))


def test_discovery_config_refuses_a_lease_no_longer_than_the_heartbeat():
    """[discovery] lease must exceed heartbeat_interval (one late heartbeat must not evict); errors name the key."""
    from cluster.discovery.config import DiscoveryConfig
    with pytest.raises(ConfigError, match="discovery.lease"):
        from_mapping(DiscoveryConfig, "discovery", {"lease": 1.0, "heartbeat_interval": 1.0})
    with pytest.raises(ConfigError, match="discovery.wheel_tick"):
        from_mapping(DiscoveryConfig, "discovery", {"wheel_tick": 0})
    assert from_mapping(DiscoveryConfig, "discovery", {"lease": 1.5}).timings().lease == 1.5


@pytest.mark.parametrize("raft, secret, refused", [
    ("127.0.0.1:7900", "", False), ("localhost:7900", "", False), ("0.0.0.0:7900", "", True),
    ("10.1.2.3:7900", "", True), ("10.1.2.3:7900", "s3cret", False)])
def test_controller_off_loopback_needs_a_secret(tmp_path, raft, secret, refused):
    """A controller whose Raft address is not on loopback refuses to start without [cluster] secret (one line)."""
    from cluster.roles.controller import ControllerOptions, controller_config
    conf = tmp_path / "c.toml"
    conf.write_text(f'[cluster]\nsecret = "{secret}"\n' if secret else "")
    options = ControllerOptions()
    options.parseOptions(["--config", str(conf), "--data-dir", str(tmp_path / "d"), "--raft", raft,
                          "--rpc", "tcp:0:interface=127.0.0.1"])
    if refused:
        with pytest.raises(ConfigError, match=r"controller.raft .* is not a loopback address: set \[cluster\] secret"):
            controller_config(options)
    else:
        assert controller_config(options).controller.raft == raft


def test_controller_rpc_off_loopback_needs_a_secret_and_twistd_says_so_in_one_line(tmp_path):
    """A controller whose RPC listener faces other hosts (Raft on loopback) refuses to start without
    [cluster] secret: twistd exits 2 with one line naming the key; with a secret the config is accepted."""
    from cluster.roles.controller import ControllerOptions, controller_config
    from tests.integration.node import TWISTD
    argv = ["--data-dir", str(tmp_path / "d"), "--raft", "127.0.0.1:7900", "--rpc", "tcp:0:interface=0.0.0.0"]
    proc = subprocess.run([TWISTD, "-n", "--pidfile=", "twistmq", "controller", *argv], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("twistmq: --rpc tcp:0:interface=0.0.0.0 is not on loopback: set [cluster] secret")
    conf = tmp_path / "c.toml"
    conf.write_text('[cluster]\nsecret = "s3cret"\n')
    options = ControllerOptions()
    options.parseOptions(["--config", str(conf), *argv])
    assert controller_config(options).listeners[0].interface == "0.0.0.0"
