"""A read cache in front of ``read_queue``: one store read serves every session on a queue.

Sessions subscribed to the same filter read the same light-queue positions at
nearly the same time. The cache keeps the most recent messages of each queue
(per broker group), keyed by their ``QueuePosition``, so only the first reader
reaches the store. Positions stay opaque: each cached message remembers the
position its read said comes next, so a walk through the cache never computes
with offsets, and a gap retention left is walked the way the store reported it.
"""

from __future__ import annotations

from collections import OrderedDict

from twisted.internet import defer

from store.api import QueuePosition, QueuedMessage, Queues, ReadResult

MAX_CACHED_RECORD = 8192


class ReadCache:
    """Per-queue windows of recent messages, bounded in entries and bytes."""

    def __init__(self, store: Queues, max_entries: int = 65536, per_queue: int = 4096,
                 max_bytes: int = 8 << 20) -> None:
        self._store = store
        self._max_entries = max_entries
        self._per_queue = per_queue
        self._max_bytes = max_bytes
        # (queue, group) -> position -> (message, position of the next message)
        self._queues: OrderedDict[tuple[str, str], dict[QueuePosition, tuple[QueuedMessage, QueuePosition]]] = \
            OrderedDict()
        self._entries = 0
        self._bytes = 0  # record bytes held: large payloads must not multiply memory
        self.hits = 0
        self.misses = 0

    def read(self, position: QueuePosition, max_count: int) -> defer.Deferred[ReadResult]:
        """Up to ``max_count`` messages from ``position`` on (as ``Queues.read_queue``), from cache when possible."""
        key = (position.queue, position.group)
        cached = self._queues.get(key)
        if cached is not None:
            out: list[QueuedMessage] = []
            p = position
            while len(out) < max_count:
                entry = cached.get(p)
                if entry is None:
                    break
                out.append(entry[0])
                p = entry[1]
            if out:
                self.hits += len(out)
                self._queues.move_to_end(key)
                if len(out) == max_count:
                    return defer.succeed(ReadResult(tuple(out), p))
                # partly cached: read the rest from the store
                return self._store.read_queue(p, max_count - len(out)).addCallback(self._joined, key, tuple(out))
        return self._store.read_queue(position, max_count).addCallback(self._fill, key)

    def _joined(self, result: ReadResult, key, head: tuple) -> ReadResult:
        self._fill(result, key)
        return ReadResult(head + result.messages, result.next, result.lost)

    def _fill(self, result: ReadResult, key) -> ReadResult:
        messages = result.messages
        self.misses += len(messages)
        if not messages:
            return result
        cached = self._queues.get(key)
        if cached is None:
            cached = self._queues[key] = {}
        else:
            self._queues.move_to_end(key)
        last = len(messages) - 1
        for i, m in enumerate(messages):
            size = m.record.size
            if size > MAX_CACHED_RECORD or m.position in cached:
                continue  # big payloads are not worth their memory here
            cached[m.position] = (m, messages[i + 1].position if i < last else result.next)
            self._entries += 1
            self._bytes += size
        if len(cached) > self._per_queue:
            for p in sorted(cached)[: len(cached) - self._per_queue // 2]:
                self._bytes -= cached.pop(p)[0].record.size
                self._entries -= 1
        while (self._entries > self._max_entries or self._bytes > self._max_bytes) and self._queues:
            _, evicted = self._queues.popitem(last=False)
            self._entries -= len(evicted)
            self._bytes -= sum(m.record.size for m, _ in evicted.values())
        return result
