"""A new controller leader's takeover, on a task.Clock: it has seen no heartbeats yet, so every member it finds
committed gets one lease from the takeover before any is evicted (DESIGN: the grace period of one lease).

The Raft log is a stand-in that applies each command to a real ``Metadata`` at once (the controller's
collaborator; pysyncobj itself is exercised by the controller integration tests).
"""

from __future__ import annotations

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
