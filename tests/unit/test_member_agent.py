"""The member's discovery agent: finds the leader, renews its lease, registers again when it lost it, and reads
the metadata when a newer version shows (pushed or in a heartbeat's answer). Controllers are stand-ins that
answer as the controller's RPC does; time is a task.Clock."""

from __future__ import annotations

import msgpack
from twisted.internet import defer, task

from cluster.discovery.agent import MemberAgent
from cluster.discovery.members import MemberRecord
from cluster.rpc.protocol import CallTimeout, NotConnected, RemoteError


class StandIn:
    """A controller as the agent's PeerClient sees it: ``call`` answers from a script of (ok, value)."""

    def __init__(self, peer_id: str, leader: bool = False) -> None:
        self.peer_id = peer_id
        self.leader = leader
        self.up = True
        self.calls: list[tuple[str, dict]] = []
        self.generation = 0
        self.version = 1
        self.listeners = []
        self.refuse_next: str | None = None
        self.health_flag = True

    @property
    def healthy(self) -> bool:
        """As PeerClient's: connected, and its last heartbeat said healthy."""
        return self.up and self.health_flag

    def on_event(self, listener) -> None:
        self.listeners.append(listener)

    def startService(self) -> None:  # noqa: N802
        pass

    def stopService(self):  # noqa: N802
        return defer.succeed(None)

    def call(self, request_type: str, body: bytes, timeout=None):
        request = msgpack.unpackb(body, raw=False)
        self.calls.append((request_type, request))
        if not self.up:
            return defer.fail(NotConnected(f"not connected to {self.peer_id}"))
        if request_type == "controller.metadata":
            return defer.succeed(msgpack.packb({"version": self.version, "members": []}))
        if not self.leader:
            return defer.fail(RemoteError("not_leader", "ask the leader"))
        if self.refuse_next:
            code, self.refuse_next = self.refuse_next, None
            return defer.fail(RemoteError(code, code))
        if request_type == "controller.register":
            self.generation += 1
            member = {**request["member"], "generation": self.generation}
            return defer.succeed(msgpack.packb({"member": member, "worker": 7, "version": self.version,
                                                "lease": 3.0, "heartbeat_interval": 1.0}))
        if request_type == "controller.heartbeat":
            assert request["generation"] == self.generation
            return defer.succeed(msgpack.packb({"version": self.version}))
        return defer.succeed(msgpack.packb({}))

    def kinds(self) -> list[str]:
        return [kind.split(".")[1] for kind, _ in self.calls]


def _agent(controllers):
    clock = task.Clock()
    record = lambda: MemberRecord("twistmq", "p1", "proxy")  # noqa: E731
    agent = MemberAgent(clock, controllers, record, heartbeat_interval=1.0)
    return clock, agent


def test_finds_the_leader_registers_and_heartbeats():
    """A follower's not_leader moves the agent on; the leader registers it (worker id), then gets heartbeats (as
    does the follower, which answers not_leader: every controller hears each beat)."""
    follower, leader = StandIn("c1"), StandIn("c2", leader=True)
    clock, agent = _agent([follower, leader])
    agent.startService()
    assert agent.joined and agent.worker == 7 and follower.kinds() == ["register"]
    clock.advance(1.0)
    clock.advance(1.0)
    assert leader.kinds() == ["register", "metadata", "heartbeat", "heartbeat"]
    assert follower.kinds() == ["register", "heartbeat", "heartbeat"] and agent.leader is leader


def test_a_lost_lease_means_registering_again():
    """stale_lease on a heartbeat (evicted while stopped) makes the next beat a register with a new generation."""
    leader = StandIn("c1", leader=True)
    clock, agent = _agent([leader])
    agent.startService()
    leader.refuse_next = "stale_lease"
    clock.advance(1.0)
    assert not agent.joined
    clock.advance(1.0)
    assert agent.joined and agent.generation == 2 and agent.registrations == 2


def test_a_new_leader_gets_the_same_generation():
    """The leader going down: the agent heartbeats the next controller with its generation (no re-register)."""
    old, new = StandIn("c1", leader=True), StandIn("c2")
    clock, agent = _agent([old, new])
    agent.startService()
    old.up, new.leader, new.generation = False, True, agent.generation
    clock.advance(1.0)  # c1 down: c2 in the same beat
    assert new.kinds() == ["heartbeat"] and agent.registrations == 1


def test_newer_version_in_a_heartbeat_or_a_push_is_read_once():
    """The metadata is read when a heartbeat answer or a pushed event shows a newer version, not otherwise."""
    leader = StandIn("c1", leader=True)
    clock, agent = _agent([leader])
    seen = []
    agent.on_metadata(seen.append)
    agent.startService()
    assert [m["version"] for m in seen] == [1]
    clock.advance(1.0)
    assert leader.kinds().count("metadata") == 1
    leader.version = 2
    clock.advance(1.0)
    leader.version = 3
    leader.listeners[0]("metadata", msgpack.packb({"version": 3}))
    leader.listeners[0]("metadata", msgpack.packb({"version": 3}))
    leader.listeners[0]("metadata", b"\xc1 not msgpack")
    assert [m["version"] for m in seen] == [1, 2, 3] and leader.kinds().count("metadata") == 3


def test_stop_says_goodbye_to_end_the_lease_now():
    """Stopping a joined agent deregisters with its generation, so it is not listed joined for a lease more."""
    leader = StandIn("c1", leader=True)
    clock, agent = _agent([leader])
    agent.startService()
    agent.stopService()
    assert leader.calls[-1] == ("controller.deregister", {"node_id": "p1", "generation": 1})


def test_one_beat_tries_each_controller_until_the_leader():
    """not_leader or a controller that is down moves on at once within the beat (each tried once), so a member
    finds a new leader without waiting a heartbeat per controller."""
    down, follower, leader = StandIn("c1"), StandIn("c2"), StandIn("c3", leader=True)
    down.up = False
    clock, agent = _agent([down, follower, leader])
    agent.startService()
    assert agent.joined and down.kinds() == ["register"] and follower.kinds() == ["register"]
    leader.leader = False
    clock.advance(1.0)  # nobody leads: each tried once, then the beat ends
    assert leader.kinds()[-1] == "heartbeat" and down.kinds() == ["register", "heartbeat"]
    assert follower.kinds() == ["register", "heartbeat"]


def test_metadata_is_read_from_a_healthy_controller():
    """Reading the metadata has no fixed target: an unhealthy leader is skipped for a healthy follower, while
    registering and the lease stay with the leader; with every controller unhealthy the leader answers."""
    follower, leader = StandIn("c1"), StandIn("c2", leader=True)
    clock, agent = _agent([leader, follower])
    leader.health_flag = False
    seen = []
    agent.on_metadata(seen.append)
    agent.startService()
    assert leader.kinds() == ["register"] and follower.kinds() == ["metadata"] and len(seen) == 1
    follower.version = leader.version = 2
    clock.advance(1.0)
    assert leader.kinds() == ["register", "heartbeat"] and follower.kinds() == ["metadata", "metadata", "heartbeat"]
    follower.health_flag = False
    follower.version = leader.version = 3
    clock.advance(1.0)
    assert leader.kinds()[-1] == "metadata" and [m["version"] for m in seen] == [1, 2, 3]


class Stopped(StandIn):
    """A SIGSTOPped controller: connected, but a call fails only when its timeout (5 s by default, the RPC
    protocol's call_timeout) runs out on the clock."""

    def __init__(self, peer_id: str, clock, leader: bool = False) -> None:
        super().__init__(peer_id, leader)
        self.clock = clock
        self.stopped = False

    def call(self, request_type: str, body: bytes, timeout=None):
        if not self.stopped:
            return super().call(request_type, body, timeout)
        self.calls.append((request_type, msgpack.unpackb(body, raw=False)))
        d = defer.Deferred()
        self.clock.callLater(5.0 if timeout is None else timeout, d.errback, CallTimeout("no answer"))
        return d


def test_a_stopped_leader_is_left_for_the_new_one_within_three_heartbeats():
    """The leader is SIGSTOPped (connection open, no answer) and c2 leads with the same records: the agent
    heartbeats c2 with its generation within 3 s, before the new leader's one-lease grace ends."""
    clock = task.Clock()
    old, new = Stopped("c1", clock, leader=True), StandIn("c2")
    agent = MemberAgent(clock, [old, new], lambda: MemberRecord("twistmq", "p1", "proxy"), heartbeat_interval=1.0)
    agent.startService()
    clock.advance(1.0)
    assert agent.generation == 1
    old.stopped, new.leader, new.generation = True, True, agent.generation
    for _ in range(30):
        clock.advance(0.1)
    assert ("controller.heartbeat", "c2") in [(kind, "c2") for kind, _ in new.calls]
    assert agent.generation == 1
    agent.stopService()


def test_each_heartbeat_reaches_every_controller_so_a_new_leader_renews_within_one_beat():
    """The agent's leader is SIGSTOPped and the third controller leads with the same records: it renews this
    member's lease at the next beat (not after the stopped one's timeout and a not_leader), and the stopped one,
    unanswered, holds up no beat."""
    clock = task.Clock()
    old, follower, new = Stopped("c1", clock, leader=True), StandIn("c2"), StandIn("c3")
    agent = MemberAgent(clock, [old, follower, new], lambda: MemberRecord("twistmq", "p1", "proxy"),
                        heartbeat_interval=1.0)
    agent.startService()
    old.stopped, new.leader, new.generation = True, True, agent.generation
    clock.advance(1.0)
    assert new.kinds() == ["heartbeat"] and agent.leader is new
    clock.advance(1.0)
    clock.advance(1.0)
    assert new.kinds() == ["heartbeat"] * 3 and old.kinds().count("heartbeat") <= 2 and agent.generation == 1
    agent.stopService()
