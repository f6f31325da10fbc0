"""The master's SyncStateSet and confirm offset (RIP-44), as plain state with time passed in.

The SyncStateSet is the replicas that keep up with the master, the master
included; a new master is elected only from it. The confirm offset is the
smallest max offset across the set: every record below it is on every member,
so no failover to a member can truncate it. It only moves forward.

- **Shrink** (``proposal``): a slave in the set that is disconnected, or has not
  caught up with the master for ``max_time_not_caught_up_s``
  (``ha_max_time_slave_not_catchup``), is proposed out. "Caught up" is as
  RocketMQ's ``lastCaughtUpTimeMs``: the time of the last transfer whose
  master end the slave's ack reached (``store.ha_connection.SlaveAcked``).
- **Expand**: a connected slave that is not an async learner and whose ack
  reaches the confirm offset is proposed in.

A proposal is applied with ``apply`` once whoever keeps the set (this master
alone today; the controllers, with master-epoch and set-epoch checks, next)
has accepted it, never before: a set that is applied locally but not stored
could elect a master that misses confirmed records.

``ConfirmWaiters`` is the plug for the acknowledgement policy: a Deferred that
fires once the confirm offset (or ``ack_offset``, the policy's offset) passes an offset.
"""

from __future__ import annotations

import heapq
import itertools
import os
from dataclasses import dataclass

from twisted.internet import defer


@dataclass
class ReplicaProgress:
    """What the master knows of one slave."""

    slave_id: str
    acked_offset: int = 0
    caught_up_at: float = 0.0
    connected: bool = False
    async_learner: bool = False
    synced_at: float = float("-inf")  # when an ack showed it had all of the master's log (not the connect grace)


JOIN_LAG_S = 0.25
"""A slave that acked the whole of the master's log this recently may join the SyncStateSet."""


class SyncStateSet:
    """The set, each slave's progress, and the confirm offset they give."""

    def __init__(self, master_id: str, members: frozenset[str] | set[str] = frozenset(), epoch: int = 0,
                 max_time_not_caught_up_s: float = 15.0) -> None:
        self.master_id = master_id
        self.members: frozenset[str] = frozenset(members) | {master_id}
        self.epoch = epoch
        self.max_time_not_caught_up_s = max_time_not_caught_up_s
        self.replicas: dict[str, ReplicaProgress] = {}
        self._confirm = 0

    # -- what the connections report ----------------------------------------------------------

    def connected(self, slave_id: str, offset: int, async_learner: bool, now: float) -> None:
        """A slave finished its handshake and starts from ``offset``."""
        r = self.replicas.setdefault(slave_id, ReplicaProgress(slave_id))
        r.connected, r.async_learner, r.acked_offset = True, async_learner, offset
        r.caught_up_at = max(r.caught_up_at, now)  # a reconnected slave gets the full time to catch up

    def acked(self, slave_id: str, offset: int, caught_up_at: float) -> None:
        """A slave's ack (``caught_up_at``: when the master last sent it all of its log that it has acked)."""
        r = self.replicas.get(slave_id)
        if r is not None:
            r.acked_offset = max(r.acked_offset, offset)
            r.caught_up_at = max(r.caught_up_at, caught_up_at)
            if caught_up_at > 0:
                r.synced_at = max(r.synced_at, caught_up_at)

    def disconnected(self, slave_id: str) -> None:
        """A slave's connection is gone (its last ack stays known)."""
        r = self.replicas.get(slave_id)
        if r is not None:
            r.connected = False

    # -- the confirm offset --------------------------------------------------------------------

    def confirm_offset(self, master_max: int) -> int:
        """The smallest max offset across the set (the master's own is ``master_max``); never goes back."""
        low = master_max
        for member in self.members:
            if member == self.master_id:
                continue
            r = self.replicas.get(member)
            low = min(low, r.acked_offset if r is not None else 0)
        if low > self._confirm:
            self._confirm = low
        return self._confirm

    # -- shrink and expand -----------------------------------------------------------------------

    def proposal(self, now: float, master_max: int) -> frozenset[str] | None:
        """The set as it should be now (shrunk and expanded), or None if it should stay as it is."""
        self.confirm_offset(master_max)
        new = set(self.members)
        out = set()
        for member in self.members:
            if member == self.master_id:
                continue
            r = self.replicas.get(member)
            if r is None or not r.connected or now - r.caught_up_at > self.max_time_not_caught_up_s:
                out.add(member)
        new -= out
        # Joining is judged against the set that stays: its smallest max offset.
        confirm = min([master_max] + [self.replicas[m].acked_offset for m in new if m != self.master_id])
        # A slave joins once its ack reaches that, or once it acked all the master had a moment ago: under
        # steady load the master's end moves on every tick, and an exact match would keep it out for good (its
        # joining never lowers the confirm offset, which never goes back; acknowledgements then wait for it).
        for r in self.replicas.values():
            if r.connected and not r.async_learner and r.slave_id not in new and r.slave_id not in out \
                    and (r.acked_offset >= confirm or now - r.synced_at <= JOIN_LAG_S):
                new.add(r.slave_id)
        new_set = frozenset(new)
        return None if new_set == self.members else new_set

    def ack_offset(self, master_max: int, all_ack: bool, min_replicas: int) -> int | None:
        """The offset below which a publish may be acknowledged; None: hold every acknowledgement (the set has
        fewer than ``min_replicas`` members).

        ``all_ack`` (``all_ack_in_sync_state_set``): the confirm offset, every member holds it; else the offset
        ``min_replicas`` members (the master counted) hold.
        """
        if len(self.members) < min_replicas:
            return None
        confirm = self.confirm_offset(master_max)
        if all_ack:
            return confirm
        copies = sorted([master_max] + [self.replicas[m].acked_offset if m in self.replicas else 0
                                        for m in self.members if m != self.master_id], reverse=True)
        return max(confirm, copies[min_replicas - 1])

    def apply(self, members: frozenset[str], epoch: int) -> None:
        """The keeper of the set accepted ``members`` as set epoch ``epoch``."""
        self.members = frozenset(members) | {self.master_id}
        self.epoch = epoch


CONFIRM_FILE = "confirm_offset"


class ConfirmOffsetFile:
    """``DATA_DIR/confirm_offset``: the last confirm offset this broker knew, one decimal line.

    Readers of the data directory (the Spark reader) may stop there; a slave
    starts its handshake with it, so a restart does not forget what it must
    never truncate. Written by rename without fsync: a crash may leave an older
    value (smaller: safe for both uses) or none, never a larger one.
    """

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, CONFIRM_FILE)
        self.written = -1

    def read(self) -> int | None:
        """The offset on disk, or None (no file, or an unreadable one)."""
        try:
            with open(self.path, "rb") as f:
                text = f.read().decode("ascii").strip()
            return int(text) if text.isdigit() else None
        except (OSError, UnicodeDecodeError):
            return None

    def write(self, offset: int) -> bool:
        """Record ``offset`` if it moved; True if it was written."""
        if offset == self.written:
            return False
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"%d\n" % offset)
        os.replace(tmp, self.path)
        self.written = offset
        return True


class ConfirmWaiters:
    """Deferreds that fire when the confirm offset reaches an offset (the acknowledgement policy's plug)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, defer.Deferred]] = []
        self._seq = itertools.count()
        self.confirm_offset = 0

    def wait(self, offset: int) -> defer.Deferred:
        """Fires with the confirm offset once it is at least ``offset``."""
        d: defer.Deferred = defer.Deferred()
        if offset <= self.confirm_offset:
            d.callback(self.confirm_offset)
        else:
            heapq.heappush(self._heap, (offset, next(self._seq), d))
        return d

    def advance(self, confirm_offset: int) -> None:
        """The confirm offset moved: fire every waiter it passed."""
        if confirm_offset <= self.confirm_offset:
            return
        self.confirm_offset = confirm_offset
        heap = self._heap
        while heap and heap[0][0] <= confirm_offset:
            d = heapq.heappop(heap)[2]
            if not d.called:  # else it timed out meanwhile
                d.callback(confirm_offset)

    def fail_all(self, reason: Exception) -> None:
        """Errback every waiter (the store closes, the broker stops being master)."""
        heap, self._heap = self._heap, []
        for _off, _seq, d in heap:
            if not d.called:
                d.errback(reason)

    def __len__(self) -> int:
        return len(self._heap)
