"""Queue watches on the proxy side: one store watch per queue, shared by every local watcher of it.

Sessions and shared groups each want to hear when a queue they read from has
news; the store is asked once per queue (``Queues.watch_queue``) and its events
are handed to every local watcher. A registration takes effect some ticks after
it is asked for (a remote store): when it does, the watchers are told once, so
a message appended in between is not left unread until the next one.
"""

from __future__ import annotations

import logging
from typing import Callable, Hashable

from store.api import Queues, Watch

log = logging.getLogger("twistmq.push.watches")


class QueueWatches:
    """Queue name -> local watchers, over one store watch per queue."""

    def __init__(self, store: Queues, before_news: Callable[[str], None] | None = None) -> None:
        self._store = store
        self._before_news = before_news  # told first of each queue's news (the read cache forgets its end)
        self._watchers: dict[str, dict[Hashable, Callable[[str], None]]] = {}
        self._held: dict[str, Watch | None] = {}  # queue -> the store's watch (None while it registers)

    def watch(self, queue: str, key: Hashable, callback: Callable[[str], None]) -> None:
        """Call ``callback(queue)`` when ``queue`` has news; ``key`` names the watcher for ``unwatch``."""
        self._watchers.setdefault(queue, {})[key] = callback
        if queue not in self._held:
            self._held[queue] = None
            d = self._store.watch_queue(queue, self._news)
            d.addCallbacks(self._registered, self._failed, callbackArgs=(queue,), errbackArgs=(queue,))

    def unwatch(self, queue: str, key: Hashable) -> None:
        """Stop telling watcher ``key`` about ``queue``; the store watch goes with the last watcher."""
        watchers = self._watchers.get(queue)
        if watchers is None:
            return
        watchers.pop(key, None)
        if watchers:
            return
        del self._watchers[queue]
        held = self._held.get(queue)
        if held is not None:  # else it is still registering: _registered drops it
            del self._held[queue]
            self._store.unwatch_queue(held).addErrback(self._unwatch_failed, queue)

    def watchers(self, queue: str) -> int:
        """How many local watchers ``queue`` has (its readers here)."""
        watchers = self._watchers.get(queue)
        return 0 if watchers is None else len(watchers)

    def watched(self) -> int:
        """How many queues are watched (metrics, tests)."""
        return len(self._watchers)

    def _registered(self, watch: Watch, queue: str) -> None:
        if not self._watchers.get(queue):
            self._held.pop(queue, None)
            self._store.unwatch_queue(watch).addErrback(self._unwatch_failed, queue)
            return
        self._held[queue] = watch
        self._news(queue)  # whatever came while the watch was registering

    def _failed(self, failure, queue: str) -> None:
        self._held.pop(queue, None)
        log.error("watch_failed queue=%s error=%s", queue, failure.getErrorMessage())

    @staticmethod
    def _unwatch_failed(failure, queue: str) -> None:
        log.warning("unwatch_failed queue=%s error=%s", queue, failure.getErrorMessage())

    def _news(self, queue: str) -> None:
        if self._before_news is not None:
            self._before_news(queue)
        for callback in list(self._watchers.get(queue, {}).values()):
            try:
                callback(queue)
            except Exception:  # noqa: BLE001 - one broken watcher must not starve the others
                log.exception("push_watcher_failed queue=%s", queue)
