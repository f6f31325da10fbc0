"""Retention: which commit-log segments may be deleted, and what is still owed in them.

The commit log is the only copy of every message, so deleting a segment is
deleting messages. A message is *owed* while someone is still to receive it:
an MQTT session or shared-subscription group whose offset in a light queue has
not passed it, a native consumer group whose cursor has not passed it or holds
it in flight (POP invisible time, ``retry``). Owners register as
``RetentionHolder``s and name the lowest queue offset they owe per queue; the
store turns those into the lowest commit-log offset still owed, the *floor*.

One run (``Retention.run``):

1. **By age** (``retention_hours``): delete the oldest segments that are older
   than the retention *and* end at or below the floor. A segment holding an
   owed message is kept however old it is: only message TTL and session expiry
   end an owed message without a disk limit.
2. **By disk limit** (``disk_quota_mb``, ``disk_max_used_ratio``): delete the
   oldest segments until the commit log is under its quota and the file system
   under its ratio, owed or not. Every owed message this drops is counted per
   queue (``dropped``), and one warning per owner names the queue and the queue
   offsets lost; readers then resume at the first entry still on disk.
3. **Carry**: state that must outlive its segment (retained messages today) is
   re-appended ahead of deletion by its ``RetentionCarrier``, as a ``SYSTEM``
   record carrying the original offset in ``CARRIED``, and the deletion waits
   until those appends are written (the timer service hops its own records).

Everything runs on the reactor thread; the cost is one index lookup per queue
that someone owes (see ``bench/retention_bench.py``).
"""

from __future__ import annotations

import collections
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

from twisted.internet import defer, task

from store import record as rec
from store.api import Owed

log = logging.getLogger("twistmq.store.retention")

MAX_NAMED_DROPS = 1000  # warnings naming owner and offsets per run; a total line follows
PLAN_CHUNK = 2000  # owed queues looked up per reactor turn
CARRIED = "CARRIED"  # property of a re-appended record: the commit-log offset of the one it replaces


class RetentionHolder(Protocol):
    """Something that owes messages: it names, per queue, the lowest offset it still owes."""

    def __call__(self) -> Iterable[Owed]: ...


class RetentionCarrier(Protocol):
    """State kept in records that must outlive their segment: ``(cl_offset, size)`` of each below ``offset``."""

    def __call__(self, offset: int) -> list[tuple[int, int]]: ...


@dataclass
class RetentionReport:
    """What one run did."""

    deleted: list[str] = field(default_factory=list)
    floor: int | None = None  # lowest commit-log offset owed (None: nothing owed)
    carried: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # queue -> owed messages the disk limit dropped
    reason: str = ""


@dataclass
class _Plan:
    age: int = 0  # leading segments that may go by age
    held: int = 0  # segments past their age kept because they hold owed messages (at most)
    limit: int = 0  # leading segments that must go for the disk limits
    floor: int | None = None
    owed: dict[str, list[Owed]] = field(default_factory=dict)  # queue -> its owners' positions
    first_owed: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # queue -> (owed qoff, cl, queue min)
    floor_owner: str = ""

    @property
    def count(self) -> int:
        return max(self.age, self.limit)


class Retention:
    """Plans and runs deletions for one store (see the module doc)."""

    def __init__(self, store, clock) -> None:
        self._store = store
        self._clock = clock
        self._holders: list[RetentionHolder] = []
        self._carriers: list[RetentionCarrier] = []
        self.dropped: collections.Counter[str] = collections.Counter()  # queue -> owed messages dropped, ever
        self.runs = 0
        self._running: defer.Deferred | None = None
        self._held: tuple | None = None  # (floor, owner) last logged as holding segments back
        self.statvfs: Callable[[str], os.statvfs_result] = os.statvfs  # tests pass a fuller disk

    def add_holder(self, holder: RetentionHolder) -> None:
        """Register a source of owed positions (called at every run)."""
        self._holders.append(holder)

    def add_carrier(self, carrier: RetentionCarrier) -> None:
        """Register state whose records must be re-appended before their segment goes."""
        self._carriers.append(carrier)

    # -- planning ----------------------------------------------------------------------------

    def owed(self) -> list[Owed]:
        """Every position owed now, from every holder."""
        out: list[Owed] = []
        for holder in self._holders:
            out.extend(holder())
        return out

    @defer.inlineCallbacks
    def _plan(self):
        """Fires with a _Plan. Owed positions are looked up in chunks, one reactor turn each.

        Positions only move forward, and a new owner starts at or past what is
        stored (or reads from the oldest record still there), so a floor computed
        over several turns is never above the true one.
        """
        store = self._store
        plan = _Plan()
        index = store.queue_index
        for o in self.owed():
            plan.owed.setdefault(o.queue, []).append(o)
        if index is not None:
            max_offset = index.max_offset
            for n, (queue, owners) in enumerate(plan.owed.items(), 1):
                if n % PLAN_CHUNK == 0:
                    yield task.deferLater(self._clock, 0, lambda: None)
                qoff = min(o.queue_offset for o in owners)
                if qoff >= max_offset(queue):
                    continue  # caught up: nothing stored is owed
                entries = index.entries(queue, qoff, 1)
                if not entries:
                    continue
                e = entries[0]
                plan.first_owed[queue] = (qoff, e.cl_offset, index.min_offset(queue))
                if plan.floor is None or e.cl_offset < plan.floor:
                    plan.floor = e.cl_offset
                    plan.floor_owner = min(owners, key=lambda o: o.queue_offset).owner
        self._plan_segments(plan)
        return plan

    def _plan_segments(self, plan: _Plan) -> None:
        store = self._store
        cfg = store.config
        segments = store.commit_log.segments()
        closed = segments[:-1]  # the active segment is never deleted
        now_s = self._clock.seconds()
        max_age_s = cfg.retention_hours * 3600
        for i, seg in enumerate(closed):
            if now_s - os.path.getmtime(seg.path) <= max_age_s:
                break
            if plan.floor is not None and segments[i + 1].base > plan.floor:
                plan.held = len(closed) - i  # old enough, but something in it is still owed
                break
            plan.age = i + 1
        need = self._bytes_over_limit(segments)
        i = 0
        while need > 0 and i < len(closed):
            need -= closed[i].size
            i += 1
        plan.limit = i

    def _bytes_over_limit(self, segments) -> int:
        """Bytes the disk limits want freed now (0: within both)."""
        cfg = self._store.config
        need = 0
        if cfg.disk_quota_mb:
            need = sum(s.size for s in segments) - cfg.disk_quota_mb * 1024 * 1024
        if cfg.disk_max_used_ratio < 1.0:
            st = self.statvfs(self._store.data_dir)
            # The share df shows as Use%: used over what is usable (blocks reserved for root count as
            # neither), so the limit means what an operator reads off df, on any reserve size.
            used = (st.f_blocks - st.f_bfree) * st.f_frsize
            usable = used + st.f_bavail * st.f_frsize
            need = max(need, int(used - cfg.disk_max_used_ratio * usable))
        return max(0, need)

    # -- running ------------------------------------------------------------------------------

    def run(self) -> defer.Deferred:
        """One retention pass; fires with a RetentionReport. Overlapping calls share one pass."""
        if self._running is not None:
            return self._running
        d = self._running = defer.maybeDeferred(self._run)

        def done(result):
            self._running = None
            return result

        return d.addBoth(done)

    @defer.inlineCallbacks
    def _run(self):
        store = self._store
        store.drain()  # puts waiting for this tick go first, so the indexes are current
        plan = yield self._plan()
        report = RetentionReport(floor=plan.floor)
        self.runs += 1
        held = (plan.floor, plan.floor_owner) if plan.held else None
        if held != self._held:  # said once per change, not every run
            self._held = held
            if held is not None:
                log.info("retention_held floor=%d owner=%r segments_kept=%d", plan.floor, plan.floor_owner,
                         plan.held)
        if plan.count and getattr(store, "replica_of", ""):
            # A slave writes nothing of its own (its log is a copy of its master's): the master carries, and its
            # copies arrive here; until then the segments holding what would be carried stay.
            count = self._below_carried(plan.count)
            if count:
                self._delete(plan, count, report)
        elif plan.count:
            new_min = store.commit_log.segments()[plan.count].base
            report.carried = yield self._carry(new_min)
            again = yield self._plan()  # positions may have moved while the carried records were written
            count = min(plan.count, again.count) if again.count else 0
            if count:
                self._delete(again, count, report)
        store.collect_idle_queues(plan.owed)  # a queue someone reads is not idle
        return report

    def _below_carried(self, count: int) -> int:
        """How many of the ``count`` leading segments hold nothing a carrier wants kept."""
        segments = self._store.commit_log.segments()
        wanted = [off for carrier in self._carriers for off, _size in carrier(segments[count].base)]
        if not wanted:
            return count
        low = min(wanted)
        n = 0
        while n < count and segments[n + 1].base <= low:
            n += 1
        return n

    @defer.inlineCallbacks
    def _carry(self, below: int):
        store = self._store
        wanted: list[tuple[int, int]] = []
        for carrier in self._carriers:
            wanted.extend(carrier(below))
        if not wanted:
            return 0
        puts = []
        for cl_offset, size in wanted:
            record = yield store.read(cl_offset, size)
            props = {k: v for k, v in record.properties.items() if k != rec.QUEUES_PROPERTY}
            props[CARRIED] = str(cl_offset)
            puts.append(store.put(rec.Message(record.topic, record.body, rec.RecordKind.SYSTEM, record.qos,
                                              record.retain, record.client_id, record.born_ts, props)))
        results = yield defer.gatherResults(puts, consumeErrors=True)
        bad = [r for r in results if not r.ok]
        if bad:
            raise RuntimeError(f"carrying {len(bad)} of {len(results)} records failed: {bad[0].reason}")
        log.info("retention_carried records=%d below=%d", len(results), below)
        return len(results)

    def _delete(self, plan: _Plan, count: int, report: RetentionReport):
        store = self._store
        new_min = store.commit_log.segments()[count].base
        forced = count > plan.age
        report.reason = "disk_limit" if forced else "age"
        report.deleted = store.commit_log.delete_oldest(count, report.reason)
        store.log_truncated()
        if not forced:
            return
        index = store.queue_index
        named = 0
        for queue, (qoff, cl, old_min) in plan.first_owed.items():
            if cl >= new_min:
                continue
            first_live = index.min_offset(queue)
            start = max(qoff, old_min)  # what earlier runs dropped was counted then
            if first_live <= start:
                continue
            self.dropped[queue] += first_live - start
            report.dropped[queue] = first_live - start
            for o in plan.owed[queue]:
                lo = max(o.queue_offset, old_min)
                if lo < first_live and named < MAX_NAMED_DROPS:
                    named += 1
                    log.warning("retention_dropped_owed queue=%s owner=%r queue_offsets=[%d,%d) messages=%d "
                                "reason=disk_limit", queue, o.owner, lo, first_live, first_live - lo)
        if report.dropped:
            log.warning("retention_dropped_owed_total queues=%d messages=%d named=%d reason=disk_limit "
                        "(twistmq_retention_dropped_messages_total has every queue)", len(report.dropped),
                        sum(report.dropped.values()), named)
