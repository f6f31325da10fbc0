"""A broker's replica agent follows the controllers (RIP-44): it registers before serving, takes the role their
answer names, switches when a heartbeat's answer names a new master, never goes back to an older master epoch, and
proposes SyncStateSet changes that apply only once accepted (pure: stand-in controllers and role, ``task.Clock``)."""

from __future__ import annotations

import msgpack
from twisted.internet import defer, task

from cluster.replication.controllers import ReplicaAgent
from cluster.rpc.protocol import CallTimeout, RemoteError


class _Controller:
    """One controller: answers each call with the next queued answer (bytes, or an exception to fail with)."""

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.answers: list = []
        self.calls: list[tuple[str, dict]] = []

    def startService(self):
        pass

    def stopService(self):
        return defer.succeed(None)

    def call(self, request_type, body, timeout=None):
        self.calls.append((request_type, msgpack.unpackb(body, raw=False)))
        answer = self.answers.pop(0) if self.answers else RemoteError("not_leader", "not the leader")
        return defer.fail(answer) if isinstance(answer, Exception) else defer.succeed(answer)


class _Sync:
    def __init__(self) -> None:
        self.members, self.epoch = frozenset(), 0

    def apply(self, members, epoch):
        self.members, self.epoch = frozenset(members), epoch


class _Master:
    def __init__(self) -> None:
        self.sync = _Sync()
        self.altering = False
        self.alter = None

    def set_alter(self, alter):
        self.alter = alter

    def update_confirm(self):
        return 0


class _Log:
    max_offset = 1234


class _Store:
    commit_log = _Log()


class _Role:
    """Records the switches it is asked for."""

    def __init__(self) -> None:
        self.store = _Store()
        self.master = _Master()
        self.switches: list[tuple] = []

    def become_master(self, epoch, members, set_epoch):
        self.switches.append(("master", epoch, sorted(members), set_epoch))
        self.master.sync.apply(members, set_epoch)
        return defer.succeed(None)

    def become_slave(self, address):
        self.switches.append(("slave", address))
        return defer.succeed(None)


def _info(master, epoch, members, set_epoch):
    return {"group": "g1", "master": master, "master_epoch": epoch, "sync_state_set": members,
            "set_epoch": set_epoch, "brokers": {"b1": 1, "b2": 2, "b3": 3},
            "addresses": {"b1": "tcp:127.0.0.1:7001", "b2": "tcp:127.0.0.1:7002", "b3": "tcp:127.0.0.1:7003"}}


def _answer(info) -> bytes:
    return msgpack.packb({"replica": info, "heartbeat_interval": 0.5})


def _agent(broker="b1", can_master=True):
    clock = task.Clock()
    role = _Role()
    controllers = [_Controller("c1"), _Controller("c2")]
    agent = ReplicaAgent(role, clock, controllers, "g1", broker, lambda: "tcp:127.0.0.1:7001", lambda: can_master)
    return clock, role, controllers, agent


def test_registers_then_masters_at_the_controllers_epoch_and_set():
    """The first answer names this broker master: it becomes master of that epoch with that set, and only then
    does start() fire; a not_leader controller is skipped within the same beat."""
    clock, role, (c1, c2), agent = _agent()
    c2.answers.append(_answer(_info("b1", 1, ["b1"], 1)))
    started = agent.start()
    assert started.called
    assert c1.calls[0][0] == "controller.register_broker" and c2.calls[0][1]["can_master"] is True
    assert c2.calls[0][1]["address"] == "tcp:127.0.0.1:7001" and c2.calls[0][1]["max_offset"] == 1234
    assert role.switches == [("master", 1, ["b1"], 1)]


def test_a_new_master_in_a_heartbeat_makes_it_a_slave_and_an_older_view_never_switches_back():
    """A heartbeat's answer naming b2 at epoch 2: slave of b2's ha address; metadata still at epoch 1 (a lagging
    controller) changes nothing."""
    clock, role, (c1, _c2), agent = _agent()
    c1.answers.append(_answer(_info("b1", 1, ["b1", "b2"], 2)))
    agent.start()
    c1.answers.append(_answer(_info("b2", 2, ["b2"], 3)))
    clock.advance(0.5)
    assert c1.calls[-1][0] == "controller.broker_heartbeat"
    assert role.switches[-1] == ("slave", "tcp:127.0.0.1:7002")
    agent.follow_metadata({"replicas": {"g1": _info("b1", 1, ["b1", "b2"], 2)}})
    assert len(role.switches) == 2


def test_a_sync_state_set_change_applies_only_once_accepted():
    """alter() proposes at the current master and set epochs: True when the controllers took it, False when they
    refused it (the agent then reads the replica info again at once)."""
    clock, role, (c1, _c2), agent = _agent()
    c1.answers.append(_answer(_info("b1", 1, ["b1"], 1)))
    agent.start()
    c1.answers.append(_answer(_info("b1", 1, ["b1", "b2"], 2)))
    got = []
    role.master.alter(frozenset({"b1", "b2"}), 2).addCallback(got.append)
    assert got == [True]
    assert c1.calls[-1] == ("controller.alter_sync_state_set", {"group": "g1", "master": "b1", "master_epoch": 1,
                                                                "sync_state_set": ["b1", "b2"], "set_epoch": 1})
    c1.answers.append(RemoteError("stale_set_epoch", "refused"))
    c1.answers.append(_answer(_info("b1", 1, ["b1", "b2", "b3"], 3)))
    role.master.alter(frozenset({"b1"}), 3).addCallback(got.append)
    assert got == [True, False]
    clock.advance(0)
    assert c1.calls[-1][0] == "controller.broker_heartbeat"
    assert (sorted(role.master.sync.members), role.master.sync.epoch) == (["b1", "b2", "b3"], 3)  # adopted


class _Stopped(_Controller):
    """A SIGSTOPped controller: the connection stays open, a call fails only when its timeout (5 s by default, the
    RPC protocol's call_timeout) runs out on the clock."""

    def __init__(self, peer_id: str, clock) -> None:
        super().__init__(peer_id)
        self.clock = clock
        self.stopped = False

    def call(self, request_type, body, timeout=None):
        if not self.stopped:
            return super().call(request_type, body, timeout)
        self.calls.append((request_type, msgpack.unpackb(body, raw=False)))
        d = defer.Deferred()
        self.clock.callLater(5.0 if timeout is None else timeout, d.errback, CallTimeout("no answer"))
        return d


def test_a_stopped_leader_is_left_for_the_new_one_within_two_heartbeats():
    """The controllers' leader is SIGSTOPped (its connection open, no answer) and c2 leads: the agent heartbeats c2
    within 1.5 s, before the new leader's one-lease grace (3 s) would count this broker dead."""
    clock = task.Clock()
    c1, c2 = _Stopped("c1", clock), _Controller("c2")
    agent = ReplicaAgent(_Role(), clock, [c1, c2], "g1", "b1", lambda: "tcp:127.0.0.1:7001", lambda: True)
    c1.answers.append(_answer(_info("b1", 1, ["b1"], 1)))
    agent.start()
    c1.stopped = True
    c2.answers.extend(_answer(_info("b1", 1, ["b1"], 1)) for _ in range(10))
    for _ in range(15):
        clock.advance(0.1)
    assert ("controller.broker_heartbeat", {"group": "g1", "broker": "b1", "max_offset": 1234}) in c2.calls


def test_each_heartbeat_reaches_every_controller_so_a_new_leader_hears_it_within_one_beat():
    """The agent's turn points at a SIGSTOPped controller and the third one leads: the new leader hears this broker
    at the next beat (not after the stopped one's timeout and a not_leader), and the stopped one, unanswered,
    holds up no beat."""
    clock = task.Clock()
    c1, c2, c3 = _Stopped("c1", clock), _Controller("c2"), _Controller("c3")
    agent = ReplicaAgent(_Role(), clock, [c1, c2, c3], "g1", "b1", lambda: "tcp:127.0.0.1:7001", lambda: True)
    c1.answers.append(_answer(_info("b1", 1, ["b1"], 1)))
    agent.start()
    c1.stopped = True
    c3.answers.extend(_answer(_info("b1", 1, ["b1"], 1)) for _ in range(10))
    clock.advance(0.5)
    assert [call[0] for call in c3.calls] == ["controller.broker_heartbeat"]
    for _ in range(10):
        clock.advance(0.1)
    assert len(c3.calls) == 3 and len(c1.calls) <= 3  # one unanswered heartbeat at a time to the stopped one
