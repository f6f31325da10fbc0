"""A member's side of discovery: register with the controllers' leader, heartbeat, learn the metadata.

``MemberAgent`` holds one RPC connection per controller (``cluster.rpc.peer.PeerClient``) and
every ``heartbeat_interval``:

- while it has no lease, registers on the controller it believes leads, else on the next one
  (``not_leader`` or a controller that is down moves it on, so it finds a new leader by itself);
- once registered, heartbeats every controller in the same beat with its generation: whichever
  leads renews the lease (a new leader lists the records its predecessor committed and gives them
  one lease, so it must hear each member within that lease however often the lead moved), the
  others answer ``not_leader``; a controller that does not answer (stopped, not dead: its
  connection stays open) holds up no beat and gets no new heartbeat while one to it is out (it
  gives up after two heartbeat intervals); ``stale_lease`` or ``unknown_member`` from the leader
  (evicted, or forgotten) makes it register again;
- reads the metadata (``controller.metadata``, any controller: a healthy one, the leader first) when a heartbeat's answer or a
  pushed ``metadata`` event shows a version newer than the one it holds: push for speed, the
  heartbeat's version as the poll, so a lost push leaves it at most one heartbeat behind.

While no controller answers (a majority down), the member keeps serving with the metadata it
has; nothing here stops it. ``record()`` is called at each register, so addresses bound after
start (port 0) are in it. Listeners of ``on_metadata`` get each newer metadata map.

``ids()`` is this process's snowflake id generator: the worker id the controllers leased it (kept
across its re-registrations and restarts, freed only when it is forgotten) and the number of its
record's zone; None until the first register answered with a worker id.
"""

from __future__ import annotations

import logging
from typing import Callable

import msgpack
from twisted.application import service
from twisted.internet import defer, task

from cluster.discovery.ids import SnowflakeIds, zone_number
from cluster.discovery.members import MemberRecord
from cluster.rpc.peer import call_each

log = logging.getLogger("twistmq.discovery")

_REGISTER_AGAIN = ("stale_lease", "unknown_member")

HEARTBEAT_TIMEOUT = 2.0
"""Heartbeat intervals a heartbeat waits for its answer before the agent tries the next controller."""


class MemberAgent(service.Service):
    """``MemberAgent(clock, controllers, record, heartbeat_interval, health)``: a service; start it after the listeners."""

    def __init__(self, clock, controllers: list, record: Callable[[], MemberRecord], heartbeat_interval: float,
                 health: Callable[[], bool] = lambda: True) -> None:
        self.setName("member-agent")
        self.clock = clock
        self.controllers = controllers  # PeerClient per controller, in config order
        self.record = record
        self.heartbeat_interval = heartbeat_interval
        self.health = health
        self.generation = 0  # 0: no lease
        self.worker: int | None = None
        self.metadata: dict | None = None
        self.version = -1
        self._turn = 0  # index of the controller believed to lead
        self._busy = False
        self._beating: set[int] = set()  # controllers with a heartbeat unanswered
        self._reading = False
        self._listeners: list[Callable[[dict], None]] = []
        self._ids: SnowflakeIds | None = None
        self._loop: task.LoopingCall | None = None
        self.registrations = 0
        """Leases taken (the first and every re-registration; for metrics)."""
        for peer in controllers:
            peer.on_event(self._event)

    def on_metadata(self, listener: Callable[[dict], None]) -> None:
        self._listeners.append(listener)

    def ids(self) -> SnowflakeIds | None:
        """The snowflake generator of the leased worker id (one per worker id, so ids never go back)."""
        if self.worker is None:
            return None
        if self._ids is None or self._ids.worker != self.worker:
            self._ids = SnowflakeIds(zone_number(self.record().zone), self.worker, self.clock)
        return self._ids

    @property
    def joined(self) -> bool:
        return self.generation != 0

    @property
    def leader(self):
        """The controller (its ``PeerClient``) believed to lead: the lease is held there while joined."""
        return self._leader()

    def startService(self) -> None:
        service.Service.startService(self)
        for peer in self.controllers:
            peer.startService()
        self._loop = task.LoopingCall(self._beat)
        self._loop.clock = self.clock
        self._loop.start(self.heartbeat_interval, now=True)

    def stopService(self) -> defer.Deferred:
        service.Service.stopService(self)
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        d = defer.succeed(None)
        if self.generation:  # say goodbye so the lease ends now, not one lease later
            record = self.record()
            body = msgpack.packb({"node_id": record.node_id, "generation": self.generation})
            d = self._leader().call("controller.deregister", body, 1.0)
            d.addErrback(lambda _f: None)
        return d.addCallback(lambda _: defer.DeferredList([p.stopService() for p in self.controllers]))

    # -- the beat -----------------------------------------------------------------------------------------

    def _leader(self):
        return self.controllers[self._turn % len(self.controllers)]

    def _next_controller(self) -> None:
        self._turn = (self._turn + 1) % len(self.controllers)

    def _beat(self) -> None:
        if self._busy:  # a registration is still out (a slow controller): do not pile up
            return
        if self.generation:
            self._heartbeat_all()
            return
        self._busy = True
        self._attempt(len(self.controllers)).addBoth(self._done)

    def _attempt(self, left: int) -> defer.Deferred:
        """Register; on a controller that is not the leader (or down) try the next at once, each controller at
        most once per beat."""
        d = self._register()

        def failed(failure):
            if self._failed(failure) and left > 1 and self.running:
                return self._attempt(left - 1)
            return None
        return d.addErrback(failed)

    def _done(self, _result) -> None:
        self._busy = False

    def _register(self) -> defer.Deferred:
        record = self.record()
        d = self._leader().call("controller.register", msgpack.packb({"member": record.as_dict()}))

        def registered(body):
            answer = msgpack.unpackb(body, raw=False)
            first = self.registrations == 0
            self.generation = answer["member"]["generation"]
            self.worker = answer["worker"]
            self.registrations += 1
            log.info("member_registered node_id=%s generation=%d worker=%s controller=%s again=%s",
                     record.node_id, self.generation, self.worker, self._leader().peer_id, not first)
            self._interval(answer.get("heartbeat_interval"))
            self._saw_version(answer.get("version", 0))
        return d.addCallback(registered)

    def _heartbeat_all(self) -> None:
        record = self.record()
        generation = self.generation
        body = msgpack.packb({"cluster_id": record.cluster_id, "node_id": record.node_id,
                              "generation": generation, "healthy": bool(self.health())})
        call_each(self.controllers, "controller.heartbeat", body, HEARTBEAT_TIMEOUT * self.heartbeat_interval,
                  self._beating, self._renewed, lambda failure, index: self._not_renewed(failure, index, generation))

    def _renewed(self, answer: bytes, index: int) -> None:
        self._turn = index  # the leader: registration, goodbye and metadata reads go there first
        self._saw_version(msgpack.unpackb(answer, raw=False)["version"])

    def _not_renewed(self, failure, index: int, generation: int) -> None:
        code = getattr(failure.value, "code", None)
        if code in _REGISTER_AGAIN and generation == self.generation:
            log.warning("member_lease_lost code=%s generation=%d: registering again", code, self.generation)
            self.generation = 0
            return
        log.debug("member_controller_unavailable controller=%s reason=%s", self.controllers[index].peer_id,
                  failure.getErrorMessage())

    def _failed(self, failure) -> bool:
        """Handle a failed call; True when another controller should be tried now."""
        code = getattr(failure.value, "code", None)
        if code in _REGISTER_AGAIN:
            log.warning("member_lease_lost code=%s generation=%d: registering again", code, self.generation)
            self.generation = 0
            return False
        # not_leader, a controller that is down or stopped: move on to the next one (one call out at a time)
        log.debug("member_controller_unavailable controller=%s reason=%s", self._leader().peer_id,
                  failure.getErrorMessage())
        self._next_controller()
        return code in ("not_leader", "not_connected", "timeout")

    def _interval(self, interval) -> None:
        if isinstance(interval, (int, float)) and interval > 0 and interval != self.heartbeat_interval:
            self.heartbeat_interval = float(interval)
            if self._loop is not None and self._loop.running:
                self._loop.stop()
                self._loop.start(self.heartbeat_interval, now=False)

    # -- metadata -------------------------------------------------------------------------------------------

    def _event(self, topic: str, body: bytes) -> None:
        if topic != "metadata":
            return
        try:
            version = msgpack.unpackb(body, raw=False)["version"]
        except Exception:  # noqa: BLE001 - a malformed event is logged, never fatal
            log.warning("member_bad_metadata_event")
            return
        self._saw_version(version)

    def _saw_version(self, version) -> None:
        if not isinstance(version, int) or version <= self.version or self._reading:
            return
        self._reading = True
        d = self._reader().call("controller.metadata", msgpack.packb({}))
        d.addCallback(self._got_metadata)
        d.addErrback(lambda f: log.info("member_metadata_unavailable reason=%s", f.getErrorMessage()))
        d.addBoth(self._read_done)

    def _reader(self):
        """The controller to read the metadata from. Any controller answers it (a call without a fixed target),
        so an unhealthy one is avoided: the leader if it is healthy (its log is the newest), else the next
        healthy one, else the leader all the same."""
        leader = self._leader()
        ordered = [leader] + [p for p in self.controllers if p is not leader]
        return next((p for p in ordered if p.healthy), leader)

    def _read_done(self, _result) -> None:
        self._reading = False

    def _got_metadata(self, body: bytes) -> None:
        metadata = msgpack.unpackb(body, raw=False)
        if metadata.get("version", -1) <= self.version:
            return
        self.metadata, self.version = metadata, metadata["version"]
        for listener in self._listeners:
            listener(metadata)
