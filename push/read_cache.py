"""A read cache in front of ``store.get``: one store read serves every session on a queue.

Sessions subscribed to the same filter read the same light-queue offsets at
nearly the same time. The cache keeps the most recent messages of each queue
(by queue offset) so only the first reader touches the store.
"""

from __future__ import annotations

from collections import OrderedDict

from twisted.internet import defer


MAX_CACHED_RECORD = 8192


class ReadCache:
    """Per-queue windows of recent QueueMessages, bounded in total entries."""

    def __init__(self, store, max_entries: int = 65536, per_queue: int = 4096, max_bytes: int = 8 << 20) -> None:
        self._store = store
        self._max_entries = max_entries
        self._per_queue = per_queue
        self._max_bytes = max_bytes
        self._queues: OrderedDict[str, dict[int, object]] = OrderedDict()
        self._entries = 0
        self._bytes = 0  # record bytes held: large payloads must not multiply memory
        self.hits = 0
        self.misses = 0

    def get(self, queue: str, offset: int, max_count: int) -> defer.Deferred:
        """Messages of ``queue`` from ``offset`` (at most ``max_count``), from cache when possible."""
        cached = self._queues.get(queue)
        if cached is not None:
            out = []
            o = offset
            while len(out) < max_count:
                m = cached.get(o)
                if m is None:
                    break
                out.append(m)
                o += 1
            if out:
                self.hits += len(out)
                self._queues.move_to_end(queue)
                if len(out) == max_count:
                    return defer.succeed(out)
                # partially cached: read the rest from the store
                return self._store.get(queue, o, max_count - len(out)).addCallback(
                    lambda more: out + self._fill(queue, more))
        return self._store.get(queue, offset, max_count).addCallback(lambda got: self._fill(queue, got))

    def _fill(self, queue: str, messages: list) -> list:
        self.misses += len(messages)
        if not messages:
            return messages
        cached = self._queues.get(queue)
        if cached is None:
            cached = self._queues[queue] = {}
        else:
            self._queues.move_to_end(queue)
        for m in messages:
            if m.record.size > MAX_CACHED_RECORD:
                continue  # big payloads are not worth their memory here
            if m.queue_offset not in cached:
                cached[m.queue_offset] = m
                self._entries += 1
                self._bytes += m.record.size
        if len(cached) > self._per_queue:
            for off in sorted(cached)[: len(cached) - self._per_queue // 2]:
                self._bytes -= cached.pop(off).record.size
                self._entries -= 1
        while (self._entries > self._max_entries or self._bytes > self._max_bytes) and self._queues:
            _, evicted = self._queues.popitem(last=False)
            self._entries -= len(evicted)
            self._bytes -= sum(m.record.size for m in evicted.values())
        return messages
