"""Tells consumers which queues have news.

An event carries only a queue name; every consumer that watches the queue is
told, and pulls from its own offset. The store's listener feeds ``notify_now``
(the store names each queue once per drained batch, so its news is merged
already); ``notify`` merges a tick's events first, for callers whose news is not.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping

log = logging.getLogger("twistmq.push")


class Notifier:
    """Queue name -> watchers; news merged per tick."""

    def __init__(self, clock) -> None:
        self._clock = clock
        self._watchers: dict[str, dict[int, Callable[[str], None]]] = {}
        self._dirty: set[str] = set()
        self._call = None
        self.events_in = 0
        self.events_out = 0

    def watch(self, queue: str, key: int, callback: Callable[[str], None]) -> None:
        """Call ``callback(queue)`` when ``queue`` gains entries; ``key`` identifies the watcher."""
        self._watchers.setdefault(queue, {})[key] = callback

    def unwatch(self, queue: str, key: int) -> None:
        """Stop telling watcher ``key`` about ``queue``."""
        watchers = self._watchers.get(queue)
        if watchers is not None:
            watchers.pop(key, None)
            if not watchers:
                del self._watchers[queue]

    def watched(self, queues: Iterable[str], excluding: Mapping[str, int] | None = None) -> bool:
        """Whether anyone watches one of ``queues`` (the store keeps such appends in memory); ``excluding``:
        queue -> watches that do not count (a proxy's, for the appends it reads from what it sent)."""
        watchers = self._watchers
        for q in queues:
            if q in watchers and (excluding is None or len(watchers[q]) > excluding.get(q, 0)):
                return True
        return False

    def notify(self, queues: Iterable[str]) -> None:
        """Record news for ``queues``; watchers hear about each once, at the end of the tick."""
        for q in queues:
            self.events_in += 1
            if q in self._watchers:
                self._dirty.add(q)
        if self._dirty and self._call is None:
            self._call = self._clock.callLater(0, self._fire)

    def notify_now(self, queues: Iterable[str]) -> None:
        """Tell the watchers of ``queues`` at once: for a caller whose news is merged already.

        The store calls its listeners once per drained batch, with each queue
        named once: that is the tick's merge. Waiting for the next tick only
        delayed delivery by a reactor iteration, and split a QoS 1 exchange
        into two writes a loop apart (the publisher's PUBACK, then the
        subscriber's PUBLISH), which costs a client a second wake-up.
        """
        watchers = self._watchers
        for q in queues:
            self.events_in += 1
            if q in watchers:
                self._tell(q)

    def _fire(self) -> None:
        self._call = None
        dirty, self._dirty = self._dirty, set()
        for q in dirty:
            self._tell(q)

    def _tell(self, q: str) -> None:
        for callback in list(self._watchers.get(q, {}).values()):
            self.events_out += 1
            try:
                callback(q)
            except Exception:  # noqa: BLE001 - one broken watcher must not starve the others
                log.exception("push_watcher_failed queue=%s", q)
