"""``LoggedInterest``: the topic filters a broker's light-queue index matches, kept in the group's log.

A broker indexes a publish into the light queue of every filter someone holds
interest in *when it is appended*; a filter nobody holds then gets nothing,
for good. Interest is held in memory, per proxy connection, so a broker that
becomes master (a slave promoted, or a master restarted) starts without the
proxies' interest, and a proxy that appends there before another proxy took
its interest again would leave that proxy's subscribers without the message
(acknowledged, stored on every replica, never delivered).

So the master writes each filter's interest into the session log (``f/`` +
filter, replicated with the rest of session state) when its first holder
comes, before it answers, and deletes it when its last holder goes. A broker
that becomes master (``became_master``) holds every logged filter itself for
``grace`` seconds: the time the proxies have to take their interest again (a
lease); then it lets go, and a filter nobody took again is deleted. A slave
only counts (its writes are refused; the log brings its master's).

It is the store interface, wrapping another: every operation but the two
interest calls goes straight through.
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.internet import defer

from store import api
from store.session_log import SessionLog

log = logging.getLogger("twistmq.cluster.local.logged_interest")

PREFIX = b"f/"


class LoggedInterest:
    """``store.api.Store`` over ``inner`` whose filter interest is kept in ``session_log`` while writable."""

    def __init__(self, inner: api.Store, session_log: SessionLog, writable: Callable[[], bool], clock,
                 grace: float) -> None:
        self._inner = inner
        self._log = session_log
        self._writable = writable
        self._clock = clock
        self._grace = grace
        self._counts: dict[str, int] = {}  # filter -> references held through this wrapper
        self._graced: list[str] = []  # filters held for the proxies' return (one reference each)
        self._release = None
        self.logged = 0  # filters written to the log (metrics, tests)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def add_filter(self, topic_filter: str, restoring: bool = False) -> defer.Deferred:
        """As ``Queues.add_filter``; the first holder's answer waits until the filter is in the log."""
        def added(queue: str):
            count = self._counts.get(topic_filter, 0) + 1
            self._counts[topic_filter] = count
            key = PREFIX + topic_filter.encode("utf-8")
            if not self._writable() or self._log.get(key) is not None:
                return queue
            self.logged += 1
            return self._log.put(key, b"").addCallbacks(lambda _: queue, self._not_logged, errbackArgs=(queue,))

        return self._inner.add_filter(topic_filter, restoring).addCallback(added)

    @staticmethod
    def _not_logged(failure, queue: str) -> str:
        # The index holds the interest already; the log lags until the next holder or promotion writes it.
        log.warning("filter_interest_not_logged queue=%s reason=%s", queue, failure.getErrorMessage())
        return queue

    def remove_filter(self, topic_filter: str) -> defer.Deferred:
        """As ``Queues.remove_filter``; the last holder's going deletes the filter from the log."""
        def removed(result):
            count = self._counts.get(topic_filter, 0) - 1
            if count > 0:
                self._counts[topic_filter] = count
                return result
            self._counts.pop(topic_filter, None)
            key = PREFIX + topic_filter.encode("utf-8")
            if self._writable() and self._log.get(key) is not None:
                self._log.delete(key).addErrback(self._delete_failed, topic_filter)
            return result

        return self._inner.remove_filter(topic_filter).addCallback(removed)

    @staticmethod
    def _delete_failed(failure, topic_filter: str) -> None:
        log.warning("filter_interest_delete_failed filter=%s reason=%s", topic_filter, failure.getErrorMessage())

    def became_master(self) -> int:
        """Hold every logged filter for ``grace`` seconds, and log the filters held here but not there; call before
        the first write is accepted (the index takes the interest synchronously). Answers how many are held."""
        logged = [k[len(PREFIX):].decode("utf-8") for k, _ in self._log.scan(PREFIX)]
        fresh = [f for f in logged if f not in self._graced]
        for topic_filter in fresh:
            self.add_filter(topic_filter, restoring=True).addErrback(self._hold_failed, topic_filter)
        self._graced += fresh
        for topic_filter in list(self._counts):
            key = PREFIX + topic_filter.encode("utf-8")
            if topic_filter not in fresh and self._log.get(key) is None:
                self._log.put(key, b"").addErrback(self._hold_failed, topic_filter)
        if self._release is not None and self._release.active():
            self._release.cancel()
        self._release = self._clock.callLater(self._grace, self._let_go)
        log.info("filter_interest_held filters=%d grace_s=%g", len(fresh), self._grace)
        return len(fresh)

    def _let_go(self) -> None:
        self._release = None
        graced, self._graced = self._graced, []
        for topic_filter in graced:
            self.remove_filter(topic_filter).addErrback(self._hold_failed, topic_filter)
        log.info("filter_interest_released filters=%d still_held=%d", len(graced), len(self._counts))

    @staticmethod
    def _hold_failed(failure, topic_filter: str) -> None:
        log.warning("filter_interest_hold_failed filter=%s reason=%s", topic_filter, failure.getErrorMessage())

    def stop(self) -> None:
        """Cancel the pending release (the broker stops)."""
        if self._release is not None and self._release.active():
            self._release.cancel()
        self._release = None
