"""The controllers' replica state of broker groups (RIP-44): register, AlterSyncStateSet, ElectMaster; pure."""

from __future__ import annotations

from cluster.controller import replicas as r
from cluster.controller.metadata import Metadata
from cluster.controller.replicas import Replicas


def group_of_three(can_master=True) -> Replicas:
    """Brokers b1, b2, b3 registered in g1 in that order; b1 masters, its set is itself."""
    rep = Replicas()
    for b in ("b1", "b2", "b3"):
        rep.register_broker("g1", b, f"tcp:127.0.0.1:{9000 + int(b[1])}", can_master)
    return rep


def test_the_first_broker_that_may_master_an_empty_group_becomes_its_master():
    """RIP-44: the first broker to register in a group without a master masters it, its set only itself."""
    code, info = group_of_three().register_broker("g1", "b2", "", True)
    assert code == r.OK
    assert (info["master"], info["master_epoch"], info["sync_state_set"], info["set_epoch"]) == ("b1", 1, ["b1"], 1)
    assert info["brokers"] == {"b1": 1, "b2": 2, "b3": 3} and info["master_broker_id"] == 1
    assert info["master_address"] == "tcp:127.0.0.1:9001"


def test_a_broker_that_may_not_master_waits_for_one_that_may():
    """A broker registering with can_master false (it has an epoch file: it was a slave) never masters by it."""
    rep = Replicas()
    _, info = rep.register_broker("g1", "b2", "", False)
    assert info["master"] is None and info["master_epoch"] == 0
    _, info = rep.register_broker("g1", "b1", "", True)
    assert info["master"] == "b1" and info["brokers"] == {"b2": 1, "b1": 2}


def test_a_broker_keeps_its_broker_id_when_it_registers_again():
    """Broker ids are assigned once per broker and kept across its restarts."""
    rep = group_of_three()
    _, info = rep.register_broker("g1", "b3", "tcp:127.0.0.1:9999", True)
    assert info["brokers"]["b3"] == 3 and info["addresses"]["b3"] == "tcp:127.0.0.1:9999"
    assert info["master"] == "b1" and info["master_epoch"] == 1


def test_only_the_master_at_the_current_epochs_alters_the_set():
    """AlterSyncStateSet: a slave, a stale master epoch or a stale set epoch is refused and changes nothing."""
    rep = group_of_three()
    assert rep.alter_sync_state_set("g1", "b2", 1, ["b1", "b2"], 1)[0] == r.NOT_MASTER
    assert rep.alter_sync_state_set("g1", "b1", 0, ["b1", "b2"], 1)[0] == r.STALE_MASTER_EPOCH
    assert rep.alter_sync_state_set("g1", "b1", 1, ["b1", "b2"], 0)[0] == r.STALE_SET_EPOCH
    assert rep.alter_sync_state_set("nope", "b1", 1, ["b1"], 1)[0] == r.UNKNOWN_GROUP
    code, info = rep.alter_sync_state_set("g1", "b1", 1, ["b3", "b1", "b2"], 1)
    assert code == r.OK and info["sync_state_set"] == ["b1", "b2", "b3"] and info["set_epoch"] == 2
    assert info["sync_state_set_broker_ids"] == [1, 2, 3]


def test_a_set_without_the_master_or_with_a_stranger_is_refused():
    """The master cannot be removed from the set, and only registered brokers join it."""
    rep = group_of_three()
    assert rep.alter_sync_state_set("g1", "b1", 1, ["b2"], 1)[0] == r.BAD_SET
    assert rep.alter_sync_state_set("g1", "b1", 1, ["b1", "x9"], 1)[0] == r.BAD_SET
    assert rep.view()["g1"]["set_epoch"] == 1


def test_election_picks_an_alive_member_of_the_set_and_resets_the_set():
    """ElectMaster: the first alive set member other than the master; master epoch +1, the set is the new master."""
    rep = group_of_three()
    rep.alter_sync_state_set("g1", "b1", 1, ["b1", "b2", "b3"], 1)
    code, info = rep.elect_master("g1", None, ["b3"], False)
    assert code == r.OK
    assert (info["master"], info["master_epoch"], info["sync_state_set"], info["set_epoch"]) == ("b3", 2, ["b3"], 3)


def test_a_named_broker_must_be_in_the_set_and_alive():
    """A manual elect-master names a broker of the SyncStateSet that is alive; otherwise it is refused."""
    rep = group_of_three()
    rep.alter_sync_state_set("g1", "b1", 1, ["b1", "b2"], 1)
    assert rep.elect_master("g1", "b3", ["b2", "b3"], False)[0] == r.NOT_IN_SET
    assert rep.elect_master("g1", "b2", ["b3"], False)[0] == r.NOT_ALIVE
    assert rep.elect_master("g1", "zz", ["zz"], False)[0] == r.UNKNOWN_BROKER
    code, info = rep.elect_master("g1", "b2", ["b1", "b2"], False)
    assert code == r.OK and info["master"] == "b2" and info["master_epoch"] == 2


def test_no_candidate_without_unclean_election():
    """With no alive member of the set, nobody is elected unless unclean election is allowed."""
    rep = group_of_three()
    assert rep.elect_master("g1", None, ["b2"], False)[0] == r.NO_CANDIDATE
    code, info = rep.elect_master("g1", None, ["b2"], True)
    assert code == r.OK and info["master"] == "b2"


def test_metadata_moves_its_version_on_replica_changes_only_and_snapshots_them():
    """A refused replica command leaves the metadata version alone; the replicas survive to_dict/from_dict, and a
    schema 1 snapshot (before replicas) still reads."""
    m = Metadata()
    m.register_broker("g1", "b1", "tcp:127.0.0.1:1", True)
    version = m.version
    assert m.alter_sync_state_set("g1", "b2", 1, ["b1"], 1)[0] == r.NOT_MASTER and m.version == version
    copy = Metadata.from_dict(m.to_dict())
    assert copy.view()["replicas"] == m.view()["replicas"] and copy.view()["replicas"]["g1"]["master"] == "b1"
    old = {k: v for k, v in m.to_dict().items() if k != "replicas"}
    assert Metadata.from_dict({**old, "schema": 1}).view()["replicas"] == {}
