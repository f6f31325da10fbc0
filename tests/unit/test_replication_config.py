"""A broker's replication config (--ha, --ha-master, [cluster] ha_*) and a slave store refusing writes."""

from __future__ import annotations

import pytest
from twisted.internet import task

from cluster.roles.broker import BrokerOptions, broker_config
from store.config import ConfigError, StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore, PutStatus
from store.record import Message

RPC = ("--rpc", "tcp:0:interface=127.0.0.1")


def _cfg(tmp_path, *argv, config=""):
    o = BrokerOptions()
    args = ["--data-dir", str(tmp_path / "b")]
    if config:
        (tmp_path / "c.toml").write_text(config)
        args += ["--config", str(tmp_path / "c.toml")]
    o.parseOptions(args + list(argv))
    return broker_config(o)


def test_ha_listener_and_master_come_from_the_flags(tmp_path):
    """--ha is a listener of its own kind and --ha-master names the master to replicate from."""
    cfg = _cfg(tmp_path, *RPC, "--ha", "tcp:0:interface=127.0.0.1", "--ha-master", "tcp:127.0.0.1:7851")
    assert [l.key for l in cfg.listeners] == ["rpc", "ha"]
    assert cfg.cluster.ha_master == "tcp:127.0.0.1:7851"


def test_ha_listener_off_loopback_needs_the_secret(tmp_path):
    """Without [cluster] secret an ha listener on all interfaces is refused, naming the fix; with one it is fine."""
    with pytest.raises(ConfigError, match=r"--ha tcp:7850:interface=0.0.0.0 is not on loopback: set \[cluster\] secret"):
        _cfg(tmp_path, *RPC, "--ha", "tcp:7850:interface=0.0.0.0")
    cfg = _cfg(tmp_path, *RPC, "--ha", "tcp:7850:interface=0.0.0.0", config='[cluster]\nsecret = "s"\n')
    assert cfg.listeners[-1].key == "ha"


def test_ha_master_off_loopback_needs_the_secret(tmp_path):
    """A slave would believe any master that answers at a remote address: it needs the secret too."""
    with pytest.raises(ConfigError, match="ha_master tcp:10.0.0.7:7850 is not on loopback"):
        _cfg(tmp_path, *RPC, "--ha-master", "tcp:10.0.0.7:7850")


@pytest.mark.parametrize("config, message", [
    ('[cluster]\nha_master = "7850"\n', "ha_master must be a client endpoint"),
    ("[cluster]\nha_max_time_slave_not_catchup = 0\n", "ha_max_time_slave_not_catchup must be positive"),
    ("[cluster]\nmin_in_sync_replicas = 0\n", "min_in_sync_replicas must be at least 1"),
])
def test_bad_replication_keys_are_named(tmp_path, config, message):
    """A bad [cluster] replication key is refused with its name."""
    with pytest.raises(ConfigError, match=message):
        _cfg(tmp_path, *RPC, config=config)


def test_the_acknowledgement_policy_reaches_the_replication_settings(tmp_path):
    """[cluster] all_ack_in_sync_state_set, min_in_sync_replicas and call_timeout are what the master acks by."""
    from cluster.roles.broker import BrokerParts

    cfg = _cfg(tmp_path, *RPC, "--ha", "tcp:0:interface=127.0.0.1",
               config="[cluster]\nall_ack_in_sync_state_set = false\nmin_in_sync_replicas = 2\ncall_timeout = 3.0\n")
    parts = BrokerParts(task.Clock(), cfg)
    try:
        s = parts.replication.master.settings
        assert (s.all_ack, s.min_in_sync_replicas, s.ack_timeout_s) == (False, 2, 3.0)
    finally:
        parts.state.store.close()


def test_a_slave_store_refuses_every_put(tmp_path):
    """A store that is a replica answers puts, submits and batches with SERVICE_NOT_AVAILABLE and writes nothing."""
    clock = task.Clock()
    store = MessageStore(str(tmp_path), StoreConfig(), clock, SynchronousExecutor())
    store.open()
    store.replica_of = "tcp:127.0.0.1:7850"
    got = []
    store.put(Message(topic="t", body=b"x")).addCallback(got.append)
    store.submit(Message(topic="t", body=b"x"), got.append)
    store.submit_batch([Message(topic="t", body=b"x")] * 2, got.extend)
    clock.advance(0)
    assert [r.status for r in got] == [PutStatus.SERVICE_NOT_AVAILABLE] * 4
    assert "slave of tcp:127.0.0.1:7850" in got[0].reason
    assert store.commit_log.max_offset == 0
    store.close()


def test_paused_timers_deliver_nothing_until_started_again(tmp_path):
    """A broker that becomes a slave pauses its timers (its master delivers); when it is master again they
    deliver what came due meanwhile."""
    from tests.unit.test_timer_service import Node

    n = Node(tmp_path)
    n.schedule(Message("dev/1/cmd", b"later", qos=1), n.now_ms() + 500)
    n.timers.pause()
    n.run_for(2.0)
    assert n.bodies("%TOPIC%dev") == []
    n.timers.start()
    n.run_for(0.5)
    assert n.bodies("%TOPIC%dev") == [b"later"]


def test_a_slave_retention_keeps_what_its_master_would_carry_and_deletes_the_rest(tmp_path):
    """A slave writes no carried copies (a put would fork its log): its retention deletes the segments below the
    oldest record a carrier still needs and keeps that one, instead of failing the whole pass."""
    from tests.unit.test_retention import Node, _msgs, _publish

    node = Node(tmp_path / "n")
    try:
        _publish(node, "noise/0", _msgs(0, 100))
        _publish(node, "keep/r", [b"value"], retain=True)
        _publish(node, "noise/1", _msgs(100, 200))
        kept = node.retained.get("keep/r").cl_offset
        node.store.replica_of = "tcp:127.0.0.1:7850"
        report = node.retention()
        assert report.carried == 0 and report.deleted
        assert 0 < node.store.commit_log.min_offset <= kept
        assert node.retained.get("keep/r").cl_offset == kept
    finally:
        node.store.replica_of = ""
        node.close()
