"""``OwnAppends``: the entries a proxy's own appends made in the queues it watches, to answer reads without a call.

It keeps the entries a broker's news carried the same way (``add_read``): a
publisher on another proxy, read by a session here at the tail, then costs no
read either.

A proxy stores what its clients publish and, in a fan-in, reads the very same
messages back for its subscribers: a second round trip that carries every
message's bytes back to where they came from. A broker's answer to
``append_batch`` says where the batch's records went in the queues the proxy
watches (``store.api.IndexedAppend``: the first queue offset per queue, the
store time, each record's size), once any reader may see them. This keeps those
entries, built from the messages the proxy sent, and answers a read that starts
at one of them.

It never answers past what it knows to be all there is. A read is answered here
only when the run of kept entries from its position fills it, or reaches the
queue's end as the last news of the queue said (``news``): an entry someone
else appended after ours has news of its own, so a short answer never hides one
the broker already told of (the session would otherwise wait for the next news).
For the same reason a read at that end, right after our newest run, is answered
empty here (a caught-up session's read after its acknowledgements).
Anything else (a position before or between kept runs, a run short of the known
end, another group's position) goes to the broker as before.

Sans-IO and bounded: at most ``max_entries`` entries and ``max_bytes`` of record
bytes over all queues, the oldest runs dropped first (a reader that far behind
reads from the broker). As large as the proxy's read cache: a fan-in's subscriber
falls behind its publishers by tens of thousands of messages, and each read that
falls back to the broker costs more than the entries it would have found here.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import attrgetter, countOf

from store import api
from store.record import Message, Record

MAX_ENTRIES = 32768
"""Entries kept over all queues: a subscriber this far behind its publishers reads from the broker."""
MAX_BYTES = 8 << 20
"""Record bytes kept over all queues (big payloads must not multiply memory)."""

# A frozen dataclass's __init__ sets each field through object.__setattr__: a position and a queued message per
# entry are made by filling their slots a field at a time over the whole run (the same, equal, hashable objects).
_new = object.__new__
_QP, _QM = api.QueuePosition, api.QueuedMessage
_qp_queue, _qp_group, _qp_offset = (_QP.__dict__[f].__set__ for f in ("queue", "group", "offset"))
_qm_position, _qm_record = (_QM.__dict__[f].__set__ for f in ("position", "record"))


_queues_of, _status_of, _size_of = attrgetter("queues"), attrgetter("status"), attrgetter("size")
_record_of = attrgetter("record")
_OK = api.AppendStatus.PUT_OK  # compared by identity (countOf): an Enum member hashes in Python


def _queued(queue: str, group: str, first: int, records: list) -> tuple:
    n = len(records)
    positions = list(map(_new, repeat(_QP, n)))
    deque(map(_qp_queue, positions, repeat(queue, n)), 0)
    deque(map(_qp_group, positions, repeat(group, n)), 0)
    deque(map(_qp_offset, positions, range(first, first + n)), 0)
    out = list(map(_new, repeat(_QM, n)))
    deque(map(_qm_position, out, positions), 0)
    deque(map(_qm_record, out, records), 0)
    return tuple(out)


class OwnAppends:
    """``OwnAppends(max_entries, max_bytes)``: ``add`` after each answered append, ``add_read`` with the entries
    of a queue event, ``news`` with each queue event, ``read`` for each read of a session."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._bytes = 0
        self._runs: dict[str, deque] = {}  # queue -> runs [(first offset, group, messages)], oldest first
        # queue -> (first offset, group) -> the newest run starting there: a read that goes on past one run finds
        # the next in one lookup (each news or append is a run: a walk over all of them cost a live reader as much
        # as a round trip)
        self._starts: dict[str, dict[tuple[int, str], tuple]] = {}
        self._order: deque = deque()  # (queue, count, record bytes) per run kept, oldest first: what eviction drops
        self._entries = 0
        # queue -> its end as the last news told (entries before it exist), for the queues with runs only: news
        # of entries after a run of ours always comes after the answer that made the run
        self._ends: dict[str, int] = {}
        self.answered = 0  # reads answered here (for metrics and tests)

    def clear(self) -> None:
        """Forget everything (a new connection: the broker may have changed, and its news with it)."""
        self._runs.clear()
        self._starts.clear()
        self._order.clear()
        self._entries = 0
        self._bytes = 0
        self._ends.clear()

    def forget(self, queue: str) -> None:
        """Drop what is kept of ``queue`` (its last watch here went: no news of it comes any more, so its end as
        the last news told would soon be stale, and a read at that end answered empty though entries came)."""
        runs = self._runs.pop(queue, None)
        self._starts.pop(queue, None)
        self._ends.pop(queue, None)
        if runs is None:
            return
        self._order = deque(kept for kept in self._order if kept[0] != queue)
        for _first, _group, messages in runs:
            self._entries -= len(messages)
            self._bytes -= sum(map(_size_of, map(_record_of, messages)))

    def news(self, queue: str, end: int) -> None:
        """The broker's news of ``queue``: its entries now end at ``end`` (-1: unknown, so nothing kept for it
        answers a read any more until an append of ours tells again)."""
        if queue not in self._runs:
            return
        if end < 0:
            self._ends[queue] = 1 << 62
        elif end > self._ends.get(queue, -1):
            self._ends[queue] = end

    def add(self, messages: tuple[Message, ...], results: tuple[api.AppendResult, ...],
            indexed: api.IndexedAppend) -> dict[str, int]:
        """Keep the entries an answered ``append_batch`` made in the queues ``indexed`` names; return where they
        end in each (queue -> offset after the batch's last entry): the answer is news of them."""
        ends: dict[str, int] = {}
        firsts = indexed.firsts
        queue_sets = list(map(_queues_of, results))
        distinct = set(queue_sets)  # a topic's results share one tuple: a batch has a few
        reached = {queues: tuple(q for q in queues if q in firsts) for queues in distinct}
        if len(set(reached.values())) == 1 and countOf(map(_status_of, results), _OK) == len(results):
            # Every message stored and in the same told queues (a fan-in's batch): one run per queue.
            (wanted,) = set(reached.values())
            if wanted:
                records = self._records(messages, results, indexed)
                for q in wanted:
                    ends[q] = self._keep(q, indexed.group, firsts[q], records)
            return ends
        runs: dict[str, list] = {q: [] for q in firsts}
        ok = api.AppendStatus.PUT_OK
        for record, r, queues in zip(self._records(messages, results, indexed), results, queue_sets):
            if r.status is ok:
                for q in reached[queues]:
                    runs[q].append(record)
        for queue, records in runs.items():
            if records:
                ends[queue] = self._keep(queue, indexed.group, firsts[queue], records)
        return ends

    @staticmethod
    def _records(messages: tuple[Message, ...], results: tuple[api.AppendResult, ...],
                 indexed: api.IndexedAppend) -> list[Record]:
        """The Record a broker read would give for each message (born time defaulting to the store time)."""
        ts = indexed.store_ts
        return [Record(r.offset, size, m.kind, m.qos, m.retain, ts, m.born_ts or ts, m.topic, m.client_id,
                       m.properties, m.body) for m, r, size in zip(messages, results, indexed.sizes)]

    def add_read(self, result: api.ReadResult) -> None:
        """Keep the entries a news event carried (``result``: a run of one queue and group, offsets one after
        another, as the broker's read answered them); a run that is not so is not kept."""
        messages = result.messages
        if not messages or result.lost:
            return
        start, nxt = messages[0].position, result.next
        first = start.offset
        if nxt.offset != first + len(messages) or nxt.queue != start.queue or nxt.group != start.group \
                or messages[-1].position.offset != nxt.offset - 1:
            return
        self._keep_run(start.queue, start.group, first, tuple(messages), list(map(_record_of, messages)))

    def _keep(self, queue: str, group: str, first: int, records: list) -> int:
        return self._keep_run(queue, group, first, _queued(queue, group, first, records), records)

    def _keep_run(self, queue: str, group: str, first: int, messages: tuple, records: list) -> int:
        run = (first, group, messages)
        self._runs.setdefault(queue, deque()).append(run)
        self._starts.setdefault(queue, {})[first, group] = run
        size = sum(map(_size_of, records))
        self._order.append((queue, len(messages), size))
        self._entries += len(messages)
        self._bytes += size
        while (self._entries > self.max_entries or self._bytes > self.max_bytes) and self._order:
            old, count, size = self._order.popleft()
            self._bytes -= size
            runs = self._runs[old]
            gone = runs.popleft()
            starts = self._starts[old]
            if starts.get(gone[:2]) is gone:
                del starts[gone[:2]]
            if not runs:
                del self._runs[old]
                del self._starts[old]
                self._ends.pop(old, None)
            self._entries -= count
        return first + len(messages)

    def read(self, position: api.QueuePosition, max_count: int) -> api.ReadResult | None:
        """The answer to ``read_queue(position, max_count)`` from the kept entries, or None (ask the broker)."""
        runs = self._runs.get(position.queue)
        if not runs or max_count < 1:
            return None
        offset, group = position.offset, position.group
        out: list = []
        end = None
        starts = self._starts[position.queue]
        run = starts.get((offset, group))  # a reader that read the run before whole starts at this one
        if run is not None:
            out.extend(run[2][:max_count])
            end = offset + len(out)
        elif offset == self._ends.get(position.queue) == runs[-1][0] + len(runs[-1][2]) and runs[-1][1] == group:
            # At the end of our newest run, which the news says is the queue's end: nothing more now (news of
            # anything after it is still to come, and wakes the reader). Asked first: a caught-up session asks it
            # after every acknowledgement, and the walk below passes every run kept.
            self.answered += 1
            return api.ReadResult((), position, 0)
        else:
            for first, run_group, messages in reversed(runs):  # a live reader is at one of the newest runs
                if first <= offset < first + len(messages) and run_group == group:
                    out.extend(messages[offset - first:offset - first + max_count])
                    end = offset + len(out)
                    break
        if end is None:
            return None
        while len(out) < max_count:  # runs that follow on where this one stops (batches in a row)
            run = starts.get((end, group))
            if run is None or not run[2]:
                break
            out.extend(run[2][:max_count - len(out)])
            end = position.offset + len(out)
        if len(out) < max_count and end < self._ends.get(position.queue, 0):
            return None  # the news told of entries past ours: only the broker has them all
        self.answered += 1
        return api.ReadResult(tuple(out), api.QueuePosition(position.queue, position.group, end), 0)
