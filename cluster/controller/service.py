"""The controller's work on the reactor: the Raft leader's duties and the RPC members call.

The leader keeps the lease table (``cluster.discovery.leases``) in memory: heartbeats renew leases
there and are not replicated (one a second per member would fill the Raft log); what changes
membership is: a register (``join``), an eviction or a health flag (``update``), a forgotten
member (``forget``). When a controller becomes leader it waits for its log to be applied (a
``barrier`` command), seeds slots and routes from its ``[cluster]`` config if no leader did
before, and lists every committed member in a new lease table with a fresh lease (grace: it has
seen no heartbeats yet). A leader that was itself paused (SIGSTOP, a starved reactor: its ticks a
second or more apart) renews every lease and gives every broker the same grace, for the same reason.
Its Raft term, in the high 32 bits of every lease generation it hands out, fences records a deposed
leader still tries to commit.

RPC (``msgpack`` maps in the bodies):

- ``controller.register`` ``{"member": record}`` -> ``{"member": record, "worker": id, "version": v,
  "lease": s, "heartbeat_interval": s}``; only the leader takes it (``not_leader`` names the leader).
- ``controller.heartbeat`` ``{"cluster_id", "node_id", "generation", "healthy"}`` -> ``{"version": v}``;
  a member whose answer shows a version it has not read calls ``controller.metadata``.
- ``controller.deregister`` ``{"node_id", "generation"}`` -> ``{}``.
- ``controller.metadata`` ``{}`` -> the metadata (any controller answers, from its applied log).
- Broker groups' replicas (RIP-44, ``cluster.controller.replicas``), answered ``{"replica": info}``:
  ``controller.register_broker`` ``{"group", "broker", "address", "can_master"}`` (the leader);
  ``controller.alter_sync_state_set`` ``{"group", "master", "master_epoch", "sync_state_set", "set_epoch"}``
  (the leader; a refusal's code is ``not_master``, ``stale_master_epoch``, ...);
  ``controller.replica_info`` ``{"group"}`` (any controller, from its applied log: GetReplicaInfo);
  ``controller.broker_heartbeat`` ``{"group", "broker", "max_offset"}`` (the leader; every
  ``broker_heartbeat_interval``), answered with the replica info too, so a broker polls its role with
  every heartbeat and a lost event cannot split a group. The leader scans the heartbeats
  (``cluster.controller.broker_liveness``) and elects a new master from the SyncStateSet when a
  master's stop; ElectMaster is also the admin API's (``elect_master``). Alive, for an election, is
  a broker heard within ``broker_timeout`` or holding a live member lease.

Refusals are logged and answered with the lease table's code (``wrong_cluster``, ``unknown_member``:
register first, ``stale_lease``: register again). After each metadata change the leader pushes a
``metadata`` event ``{"version": v}`` to the registered members' connections whose lease is live;
an evicted member gets none until it registers again.
"""

from __future__ import annotations

import logging

import msgpack
from twisted.internet import defer, task

from cluster.controller import replicas
from cluster.controller.broker_liveness import PAUSED_SCANS, BrokerLiveness, ScanPaused
from cluster.controller.config import ControllerConfig
from cluster.controller.raft import CommitFailed, RaftNode
from cluster.discovery.leases import (
    LeaseRefused,
    LeaseTable,
    LeaseTimings,
    MemberChanged,
    MemberForgotten,
    MemberLeft,
)
from cluster.discovery.members import BadMember, MemberRecord
from store import api

log = logging.getLogger("twistmq.controller")


class ControllerError(api.StoreError):
    """An RPC answer other than success; ``code`` is one of the module doc's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _unpack(body: bytes) -> dict:
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - any malformed body is the peer's fault
        raise ControllerError("invalid_argument", f"body is not msgpack: {exc}") from None
    if not isinstance(value, dict):
        raise ControllerError("invalid_argument", "body must be a map")
    return value


def _field(body: dict, name: str, kind):
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ControllerError("invalid_argument", f"field {name!r} missing or of the wrong type")
    return value


class Controller:
    """``Controller(reactor, raft, cluster_id, timings, heartbeat_interval, seed)``; ``register(dispatcher)``."""

    def __init__(self, reactor, raft: RaftNode, cluster_id: str, timings: LeaseTimings, heartbeat_interval: float,
                 seed: tuple[dict, dict], config: ControllerConfig = ControllerConfig()) -> None:
        self.reactor = reactor
        self.raft = raft
        self.cluster_id = cluster_id
        self.timings = timings
        self.heartbeat_interval = heartbeat_interval
        self.seed = seed  # (slots {group: [[lo, hi], ...]}, routes {level: group}) from [cluster]
        self.config = config
        self.brokers: BrokerLiveness | None = None  # only while leader and caught up
        self._scanner: task.LoopingCall | None = None
        self.elections = 0
        """masters elected by the scan (for metrics)."""
        self._electing: dict[str, bool] = {}  # groups with an election committing
        self._no_candidate_logged: dict[str, str] = {}  # group -> the dead master a refusal was logged for
        self.table: LeaseTable | None = None  # only while leader and caught up
        self._ticker: task.LoopingCall | None = None
        self._last_tick = 0.0
        self._leading = False
        self._retry = None  # a pending retry of taking the lead (cancelled at stop)
        self._connections: dict[str, object] = {}  # node id -> the RPC protocol it registered on
        self.pushes = 0
        """metadata events sent (for metrics)."""
        raft.on_leadership(self._leadership)
        raft.on_change(self._push)

    def register(self, dispatcher) -> None:
        dispatcher.register("controller.register", self._register)
        dispatcher.register("controller.heartbeat", self._heartbeat)
        dispatcher.register("controller.deregister", self._deregister)
        dispatcher.register("controller.metadata", self._metadata)
        dispatcher.register("controller.register_broker", self._register_broker)
        dispatcher.register("controller.alter_sync_state_set", self._alter_sync_state_set)
        dispatcher.register("controller.replica_info", self._replica_info)
        dispatcher.register("controller.broker_heartbeat", self._broker_heartbeat)

    def connection_lost(self, protocol) -> None:
        for node_id, p in list(self._connections.items()):
            if p is protocol:
                del self._connections[node_id]

    def stop(self) -> None:
        self._lose_lead()

    # -- leadership -----------------------------------------------------------------------------------

    def _leadership(self, is_leader: bool) -> None:
        if is_leader and not self._leading:
            self._leading = True
            term = self.raft.term
            d = self.raft.commit("barrier")
            d.addCallback(lambda _: self._take_lead(term))
            d.addErrback(self._lead_failed, term)
        elif not is_leader and self._leading:
            self._lose_lead()

    def _take_lead(self, term: int):
        if not self._leading or self.raft.term != term:
            return None
        now = self.reactor.seconds()
        table = LeaseTable(self.cluster_id, self.timings, now, generation=term << 32)
        for record in self.raft.read(lambda m: [MemberRecord.from_dict(r) for r in m.members.values()]):
            table.adopt(record, now)
        self.table = table
        self._ticker = task.LoopingCall(self._tick)
        self._ticker.clock = self.reactor
        self._last_tick = now
        self._ticker.start(self.timings.tick, now=False)
        self.brokers = BrokerLiveness(self.config.broker_timeout, self.config.broker_scan_interval, self.timings.lease)
        known = self.raft.read(lambda m: [(g, b) for g, state in m.replicas.groups.items() for b in state["brokers"]])
        self.brokers.grace(known, now, self.timings.lease)  # it has heard none of them yet
        self._scanner = task.LoopingCall(self._scan)
        self._scanner.clock = self.reactor
        self._scanner.start(self.config.broker_scan_interval, now=False)
        log.info("controller_leading term=%d members=%d", term, len(table.members()))
        self.raft.enable_code().addErrback(self._commit_failed, "set_code_version")
        if not self.raft.read(lambda m: m.seeded):
            slots, routes = self.seed
            return self.raft.commit("seed", slots, routes).addErrback(self._commit_failed, "seed")
        return None

    def _lead_failed(self, failure, term: int) -> None:
        failure.trap(CommitFailed)
        log.warning("controller_lead_not_taken term=%d reason=%s", term, failure.value.reason)
        self._leading = False
        if self.raft.is_leader:  # still leader: try again on the next tick of the lease clock
            self._retry = self.reactor.callLater(self.timings.tick, self._leadership, True)

    def _lose_lead(self) -> None:
        self._leading = False
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        self.table = None
        self.brokers = None
        for loop in (self._ticker, self._scanner):
            if loop is not None and loop.running:
                loop.stop()
        self._ticker = self._scanner = None

    def _tick(self) -> None:
        if self.table is None:
            return
        now = self.reactor.seconds()
        last, self._last_tick = self._last_tick, now
        if now - last >= PAUSED_SCANS * self.config.broker_scan_interval:
            # This leader was away (SIGSTOP, starved): the heartbeats it did not read meanwhile say nothing
            # about the members, so each gets a lease from now, as at a takeover, instead of an eviction.
            log.warning("controller_paused tick_gap=%.1fs (every member's lease renewed)", now - last)
            self.table.grace(now)
        self._commit_events(self.table.tick(now))

    def _commit_events(self, events) -> None:
        for event in events:
            if isinstance(event, (MemberLeft, MemberChanged)):
                self.raft.commit("update", event.member.as_dict()).addErrback(self._commit_failed, "update")
            elif isinstance(event, MemberForgotten):
                generation = self.raft.read(lambda m: m.members.get(event.node_id, {}).get("generation", 0))
                self.raft.commit("forget", event.node_id, generation).addErrback(self._commit_failed, "forget")

    def _commit_failed(self, failure, what: str) -> None:
        failure.trap(CommitFailed)
        log.warning("controller_commit_failed command=%s reason=%s", what, failure.value.reason)

    # -- RPC --------------------------------------------------------------------------------------------

    def _leader_table(self) -> LeaseTable:
        if self.table is None:
            leader = self.raft.leader
            raise ControllerError("not_leader", f"this controller ({self.raft.address}) is not the leader; "
                                  f"leader: {leader or 'none elected'}")
        return self.table

    def _refused(self, exc: LeaseRefused) -> ControllerError:
        return ControllerError(exc.code.lower(), str(exc))

    def _register(self, protocol, body: bytes):
        table = self._leader_table()
        request = _unpack(body)
        try:
            record = MemberRecord.from_dict(request.get("member"))
        except BadMember as exc:
            log.warning("member_refused reason=%s %s", exc, protocol.describe())
            raise ControllerError("invalid_argument", str(exc)) from None
        try:
            listed, _joined = table.register(record, self.reactor.seconds())
        except LeaseRefused as exc:
            raise self._refused(exc) from None
        self._connections[listed.node_id] = protocol
        d = self.raft.commit("join", listed.as_dict())
        d.addCallback(lambda worker: msgpack.packb({
            "member": listed.as_dict(), "worker": worker, "version": self.raft.read(lambda m: m.version),
            "lease": self.timings.lease, "heartbeat_interval": self.heartbeat_interval}))
        d.addErrback(self._unavailable)
        return d

    def _unavailable(self, failure):
        failure.trap(CommitFailed)
        raise ControllerError("unavailable", str(failure.value))

    def _heartbeat(self, protocol, body: bytes):
        table = self._leader_table()
        request = _unpack(body)
        node_id = _field(request, "node_id", str)
        try:
            events = table.heartbeat(_field(request, "cluster_id", str), node_id,
                                     _field(request, "generation", int), self.reactor.seconds(),
                                     bool(request.get("healthy", True)))
        except LeaseRefused as exc:
            raise self._refused(exc) from None
        self._connections[node_id] = protocol
        self._commit_events(events)
        return msgpack.packb({"version": self.raft.read(lambda m: m.version)})

    def _deregister(self, protocol, body: bytes):
        table = self._leader_table()
        request = _unpack(body)
        node_id = _field(request, "node_id", str)
        self._commit_events(table.deregister(node_id, _field(request, "generation", int), self.reactor.seconds()))
        self._connections.pop(node_id, None)
        return msgpack.packb({})

    def _metadata(self, protocol, body: bytes):
        return msgpack.packb(self.raft.read(lambda m: m.view()))

    # -- broker groups' replicas ---------------------------------------------------------------------------

    def _replica_answer(self, answer):
        code, info = answer
        if code != replicas.OK:
            log.warning("replica_change_refused code=%s group=%s", code, (info or {}).get("group"))
            raise ControllerError(code, f"refused: {code} (now: {info})")
        return msgpack.packb({"replica": info})

    def _register_broker(self, protocol, body: bytes):
        self._leader_table()
        request = _unpack(body)
        group, broker = _field(request, "group", str), _field(request, "broker", str)
        if self.brokers is not None:
            self.brokers.heartbeat(group, broker, self.reactor.seconds(), request.get("max_offset"))
        d = self.raft.commit("register_broker", group, broker, request.get("address") or "",
                             bool(request.get("can_master", False)))
        d.addCallback(self._replica_answer)
        d.addCallback(lambda packed: msgpack.packb({
            **msgpack.unpackb(packed), "heartbeat_interval": self.config.broker_heartbeat_interval}))
        d.addErrback(self._unavailable)
        return d

    def _broker_heartbeat(self, protocol, body: bytes):
        self._leader_table()
        request = _unpack(body)
        group, broker = _field(request, "group", str), _field(request, "broker", str)
        max_offset = request.get("max_offset")
        if self.brokers is None:
            raise ControllerError("not_leader", "this controller is taking the lead; try again")
        if self.brokers.heartbeat(group, broker, self.reactor.seconds(),
                                  max_offset if isinstance(max_offset, int) else None):
            log.info("broker_alive group=%s broker=%s", group, broker)
        return msgpack.packb({"replica": self.replica_info(group)})

    def _alive(self, group: str) -> list[str]:
        """Brokers of ``group`` heard within broker_timeout, or holding a live member lease."""
        now = self.reactor.seconds()
        alive = set(self.brokers.alive(group, now)) if self.brokers is not None else set()
        if self.table is not None:
            alive.update(m.node_id for m in self.table.members()
                         if m.joined and m.node_type == "broker" and m.group == group)
        return sorted(alive)

    def _scan(self) -> None:
        """Brokers whose heartbeats stopped: a dead master's group gets a new master from its SyncStateSet."""
        if self.brokers is None:
            return
        now = self.reactor.seconds()
        for event in self.brokers.scan(now):
            if isinstance(event, ScanPaused):
                log.warning("controller_paused scan_gap=%.1fs grace=%.1fs (every broker counts as heard now)",
                            event.gap, event.grace)
            else:
                log.warning("broker_dead group=%s broker=%s silent_for=%.1fs", event.group, event.broker,
                            self.config.broker_timeout)
        groups = self.raft.read(lambda m: {g: (s["master"], list(s["sync_state_set"]), list(s["brokers"]))
                                           for g, s in m.replicas.groups.items()})
        for group, (master, in_sync, brokers) in sorted(groups.items()):
            if master is None or master in self.brokers.alive(group, now) or group in self._electing:
                continue
            alive = [b for b in self.brokers.alive(group, now) if b != master]
            candidates = [b for b in alive if b in in_sync] or (alive if self.config.unclean_master_election else [])
            if candidates:
                self._elect_for_dead_master(group, master, alive)
            elif self._no_candidate_logged.get(group) != master:  # once per dead master, not per scan
                self._no_candidate_logged[group] = master
                log.error("master_not_elected group=%s dead_master=%s reason=no alive broker in the sync state set "
                          "%s (alive: %s)", group, master, ",".join(in_sync), ",".join(alive) or "-")

    def _elect_for_dead_master(self, group: str, master: str, alive: list[str]) -> None:
        self._electing[group] = True
        d = self.raft.commit("elect_master", group, None, alive, self.config.unclean_master_election)

        def elected(answer):
            code, info = answer
            if code == replicas.OK:
                self.elections += 1
                log.warning("master_elected group=%s master=%s master_epoch=%d previous=%s sync_state_set=%s",
                            group, info["master"], info["master_epoch"], master, ",".join(info["sync_state_set"]))
            else:
                log.error("master_not_elected group=%s dead_master=%s reason=%s alive=%s", group, master, code,
                          ",".join(alive) or "-")

        d.addCallback(elected)
        d.addErrback(self._commit_failed, "elect_master")
        d.addBoth(lambda _: self._electing.pop(group, None))

    def _alter_sync_state_set(self, protocol, body: bytes):
        self._leader_table()
        request = _unpack(body)
        new_set = _field(request, "sync_state_set", list)
        if not all(isinstance(b, str) for b in new_set):
            raise ControllerError("invalid_argument", "sync_state_set must be a list of broker ids")
        d = self.raft.commit("alter_sync_state_set", _field(request, "group", str), _field(request, "master", str),
                             _field(request, "master_epoch", int), new_set, _field(request, "set_epoch", int))
        d.addCallback(self._replica_answer)
        d.addErrback(self._unavailable)
        return d

    def _replica_info(self, protocol, body: bytes):
        group = _field(_unpack(body), "group", str)
        return msgpack.packb({"replica": self.replica_info(group)})

    def replica_info(self, group: str) -> dict | None:
        """A group's replica info from this controller's applied log (None: no broker of it registered)."""
        return self.raft.read(lambda m: replicas.info(group, m.replicas.groups.get(group)))

    def elect_master(self, group: str, broker: str | None) -> defer.Deferred:
        """ElectMaster (the admin's, or the failover scan's): ``broker`` if given, else the controllers' choice
        among the alive members of the SyncStateSet. Fires ``(code, info)``; only the leader runs it."""
        self._leader_table()
        alive = self._alive(group)
        d = self.raft.commit("elect_master", group, broker, alive, self.config.unclean_master_election)
        d.addErrback(self._unavailable)
        return d

    def _push(self) -> None:
        """Tell the live members on this controller's connections that the metadata moved."""
        if self.table is None:
            return
        event = msgpack.packb({"version": self.raft.read(lambda m: m.version)})
        for node_id, protocol in list(self._connections.items()):
            member = self.table.member(node_id)
            if member is not None and member.joined and protocol.is_open:
                protocol.send_event("metadata", event)
                self.pushes += 1

    # -- admin ------------------------------------------------------------------------------------------

    def members(self) -> list[dict]:
        """``cluster/members``: the leader's live view if this is the leader, else the committed records."""
        if self.table is not None:
            return [m.as_dict() for m in self.table.members()]
        return self.raft.read(lambda m: [dict(r) for r in m.members.values()])

    def elect_leader(self, target: str | None) -> defer.Deferred:
        if not self.raft.is_leader:
            return defer.fail(ControllerError("not_leader", f"ask the leader: {self.raft.leader or 'none elected'}"))
        return self.raft.transfer_leadership(target)
