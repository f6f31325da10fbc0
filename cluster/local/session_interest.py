"""``SessionInterest``: a broker's own interest in the topic filters of its stored sessions.

On a node the MQTT front end holds filter interest for every session it has,
connected or restored. On a broker the proxies hold it, per connection
(``cluster.remote.server``), and a proxy that dies takes its interest along:
a persistent session whose client has not yet reconnected elsewhere would then
miss what is published meanwhile. So the broker holds one reference of its own
per stored subscription: taken for every subscription in the session KV when
it starts (``restore``), and kept in step as subscriptions are stored and
deleted through it. A slave's subscriptions arrive as replicated records, not through it, so a slave that
becomes master takes its interest again from the session KV (``restore`` again) before it accepts a write: a message
appended before a proxy re-took its interest would otherwise miss the light queue of a stored subscription.
It is the store interface, wrapping another: every other
operation goes straight through.
"""

from __future__ import annotations

import logging

from twisted.internet import defer

from lightqueue.topic import filter_of
from store import api
from store.session_store import SessionStore

log = logging.getLogger("twistmq.cluster.local.session_interest")


class SessionInterest:
    """``store.api.Store`` over ``inner`` that holds filter interest for the sessions stored in ``sessions``."""

    def __init__(self, inner: api.Store, sessions: SessionStore) -> None:
        self._inner = inner
        self._sessions = sessions
        self._held: dict[tuple[str, str], str] = {}  # (client id, subscription key) -> topic filter
        self._keys: dict[str, set[str]] = {}  # client id -> its subscription keys in ``_held``

    def __getattr__(self, name: str):
        return getattr(self._inner, name)  # every operation not written out below

    @property
    def held(self) -> int:
        """Subscriptions whose filter interest the broker holds."""
        return len(self._held)

    def restore(self) -> defer.Deferred:
        """Hold interest in exactly the stored subscriptions' filters: at start (once the store is open), and
        again when this broker becomes master: as a slave its session KV followed the master's through
        replication, while it held interest only in what was stored through it, so a promoted slave would
        index what is published next into no light queue of the sessions subscribed since it started."""
        stored = {(cid, key) for cid, session in self._sessions.load_all().items() for key in session.subscriptions}
        for cid, key in list(self._held):
            if (cid, key) not in stored:  # deleted on the master meanwhile
                self._drop(cid, key)
        ds = [self._take(cid, key, filter_of(key)) for cid, key in sorted(stored)]
        log.info("session_interest_restored subscriptions=%d", len(ds))
        return defer.gatherResults(ds, consumeErrors=True).addCallback(lambda _: None)

    def _take(self, cid: str, key: str, topic_filter: str) -> defer.Deferred:
        if (cid, key) in self._held:
            return defer.succeed(None)
        self._held[(cid, key)] = topic_filter
        self._keys.setdefault(cid, set()).add(key)
        # Subscriptions a proxy stored were accepted already: their interest is never refused for the shape bound.
        return self._inner.add_filter(topic_filter, restoring=True).addErrback(self._failed, "add", topic_filter)

    def _drop(self, cid: str, key: str) -> None:
        topic_filter = self._held.pop((cid, key), None)
        keys = self._keys.get(cid)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys[cid]
        if topic_filter is not None:
            self._inner.remove_filter(topic_filter).addErrback(self._failed, "remove", topic_filter)

    @staticmethod
    def _failed(failure, what: str, topic_filter: str) -> None:
        log.warning("session_interest_failed op=%s filter=%s reason=%s", what, topic_filter,
                    failure.getErrorMessage())

    def put_subscription(self, client_id: str, subscription: api.SubscriptionState, epoch: int) -> defer.Deferred:
        """As ``Sessions.put_subscription``; then the broker holds interest in its filter."""
        def stored(result):
            return self._take(client_id, subscription.key, subscription.topic_filter).addCallback(lambda _: result)

        return self._inner.put_subscription(client_id, subscription, epoch).addCallback(stored)

    def delete_subscription(self, client_id: str, key: str, epoch: int) -> defer.Deferred:
        """As ``Sessions.delete_subscription``; the broker's interest in its filter goes too."""
        def deleted(result):
            self._drop(client_id, key)
            return result

        return self._inner.delete_subscription(client_id, key, epoch).addCallback(deleted)

    def delete_session(self, client_id: str, epoch: int) -> defer.Deferred:
        """As ``Sessions.delete_session``; the broker's interest in all its filters goes too."""
        def deleted(result):
            for key in list(self._keys.get(client_id, ())):  # its own keys, not a scan of every session's
                self._drop(client_id, key)
            return result

        return self._inner.delete_session(client_id, epoch).addCallback(deleted)
