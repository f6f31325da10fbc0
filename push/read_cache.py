"""A read cache in front of ``read_queue``: one store read serves every session on a queue.

Sessions subscribed to the same filter read the same light-queue positions at
nearly the same time. The cache keeps the most recent messages of each queue
(per broker group), keyed by their ``QueuePosition``, so only the first reader
reaches the store. Positions stay opaque: each cached message remembers the
position its read said comes next, so a walk through the cache never computes
with offsets, and a gap retention left is walked the way the store reported it.
Each entry also links to the next entry once known, so a walk costs one dict
lookup per read rather than one per message (fan-out reads the same run of
messages once per subscriber). Readers that ask for a position whose store read
is under way wait for that read instead of starting their own: after news, every
session on a queue asks for the same position in the same tick, and across RPC
the first read has not come back when the others ask.
"""

from __future__ import annotations

from collections import OrderedDict
from operator import attrgetter

from twisted.internet import defer
from twisted.python.failure import Failure

from store.api import QueuePosition, QueuedMessage, Queues, ReadResult

MAX_CACHED_RECORD = 8192
_offset = attrgetter("offset")  # sorts one window's positions in their own order

# Every cache hit answers with a ReadResult; a frozen dataclass's __init__ sets each field through
# object.__setattr__, so the slots are filled directly (the same object, in about half the time).
_new = object.__new__
_rr_messages, _rr_next, _rr_lost = (ReadResult.__dict__[f].__set__ for f in ("messages", "next", "lost"))


def _read_result(messages: tuple, next_position: QueuePosition, lost: int) -> ReadResult:
    r = _new(ReadResult)
    _rr_messages(r, messages)
    _rr_next(r, next_position)
    _rr_lost(r, lost)
    return r


class ReadCache:
    """Per-queue windows of recent messages, bounded in entries and bytes."""

    # One hot queue may use a quarter of the entries: fan-out readers spread over more than a few thousand
    # messages (paused connections resume at different times), and a smaller window missed for all of them.
    def __init__(self, store: Queues, max_entries: int = 65536, per_queue: int = 16384,
                 max_bytes: int = 8 << 20) -> None:
        self._store = store
        self._max_entries = max_entries
        self._per_queue = per_queue
        self._max_bytes = max_bytes
        # (queue, group) -> position -> [message, position of the next message, the next entry or None]
        self._queues: OrderedDict[tuple[str, str], dict[QueuePosition, list]] = OrderedDict()
        # queue -> group -> the position a store read last found to be the end, until news of the queue
        self._ends: dict[str, dict[str, QueuePosition]] = {}
        self._news: dict[str, int] = {}  # queue -> news heard: a read answered after news found no end
        # position -> readers waiting on the store read from it under way: [(Deferred, max_count, enough)]
        self._reading: dict[QueuePosition, list] = {}
        self._entries = 0
        self._bytes = 0  # record bytes held: large payloads must not multiply memory
        self.hits = 0
        self.misses = 0

    def read(self, position: QueuePosition, max_count: int, enough: int | None = None) -> defer.Deferred[ReadResult]:
        """Up to ``max_count`` messages from ``position`` on (as ``Queues.read_queue``), from cache when possible.

        ``enough``: as many cached messages as that are answer enough, without a
        store read for the rest (a reader whose window takes only a few).
        """
        key = (position.queue, position.group)
        cached = self._queues.get(key)
        if cached is not None:
            entry = cached.get(position)
            if entry is not None:
                out: list[QueuedMessage] = []
                while True:
                    out.append(entry[0])
                    if len(out) == max_count:
                        break
                    following = entry[2]
                    if following is None or following[0] is None:  # not linked yet, or evicted since
                        following = cached.get(entry[1])
                        entry[2] = following
                        if following is None:
                            break
                    entry = following
                p = entry[1]
                self.hits += len(out)
                self._queues.move_to_end(key)
                if len(out) == max_count or (enough is not None and len(out) >= enough):
                    return defer.succeed(_read_result(tuple(out), p, 0))
                ends = self._ends.get(position.queue)
                end = ends.get(position.group) if ends is not None else None
                if end is p or (end is not None and end == p):  # usually the very object the fill stored
                    return defer.succeed(_read_result(tuple(out), p, 0))
                # partly cached: read the rest from the store
                rest = max_count - len(out)
                return self._store.read_queue(p, rest).addCallback(
                    self._joined, key, tuple(out), rest, self._news.get(position.queue, 0))
        waiting = self._reading.get(position)
        if waiting is not None:
            d: defer.Deferred = defer.Deferred()
            waiting.append((d, max_count, enough))
            return d
        self._reading[position] = []
        d = self._store.read_queue(position, max_count).addCallback(
            self._fill, key, max_count, self._news.get(position.queue, 0))
        return d.addBoth(self._answer_waiting, position, max_count)

    def _answer_waiting(self, result, position: QueuePosition, asked: int):
        """The store read from ``position`` is back: the readers that waited on it get their answers."""
        for d, max_count, enough in self._reading.pop(position, ()):
            if isinstance(result, Failure):
                d.errback(result)
            elif max_count == asked or (max_count > asked and len(result.messages) < asked):
                d.callback(result)  # the same question (or the whole queue): the same answer
            else:
                self.read(position, max_count, enough).chainDeferred(d)  # from the cache it just filled
        return result

    def news(self, queue: str) -> None:
        """``queue`` has news: the ends found so far are ends no more (``QueueWatches`` calls this first)."""
        self._news[queue] = self._news.get(queue, 0) + 1
        self._ends.pop(queue, None)

    def read_through(self, position: QueuePosition, max_count: int) -> defer.Deferred[ReadResult]:
        """A read straight from the store, not cached: a queue with one reader here gains nothing from it."""
        return self._store.read_queue(position, max_count)

    def _joined(self, result: ReadResult, key, head: tuple, asked: int, news: int) -> ReadResult:
        self._fill(result, key, asked, news)
        return ReadResult(head + result.messages, result.next, result.lost)

    def _fill(self, result: ReadResult, key, asked: int, news: int = -1) -> ReadResult:
        messages = result.messages
        self.misses += len(messages)
        queue, group = key
        if len(messages) < asked and not result.lost and self._news.get(queue, 0) == news:
            # Short of what was asked: the end, as of now. Until news comes, a cached run that stops
            # there is the whole answer (every reader of a fan-out would otherwise ask the store again).
            self._ends.setdefault(queue, {})[group] = result.next
        else:
            self._ends.get(queue, {}).pop(group, None)
        if not messages:
            return result
        cached = self._queues.get(key)
        if cached is None:
            cached = self._queues[key] = {}
        else:
            self._queues.move_to_end(key)
        last = len(messages) - 1
        before = len(cached)
        previous = None
        for i, m in enumerate(messages):
            size = m.record.size
            if size > MAX_CACHED_RECORD:
                previous = None
                continue  # big payloads are not worth their memory here
            held = len(cached)
            # [message, position of the next message, the next entry once known]: a walk follows the links
            entry = cached.setdefault(m.position, [m, messages[i + 1].position if i < last else result.next, None])
            if len(cached) != held:
                self._bytes += size
            if previous is not None:
                previous[2] = entry
            previous = entry
        self._entries += len(cached) - before
        if len(cached) > self._per_queue:
            # The oldest positions go first, not the oldest inserted: a lagging reader's refill goes in after
            # what the leaders read, and evicting in insertion order would throw away the leaders' messages
            # (fan-out readers spread out, and every reader then missed). Sorting by the offset is the
            # positions' own order (one queue and group per window); a quarter goes, so sorts are rare.
            for p in sorted(cached, key=_offset)[:len(cached) - self._per_queue * 3 // 4]:
                self._drop(cached.pop(p))
        while (self._entries > self._max_entries or self._bytes > self._max_bytes) and self._queues:
            _, evicted = self._queues.popitem(last=False)
            for entry in evicted.values():
                self._drop(entry)
        return result

    def _drop(self, entry: list) -> None:
        """Forget an evicted entry; a link to it from a kept one reads as "not linked" (its message is None)."""
        self._bytes -= entry[0].record.size
        self._entries -= 1
        entry[0] = entry[2] = None
