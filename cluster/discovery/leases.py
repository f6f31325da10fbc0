"""The lease table, sans-IO: members register, heartbeats renew their leases, a hashed wheel evicts.

SOFARegistry's renew and evict, with Turms' member records: a register or heartbeat records the
member's renew time and, if no evict check of that member is pending, schedules one a lease
ahead on the wheel. When the check comes due, a member renewed since is checked again when its
lease would end (one pending check per member, whatever the heartbeat rate); one that was not is
evicted: its record stays listed with ``joined`` false (so operators see who left) until
``forget_after`` more seconds pass, then it is forgotten unless it is a seed.

The table never reads a clock or does I/O: every call takes ``now`` and returns events
(``MemberJoined``, ``MemberLeft``, ``MemberChanged``, ``MemberForgotten``); the caller ticks it
(``tick(now)``) every wheel tick and delivers the events (notify pushes, metadata commits).

A lease has a generation, new with every registration: a heartbeat that names an older one (a
member that was evicted and did not notice, or a second process with the same id) is refused
with ``STALE_LEASE`` and the member must register again; so is one from a member the table does
not know (``UNKNOWN_MEMBER``: it was forgotten, or this controller is new). ``grace(now)`` renews
every lease at once: a new controller leader calls it because it has seen no heartbeats yet.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from cluster.discovery.members import MemberRecord
from cluster.discovery.wheel import HashedWheel

log = logging.getLogger("twistmq.discovery")


class LeaseRefused(Exception):
    """A register or heartbeat the table refuses; ``code`` is stable (logs, RPC errors)."""

    WRONG_CLUSTER = "WRONG_CLUSTER"
    UNKNOWN_MEMBER = "UNKNOWN_MEMBER"
    STALE_LEASE = "STALE_LEASE"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class MemberJoined:
    """A member registered (first time, after eviction, or after a restart)."""

    member: MemberRecord


@dataclass(frozen=True, slots=True)
class MemberChanged:
    """A joined member's record changed (its health flag, its addresses, ``active``)."""

    member: MemberRecord


@dataclass(frozen=True, slots=True)
class MemberLeft:
    """A member's lease ended: ``evicted`` (no heartbeat for a lease) or ``deregistered`` (it said goodbye)."""

    member: MemberRecord
    reason: str


@dataclass(frozen=True, slots=True)
class MemberForgotten:
    """A member that left ``forget_after`` ago is no longer listed."""

    node_id: str


@dataclass(frozen=True)
class LeaseTimings:
    """The lease table's timings (seconds); the config's ``[discovery]`` section fills them."""

    lease: float = 3.0
    tick: float = 0.1
    forget_after: float = 60.0
    slots: int = 512


class LeaseTable:
    """Members and their leases; one instance on the controllers' leader."""

    def __init__(self, cluster_id: str, timings: LeaseTimings, now: float, generation: int = 0) -> None:
        self.cluster_id = cluster_id
        self.timings = timings
        self._wheel = HashedWheel(timings.tick, now, timings.slots)
        self._members: dict[str, MemberRecord] = {}
        self._renewed: dict[str, float] = {}  # node id -> last renew time (joined members only)
        self._left: dict[str, float] = {}  # node id -> when its lease ended
        self._pending: dict[str, float] = {}  # member -> when its check on the wheel is due (the earliest one)
        self._generation = generation
        self.refused = 0
        """Registers and heartbeats refused (for metrics)."""
        self.evicted = 0
        """Leases that ended without a heartbeat (for metrics)."""

    @property
    def generation(self) -> int:
        """The last lease generation handed out."""
        return self._generation

    @property
    def checks_pending(self) -> int:
        """Checks on the wheel: one per listed member, whatever the heartbeat rate (and, for a while, a later one
        an earlier check replaced)."""
        return len(self._wheel)

    def members(self) -> list[MemberRecord]:
        """Every listed member (joined or left, not yet forgotten), by node id."""
        return [self._members[k] for k in sorted(self._members)]

    def member(self, node_id: str) -> MemberRecord | None:
        return self._members.get(node_id)

    def joined(self) -> list[MemberRecord]:
        """The members holding a live lease: the only ones notify events go to."""
        return [m for m in self.members() if m.joined]

    def _refuse(self, code: str, message: str) -> LeaseRefused:
        self.refused += 1
        log.warning("lease_refused code=%s %s", code, message)
        return LeaseRefused(code, message)

    def register(self, record: MemberRecord, now: float) -> tuple[MemberRecord, list]:
        """Give *record*'s member a new lease; returns its record as listed (with the generation) and events."""
        if record.cluster_id != self.cluster_id:
            raise self._refuse(LeaseRefused.WRONG_CLUSTER, f"node_id={record.node_id} cluster_id="
                               f"{record.cluster_id} (this cluster is {self.cluster_id})")
        self._generation += 1
        before = self._members.get(record.node_id)
        listed = dataclasses.replace(record, joined=True, last_heartbeat=now, generation=self._generation,
                                     registration_date=now,
                                     active=before.active if before is not None else record.active)
        self._members[record.node_id] = listed
        self._left.pop(record.node_id, None)
        self._renew(record.node_id, now)
        log.info("member_joined node_id=%s type=%s generation=%d", listed.node_id, listed.node_type,
                 listed.generation)
        return listed, [MemberJoined(listed)]

    def adopt(self, record: MemberRecord, now: float) -> None:
        """List a record an earlier leader committed, as it is: a joined member gets a lease from *now* (it
        has had no chance to heartbeat to this table: the new leader's grace), a left one its time to be
        forgotten from *now*. Generations stay as they were (this table's own start above them)."""
        self._members[record.node_id] = record
        if record.joined:
            self._left.pop(record.node_id, None)
            self._renew(record.node_id, now)
        else:
            self._renewed.pop(record.node_id, None)
            self._left[record.node_id] = now
            self._check(record.node_id, now, self.timings.forget_after)

    def heartbeat(self, cluster_id: str, node_id: str, generation: int, now: float,
                  healthy: bool = True) -> list:
        """Renew *node_id*'s lease; a wrong cluster, an unknown member or a stale generation is ``LeaseRefused``."""
        if cluster_id != self.cluster_id:
            raise self._refuse(LeaseRefused.WRONG_CLUSTER, f"node_id={node_id} cluster_id={cluster_id} "
                               f"(this cluster is {self.cluster_id})")
        member = self._members.get(node_id)
        if member is None:
            raise self._refuse(LeaseRefused.UNKNOWN_MEMBER, f"node_id={node_id}: register first")
        if not member.joined or member.generation != generation:
            raise self._refuse(LeaseRefused.STALE_LEASE, f"node_id={node_id} generation={generation} "
                               f"(current {member.generation}, joined={member.joined}): register again")
        events = []
        if member.healthy != healthy:
            member = dataclasses.replace(member, healthy=healthy)
            events.append(MemberChanged(member))
        self._members[node_id] = dataclasses.replace(member, last_heartbeat=now)
        self._renew(node_id, now)
        return events

    def deregister(self, node_id: str, generation: int, now: float) -> list:
        """A member leaving on purpose ends its lease at once (a stale generation changes nothing)."""
        member = self._members.get(node_id)
        if member is None or not member.joined or member.generation != generation:
            return []
        return self._end(node_id, now, "deregistered")

    def set_active(self, node_id: str, active: bool) -> list:
        """An operator's drain flag; unknown members change nothing."""
        member = self._members.get(node_id)
        if member is None or member.active == active:
            return []
        self._members[node_id] = dataclasses.replace(member, active=active)
        return [MemberChanged(self._members[node_id])]

    def grace(self, now: float) -> None:
        """Renew every joined member's lease now (a new leader has seen no heartbeats yet)."""
        for node_id in self._renewed:
            self._renew(node_id, now)

    def _renew(self, node_id: str, now: float) -> None:
        self._renewed[node_id] = now
        self._check(node_id, now, self.timings.lease)

    def _check(self, node_id: str, now: float, delay: float) -> None:
        """A check of *node_id* due within *delay*: the one pending stays if it comes no later (a renewing
        member adds none), else an earlier one is scheduled. The later one stays on the wheel and is passed over
        when it comes (``tick``): a member evicted and registered again within ``forget_after`` has its forget
        check pending, and must still be evicted one lease after it goes silent again, not when that comes."""
        due = now + delay
        pending = self._pending.get(node_id)
        if pending is not None and pending <= due:
            return
        self._pending[node_id] = due
        self._wheel.schedule(node_id, now, delay)

    def _end(self, node_id: str, now: float, reason: str) -> list:
        member = dataclasses.replace(self._members[node_id], joined=False)
        self._members[node_id] = member
        self._renewed.pop(node_id, None)
        self._left[node_id] = now
        self._check(node_id, now, self.timings.forget_after)
        log.info("member_left node_id=%s reason=%s generation=%d", node_id, reason, member.generation)
        return [MemberLeft(member, reason)]

    def tick(self, now: float) -> list:
        """Run the evict checks due by *now*: the wheel's work for the ticks that passed."""
        events: list = []
        for node_id in self._wheel.advance(now):
            due = self._pending.get(node_id)
            if due is None or due > now + self.timings.tick:
                continue  # a later check an earlier one replaced (``_check``), or one already run this tick
            del self._pending[node_id]
            member = self._members.get(node_id)
            if member is None:
                continue
            if member.joined:
                idle = now - self._renewed[node_id]
                if idle >= self.timings.lease - 1e-9:
                    self.evicted += 1
                    events.extend(self._end(node_id, now, "evicted"))
                else:
                    self._check(node_id, now, self.timings.lease - idle)
                continue
            gone_for = now - self._left[node_id]
            if gone_for < self.timings.forget_after - 1e-9:
                self._check(node_id, now, self.timings.forget_after - gone_for)
            elif not member.seed:
                del self._members[node_id]
                del self._left[node_id]
                events.append(MemberForgotten(node_id))
        return events
