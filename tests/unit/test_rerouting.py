"""A proxy's routes follow the controllers' metadata: the slot table and routes it describes win over the
config's, a group whose broker moved is re-dialled, a group new to the proxy gets a store, and metadata
naming a group no broker address is known for is not applied (pure: stand-in stores, no sockets)."""

from __future__ import annotations

import pytest

from cluster.discovery.members import broker_addresses
from cluster.remote.rerouting import Rerouter
from cluster.remote.routed_store import RoutedStore
from cluster.routing import RoutingError, SlotTable


class _Group:
    """A stand-in for one group's store: the rerouter only hands it to ``move``."""

    def __init__(self, name: str) -> None:
        self.name = name


def _broker(node_id, group, address, joined=True, generation=1):
    return {"node_id": node_id, "node_type": "broker", "group": group, "rpc_address": address, "joined": joined,
            "generation": generation}


def _metadata(version, members, slots=None, routes=None):
    return {"version": version, "members": members, "slots": slots or {"g1": [[0, 511]], "g2": [[512, 1023]]},
            "routes": routes or {}, "groups": {}}


@pytest.fixture
def proxy():
    """A routed store built from a config with an explicit route, and a rerouter that records what it does."""
    groups = {"g1": _Group("g1"), "g2": _Group("g2")}
    config_table = SlotTable.build(("g1", "g2"), None, {"sensors": "g1"})
    routed = RoutedStore(config_table, groups)
    done = []

    def connect(group, address):
        done.append(("connect", group, address))
        return _Group(group)

    def move(store, address):
        done.append(("move", store.name, address))

    rerouter = Rerouter(routed, {"g1": "tcp:127.0.0.1:7001", "g2": "tcp:127.0.0.1:7002"}, connect, move)
    return routed, rerouter, done


def test_the_controllers_slots_and_routes_win_over_the_config(proxy):
    """Metadata without the config's route: the proxy routes that first level by its slot from then on."""
    routed, rerouter, done = proxy
    assert routed.table.group_of_topic("sensors/t") == "g1"
    members = [_broker("b1", "g1", "tcp:127.0.0.1:7001"), _broker("b2", "g2", "tcp:127.0.0.1:7002")]
    assert rerouter.apply(_metadata(3, members, routes={"other": "g2"}))
    assert routed.table == SlotTable.from_metadata(_metadata(3, members, routes={"other": "g2"}))
    assert routed.table.routes == {"other": "g2"} and rerouter.version == 3
    assert done == []  # the addresses did not change: nobody is re-dialled


def test_a_group_whose_broker_moved_is_redialled_once(proxy):
    """A broker of g1 advertising another address: g1's store is moved there; the same metadata again moves
    nothing."""
    routed, rerouter, done = proxy
    members = [_broker("b1", "g1", "tcp:127.0.0.1:7101", generation=2), _broker("b2", "g2", "tcp:127.0.0.1:7002")]
    assert rerouter.apply(_metadata(4, members))
    assert rerouter.apply(_metadata(5, members))
    assert done == [("move", "g1", "tcp:127.0.0.1:7101")] and rerouter.moves == 1
    assert rerouter.addresses["g1"] == "tcp:127.0.0.1:7101"


def test_a_new_group_gets_a_store_and_one_without_an_address_waits(proxy):
    """A group the proxy has no store for is connected at its broker's address; until a broker of it is known
    the metadata is not applied and the old table stays."""
    routed, rerouter, done = proxy
    slots = {"g1": [[0, 300]], "g2": [[301, 700]], "g3": [[701, 1023]]}
    before = routed.table
    members = [_broker("b1", "g1", "tcp:127.0.0.1:7001"), _broker("b2", "g2", "tcp:127.0.0.1:7002")]
    assert not rerouter.apply(_metadata(6, members, slots))
    assert routed.table is before and done == []
    members.append(_broker("b3", "g3", "tcp:127.0.0.1:7003"))
    assert rerouter.apply(_metadata(7, members, slots))
    assert done == [("connect", "g3", "tcp:127.0.0.1:7003")]
    assert routed.table.groups == ("g1", "g2", "g3") and set(routed.groups) == {"g1", "g2", "g3"}


def test_metadata_without_a_usable_slot_table_is_not_applied(proxy):
    """No slots (controllers not seeded yet) or malformed ranges: logged, the proxy keeps its table."""
    routed, rerouter, _done = proxy
    before = routed.table
    assert not rerouter.apply({"version": 1, "members": [], "slots": {}, "routes": {}})
    assert not rerouter.apply({"version": 2, "members": [], "slots": {"g1": [["x"]]}, "routes": {}})
    assert routed.table is before
    with pytest.raises(RoutingError):
        SlotTable.from_metadata({"slots": {"g1": [[0, 10]]}})  # slots unassigned


def test_broker_addresses_prefer_a_live_broker_then_the_newest_registration():
    """Per group: a joined broker over one whose lease ended, then the highest generation; records without an
    address others can dial (none, or the unspecified host) or of other roles are ignored."""
    members = [
        _broker("old", "g1", "tcp:127.0.0.1:1", joined=False, generation=9),
        _broker("new", "g1", "tcp:127.0.0.1:2", generation=5),
        _broker("newer", "g2", "tcp:127.0.0.1:3", generation=7),
        _broker("older", "g2", "tcp:127.0.0.1:4", generation=6),
        _broker("silent", "g3", ""),
        _broker("everywhere", "g4", "tcp:0.0.0.0:7800"),  # bound to all interfaces, no advertise_rpc
        _broker("v6", "g4", "tcp:::7800"),
        {"node_id": "p", "node_type": "proxy", "rpc_address": "tcp:127.0.0.1:5", "joined": True},
        "not a record",
    ]
    assert broker_addresses(members) == {"g1": "tcp:127.0.0.1:2", "g2": "tcp:127.0.0.1:3"}


def test_dialable_addresses():
    """tcp, tcp6 and ssl with a real host, and unix sockets, are dialable; the unspecified host and other kinds
    are not."""
    from cluster.discovery.members import dialable
    for good in ("tcp:127.0.0.1:7800", "tcp:broker-1.example:7800", "tcp:host=10.0.0.5:port=7800", "unix:/run/b.sock",
                 "ssl:10.0.0.5:7800"):
        assert dialable(good), good
    for bad in ("", None, "tcp:0.0.0.0:7800", "tcp:::7800", "tcp:host=0.0.0.0:port=1", "udp:1.2.3.4:7800", "unix:"):
        assert not dialable(bad), bad


def test_a_replicated_group_is_routed_to_the_master_the_controllers_name(proxy):
    """Three brokers of g1: the proxy dials the one ``replicas`` names master (not the newest registration), and
    moves to the new master when an election names another."""
    routed, rerouter, done = proxy
    members = [_broker("b1-1", "g1", "tcp:127.0.0.1:7001", generation=1),
               _broker("b1-2", "g1", "tcp:127.0.0.1:7011", generation=2),
               _broker("b1-3", "g1", "tcp:127.0.0.1:7021", generation=3),
               _broker("b2", "g2", "tcp:127.0.0.1:7002")]
    metadata = _metadata(7, members)
    metadata["replicas"] = {"g1": {"master": "b1-1", "master_epoch": 1}}
    assert rerouter.apply(metadata)
    assert done == []  # b1-1 is where it dials already
    metadata = _metadata(8, members)
    metadata["replicas"] = {"g1": {"master": "b1-2", "master_epoch": 2}}
    assert rerouter.apply(metadata)
    assert done == [("move", "g1", "tcp:127.0.0.1:7011")]
