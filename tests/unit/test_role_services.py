"""The role service tree (cluster/runtime/services.py) and the roles table (cluster/roles/table.py), without sockets."""

from __future__ import annotations

import pytest
from twisted.internet import defer, endpoints, protocol
from twisted.internet.testing import MemoryReactor
from twisted.python import usage

from cluster.roles.table import ROLES, role
from cluster.runtime.listeners import parse_listener
from cluster.runtime.services import ListenerService, OrderedServices, Part
from cluster.tap import Options


def _recording_tree(events, gates):
    """A tree of three parts whose start/stop record themselves; each start waits on its gate."""
    tree = OrderedServices()
    for name in ("store", "broker", "listener"):
        Part(name, start=lambda n=name: (events.append(f"start {n}"), gates[n])[1],
             stop=lambda n=name: events.append(f"stop {n}")).setServiceParent(tree)
    return tree


def test_children_start_in_order_each_after_the_previous_one_finished():
    """A child starts only once the Deferred of the one before it fired (recovery before listeners)."""
    events, gates = [], {n: defer.Deferred() for n in ("store", "broker", "listener")}
    tree = _recording_tree(events, gates)
    done = tree.startService()
    assert events == ["start store"]
    gates["store"].callback(None)
    assert events == ["start store", "start broker"]
    gates["broker"].callback(None)
    gates["listener"].callback(None)
    assert events[-1] == "start listener" and done.called


def test_children_stop_in_reverse_order():
    """Stopping unwinds the tree: the listener first, the store last."""
    events, gates = [], {n: defer.succeed(None) for n in ("store", "broker", "listener")}
    tree = _recording_tree(events, gates)
    tree.startService()
    del events[:]
    tree.stopService()
    assert events == ["stop listener", "stop broker", "stop store"]


def test_a_failed_start_leaves_later_children_unstarted_and_stops_only_what_ran():
    """When a child fails to start, the ones after it never start and a stop skips them."""
    events = []
    gates = {"store": defer.succeed(None), "broker": defer.fail(RuntimeError("recovery failed")),
             "listener": defer.succeed(None)}
    tree = _recording_tree(events, gates)
    failures = []
    tree.startService().addErrback(failures.append)
    assert "start listener" not in events and failures[0].check(RuntimeError)
    del events[:]
    tree.stopService()
    assert events == ["stop broker", "stop store"]


def test_listener_binds_when_the_tree_reaches_it_not_in_privileged_start():
    """twistd's privilegedStartService binds nothing: a listener binds in start order and unbinds on stop."""
    reactor = MemoryReactor()
    listener = parse_listener("mqtt", "tcp:1883:interface=127.0.0.1")
    svc = ListenerService(listener, endpoints.serverFromString(reactor, listener.description),
                          protocol.Factory.forProtocol(protocol.Protocol))
    tree = OrderedServices()
    svc.setServiceParent(tree)
    tree.privilegedStartService()
    assert reactor.tcpServers == []
    tree.startService()
    assert [(port, interface) for port, _, _, interface in reactor.tcpServers] == [(1883, "127.0.0.1")]
    assert svc.port is not None
    tree.stopService()
    assert svc.port is None and not svc.running


def test_every_role_of_the_table_is_a_subcommand():
    """The roles table is the one list of roles: each row is a twistd subcommand with its options."""
    options = Options()
    assert [c[0] for c in options.subCommands] == [row.name for row in ROLES]
    options.parseOptions(["node", "--data-dir", "/nonexistent/d"])
    assert options.subCommand == "node" and options.subOptions["data-dir"] == "/nonexistent/d"


def test_no_role_and_an_unknown_role_are_usage_errors():
    """twistmq without a role, or with one not in the table, is a usage error naming the known roles."""
    with pytest.raises(usage.UsageError, match="node"):
        Options().parseOptions([])
    with pytest.raises(usage.UsageError, match="known: node"):
        role("bogus")
