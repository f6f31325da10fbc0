"""A broker's replica agent: its role as the controllers decide it (RIP-44's RegisterBroker, BrokerHeartbeat,
AlterSyncStateSet, GetReplicaInfo through the heartbeat's answer).

Before the broker serves, ``start()`` registers it (``controller.register_broker``; it may master an empty
group only when it has no epoch yet and its config names no master) and follows the answer: the broker named
master becomes master of the answer's master epoch, with the controllers' SyncStateSet and set epoch; any
other broker replicates from the master's advertised ``ha`` address. Then it heartbeats the controllers
every ``heartbeat_interval`` (its max offset with each beat) and follows every answer, so a master
elected while it was away (or a lost notification) switches it at the next beat: a killed master relaunched
with its old argv comes back as a slave. The member agent's pushed metadata (``follow_metadata``) switches it
sooner: a master deposed by hand stops taking writes as soon as it hears.

``alter(members, new_set_epoch)`` is ``HAMaster``'s hook: the master proposes the new SyncStateSet to the
controllers' leader at its master epoch and current set epoch; it fires True once they accepted it, False
when refused (the agent then re-reads the replica info at once) or unreachable: the master keeps its old set.

While no controller answers, the broker keeps its role: a controller outage never stops a running broker.
Registration goes to one controller at a time (``not_leader``, a controller that is down, or no answer
moves it to the next at once). Each heartbeat goes to every controller in the same beat: whichever leads
hears this broker within one interval, however often the lead moved (a resumed controller's election, then
another's, each new leader giving brokers only one lease of grace), and a controller that does not answer
(SIGSTOPped, its connection still open) holds up no beat: it gets no new heartbeat while one to it is
unanswered, and that one gives up after two heartbeat intervals.
"""

from __future__ import annotations

import logging
from typing import Callable

import msgpack
from twisted.application import service
from twisted.internet import defer, task

from cluster.replication.role import ReplicaRole
from cluster.rpc.peer import call_each

log = logging.getLogger("twistmq.ha")

_NEXT = ("not_leader", "not_connected", "timeout")
HEARTBEAT_TIMEOUT = 2.0
"""Heartbeat intervals a heartbeat waits for its answer before the agent tries the next controller."""


class ReplicaAgent(service.Service):
    """``ReplicaAgent(role, clock, controllers, group, broker, ha_address, can_master)``.

    ``controllers``: a ``PeerClient`` per controller (this agent starts and stops them); ``ha_address()``: the
    client endpoint string its group's slaves dial for this broker (bound listeners are known only at start).
    """

    def __init__(self, role: ReplicaRole, clock, controllers: list, group: str, broker: str,
                 ha_address: Callable[[], str], can_master: Callable[[], bool],
                 heartbeat_interval: float = 0.5) -> None:
        self.setName("replica-agent")
        self.role = role
        self.clock = clock
        self.controllers = controllers
        self.group = group
        self.broker = broker
        self.ha_address = ha_address
        self.can_master = can_master
        self.heartbeat_interval = heartbeat_interval
        self.info: dict | None = None
        """The replica info last heard."""
        self.following: tuple | None = None
        """(master, master_epoch, master's address) the role follows now."""
        self.switches = 0
        """Role changes made (for metrics and tests)."""
        self._turn = 0
        self._busy = False
        self._beating: set[int] = set()  # controllers with a heartbeat unanswered
        self._switching: defer.Deferred | None = None
        self._pending: dict | None = None
        self._loop: task.LoopingCall | None = None
        self._registered: defer.Deferred | None = None
        role.master.set_alter(self.alter)

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> defer.Deferred:
        """Start the connections and the beat; fires once the broker is registered and in its role."""
        service.Service.startService(self)
        for peer in self.controllers:
            peer.startService()
        self._registered = defer.Deferred()
        self._loop = task.LoopingCall(self._beat)
        self._loop.clock = self.clock
        self._loop.start(self.heartbeat_interval, now=True)
        return self._registered

    def stop(self) -> defer.Deferred:
        service.Service.stopService(self)
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        return defer.DeferredList([p.stopService() for p in self.controllers])

    # -- the beat -------------------------------------------------------------------------------------

    def _leader(self):
        return self.controllers[self._turn % len(self.controllers)]

    def _beat(self) -> None:
        if self._busy or not self.running:
            return
        registering = self._registered is not None and not self._registered.called
        if not registering and self.info is not None:
            self._heartbeat_all()
            return
        self._busy = True
        self._attempt(len(self.controllers)).addBoth(self._done)

    def _heartbeat_all(self) -> None:
        body = msgpack.packb({"group": self.group, "broker": self.broker, "max_offset": self._max_offset()})
        call_each(self.controllers, "controller.broker_heartbeat", body, HEARTBEAT_TIMEOUT * self.heartbeat_interval,
                  self._beating, self._heard_from, self._not_heard_from)

    def _heard_from(self, body: bytes, index: int) -> None:
        self._turn = index  # the leader: registration and AlterSyncStateSet go there first
        self._answered(body)

    def _not_heard_from(self, failure, index: int) -> None:
        log.debug("replica_agent_controller_unavailable controller=%s reason=%s", self.controllers[index].peer_id,
                  failure.getErrorMessage())

    def _done(self, _result) -> None:
        self._busy = False

    def _attempt(self, left: int) -> defer.Deferred:
        d = self._register()

        def failed(failure):
            code = getattr(failure.value, "code", None)
            log.debug("replica_agent_controller_unavailable controller=%s reason=%s", self._leader().peer_id,
                      failure.getErrorMessage())
            self._turn += 1
            if code in _NEXT and left > 1 and self.running:
                return self._attempt(left - 1)
            return None
        return d.addCallbacks(self._answered, failed)

    def _max_offset(self) -> int:
        return self.role.store.commit_log.max_offset

    def _register(self) -> defer.Deferred:
        body = {"group": self.group, "broker": self.broker, "address": self.ha_address(),
                "can_master": bool(self.can_master()), "max_offset": self._max_offset()}
        return self._leader().call("controller.register_broker", msgpack.packb(body))

    def _answered(self, body: bytes) -> None:
        answer = msgpack.unpackb(body, raw=False)
        info = answer.get("replica") if isinstance(answer, dict) else None
        if not isinstance(info, dict):  # the controllers do not know this group (any more): register again
            self.info = None
            return
        if self.info is None:
            log.info("replica_registered group=%s broker=%s broker_id=%s master=%s master_epoch=%s",
                     self.group, self.broker, (info.get("brokers") or {}).get(self.broker), info.get("master"),
                     info.get("master_epoch"))
        self.info = info
        self.follow(info)

    def follow_metadata(self, metadata: dict) -> None:
        """A ``MemberAgent.on_metadata`` listener: the controllers' push reaches the role before the next beat."""
        info = (metadata.get("replicas") or {}).get(self.group)
        if isinstance(info, dict) and self.info is not None and self.running:
            self.follow(info)

    def poll(self) -> None:
        """Read the replica info now (a refused proposal: the set or the master moved)."""
        self._beat()

    # -- following ------------------------------------------------------------------------------------

    def follow(self, info: dict) -> None:
        """Switch the role to what ``info`` says, one switch at a time (the newest info wins)."""
        if self._switching is not None:
            self._pending = info
            return
        master, epoch = info.get("master"), info.get("master_epoch", 0)
        if self.following is not None and epoch < self.following[1]:
            return  # an older view (a lagging controller's metadata): never back to a deposed master
        if not master:
            log.info("replica_no_master group=%s: waiting for the controllers to elect one", self.group)
            return
        if master == self.broker:
            key = (master, epoch, "")
            if key == self.following:
                self._adopt_set(info)
                return
            d = self.role.become_master(epoch, frozenset(info.get("sync_state_set") or ()), info.get("set_epoch", 0))
        else:
            address = (info.get("addresses") or {}).get(master) or info.get("master_address") or ""
            if not address:
                log.warning("replica_master_unreachable group=%s master=%s reason=no ha address advertised",
                            self.group, master)
                return
            key = (master, epoch, address)
            if key == self.following:
                return
            d = self.role.become_slave(address)
        log.info("replica_role_change group=%s broker=%s master=%s master_epoch=%s was=%s", self.group,
                 self.broker, master, epoch, self.following)
        self._switching = d

        def switched(_):
            self.following = key
            self.switches += 1
            if self._registered is not None and not self._registered.called:
                self._registered.callback(info)

        def failed(failure):
            log.error("replica_role_change_failed group=%s master=%s error=%s", self.group, master,
                      failure.getErrorMessage())

        def next_(_):
            self._switching = None
            pending, self._pending = self._pending, None
            if pending is not None:
                self.follow(pending)

        d.addCallbacks(switched, failed)
        d.addBoth(next_)

    def _adopt_set(self, info: dict) -> None:
        """This master's set epoch fell behind the controllers' (an accepted change whose answer was lost)."""
        ha = self.role.master
        set_epoch = info.get("set_epoch", 0)
        if ha.altering or set_epoch <= ha.sync.epoch:
            return
        members = frozenset(info.get("sync_state_set") or ()) | {self.broker}
        log.info("ha_sync_state_set_adopted epoch=%d members=%s was=%s", set_epoch, sorted(members),
                 sorted(ha.sync.members))
        ha.sync.apply(members, set_epoch)
        ha.update_confirm()

    # -- AlterSyncStateSet ----------------------------------------------------------------------------

    def alter(self, members: frozenset, new_set_epoch: int) -> defer.Deferred:
        """Propose ``members`` to the controllers' leader; True once accepted, False if refused or unreachable."""
        info = self.info or {}
        if info.get("master") != self.broker:
            return defer.succeed(False)
        body = {"group": self.group, "master": self.broker, "master_epoch": info.get("master_epoch", 0),
                "sync_state_set": sorted(members), "set_epoch": new_set_epoch - 1}
        d = self._leader().call("controller.alter_sync_state_set", msgpack.packb(body))

        def accepted(answer: bytes) -> bool:
            replica = msgpack.unpackb(answer, raw=False).get("replica") or {}
            self.info = replica or self.info
            return replica.get("set_epoch") == new_set_epoch

        def refused(failure) -> bool:
            code = getattr(failure.value, "code", None)
            log.warning("ha_sync_state_set_refused members=%s set_epoch=%d code=%s reason=%s", sorted(members),
                        new_set_epoch - 1, code, failure.getErrorMessage())
            if code in _NEXT:
                self._turn += 1
            self.clock.callLater(0, self.poll)
            return False
        return d.addCallbacks(accepted, refused)
