"""A new controller leader's takeover, on a task.Clock: it has seen no heartbeats yet, so every member it finds
committed gets one lease from the takeover before any is evicted (DESIGN: the grace period of one lease); a
leader that was paused (SIGSTOP) gives its brokers the same grace instead of declaring them dead.

The Raft log is a stand-in that applies each command to a real ``Metadata`` at once (the controller's
collaborator; pysyncobj itself is exercised by the controller integration tests).
"""

from __future__ import annotations

import logging

import msgpack
from twisted.internet import defer, task

from cluster.controller.metadata import Metadata
from cluster.controller.service import Controller
from cluster.discovery.leases import LeaseTimings
from cluster.discovery.members import MemberRecord

LEASE = 3.0


class InstantRaft:
    """The RaftNode surface Controller uses, committing every command at once."""

    def __init__(self, metadata: Metadata) -> None:
        self.metadata = metadata
        self.address = "127.0.0.1:7900"
        self.term = 4
        self.is_leader = False
        self.leader = None
        self._leadership = []

    def on_leadership(self, listener) -> None:
        self._leadership.append(listener)

    def on_change(self, listener) -> None:
        pass

    def read(self, fn):
        return fn(self.metadata)

    def commit(self, name: str, *args) -> defer.Deferred:
        return defer.succeed(True if name == "barrier" else getattr(self.metadata, name)(*args))

    def enable_code(self) -> defer.Deferred:
        return defer.succeed(None)

    def elected(self) -> None:
        self.is_leader, self.leader = True, self.address
        for listener in self._leadership:
            listener(True)


def _takeover(heartbeat_age: float):
    """A controller becoming leader at t=100 over b1 and p1, whose last heartbeats (to the old leader) are
    ``heartbeat_age`` seconds old."""
    clock = task.Clock()
    clock.advance(100.0)
    metadata = Metadata()
    metadata.seed({"g1": [[0, 1023]]}, {})
    for node_id, node_type, generation in (("b1", "broker", 3 << 32 | 1), ("p1", "proxy", 3 << 32 | 2)):
        metadata.join(MemberRecord("twistmq", node_id, node_type, group="g1" if node_type == "broker" else "",
                                   last_heartbeat=100.0 - heartbeat_age, generation=generation).as_dict())
    raft = InstantRaft(metadata)
    controller = Controller(clock, raft, "twistmq", LeaseTimings(LEASE, 0.1, 60.0, 64), 1.0, ({}, {}))
    raft.elected()
    return clock, metadata, controller


def _joined(metadata: Metadata) -> set[str]:
    return {n for n, m in metadata.members.items() if m["joined"]}


def test_a_new_leader_evicts_no_member_before_one_lease_from_its_takeover():
    """Members whose last heartbeat is 10 leases old are not evicted at the takeover, nor before one lease
    after it; silent for that lease, they are."""
    clock, metadata, controller = _takeover(heartbeat_age=10 * LEASE)
    assert controller.table is not None
    for _ in range(29):
        clock.advance(0.1)
    assert _joined(metadata) == {"b1", "p1"}
    for _ in range(3):
        clock.advance(0.1)
    assert _joined(metadata) == set()
    controller.stop()


def test_a_member_heartbeating_the_new_leader_keeps_its_lease():
    """The broker that heartbeats the new leader within the grace stays; the silent proxy is evicted."""
    clock, metadata, controller = _takeover(heartbeat_age=LEASE / 2)
    table = controller.table
    for _ in range(60):
        clock.advance(0.1)
        if round(clock.seconds() * 10) % 10 == 0:
            table.heartbeat("twistmq", "b1", metadata.members["b1"]["generation"], clock.seconds())
    assert _joined(metadata) == {"b1"}
    controller.stop()


class Handlers:
    """The RPC dispatcher's surface: the controller registers its handlers here and the test calls them."""

    def __init__(self) -> None:
        self.handlers = {}

    def register(self, name: str, handler) -> None:
        self.handlers[name] = handler

    def call(self, name: str, **body):
        return self.handlers[name](None, msgpack.packb(body))


def _group_of_three():
    """A leader at t=100 over group g1: master b1, SyncStateSet b1, b2, b3; each broker heartbeating it."""
    clock = task.Clock()
    clock.advance(100.0)
    metadata = Metadata()
    metadata.seed({"g1": [[0, 1023]]}, {})
    for broker in ("b1", "b2", "b3"):
        metadata.register_broker("g1", broker, f"tcp:127.0.0.1:{broker[1]}", broker == "b1")
    code, _ = metadata.alter_sync_state_set("g1", "b1", 1, ["b1", "b2", "b3"], 1)
    assert code == "ok"
    raft = InstantRaft(metadata)
    controller = Controller(clock, raft, "twistmq", LeaseTimings(LEASE, 0.1, 60.0, 64), 1.0, ({}, {}))
    rpc = Handlers()
    controller.register(rpc)
    raft.elected()
    return clock, metadata, controller, rpc


def _beat(clock, rpc, seconds: float, brokers=("b1", "b2", "b3")) -> None:
    """``seconds`` of broker heartbeats every 0.5 s, the clock advancing in 0.1 s steps."""
    for step in range(round(seconds * 10)):
        if step % 5 == 0:
            for broker in brokers:
                rpc.call("controller.broker_heartbeat", group="g1", broker=broker, max_offset=0)
        clock.advance(0.1)


def test_a_paused_leader_declares_no_live_broker_dead_and_elects_nobody(caplog):
    """The leader's reactor stops for 10 s (SIGSTOP) and, on SIGCONT, its slaves' heartbeats are read before the
    master's: no broker_dead, no election (the master's heartbeat comes within the grace); the pause is logged."""
    clock, metadata, controller, rpc = _group_of_three()
    _beat(clock, rpc, 5.0)  # past the takeover's grace
    caplog.set_level(logging.INFO, logger="twistmq.controller")
    clock.advance(10.0)  # SIGSTOP .. SIGCONT: the scan runs once, 10 s after the last one
    _beat(clock, rpc, 0.7, brokers=("b2", "b3"))
    _beat(clock, rpc, 5.0)
    info = controller.replica_info("g1")
    assert (info["master"], info["master_epoch"], controller.elections) == ("b1", 1, 0)
    assert "broker_dead" not in caplog.text and "controller_paused" in caplog.text
    controller.stop()


def test_a_master_silent_after_the_pause_is_replaced_once_the_grace_ends():
    """After a pause, a master that never heartbeats again is replaced by a slave of the set after the grace."""
    clock, metadata, controller, rpc = _group_of_three()
    _beat(clock, rpc, 5.0)
    clock.advance(10.0)
    _beat(clock, rpc, LEASE - 0.5, brokers=("b2", "b3"))
    assert controller.replica_info("g1")["master"] == "b1"
    _beat(clock, rpc, 1.5, brokers=("b2", "b3"))
    info = controller.replica_info("g1")
    assert (info["master"], info["master_epoch"], controller.elections) == ("b2", 2, 1)
    controller.stop()


def test_a_paused_leader_evicts_no_member_that_heartbeats_within_a_lease_of_its_return():
    """The leader's reactor stops for 10 s (three leases): on its return no member is evicted; one that stays
    silent for a lease after the return is."""
    clock, metadata, controller = _takeover(heartbeat_age=0.0)
    table = controller.table
    for step in range(50):
        if step % 10 == 0:
            table.heartbeat("twistmq", "b1", metadata.members["b1"]["generation"], clock.seconds())
            table.heartbeat("twistmq", "p1", metadata.members["p1"]["generation"], clock.seconds())
        clock.advance(0.1)
    clock.advance(10.0)  # SIGSTOP .. SIGCONT
    assert _joined(metadata) == {"b1", "p1"}
    for step in range(32):
        if step % 10 == 5:
            table.heartbeat("twistmq", "b1", metadata.members["b1"]["generation"], clock.seconds())
        clock.advance(0.1)
    assert _joined(metadata) == {"b1"}
    controller.stop()
