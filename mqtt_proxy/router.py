"""The subscription router: filters registered in the store, shared groups, and what a session drops at its end.

SUBSCRIBE and UNSUBSCRIBE (``subscribe.py``) go through it; the session
registry asks it to rebuild stored subscriptions after a restart and to release
a session's filters when the session ends. Shared groups (``$share/g/filter``)
live here, one per group and filter, created at their committed offset.
"""

from __future__ import annotations

from twisted.internet import defer

from mqtt_proxy.auth.acl import ACL
from mqtt_proxy.config import LimitsConfig
from mqtt_proxy.delivery import SessionContext
from mqtt_proxy.session import Session, Subscription
from mqtt_proxy.session_store import SessionStore
from mqtt_proxy.shared import SharedGroup
from store.api import Owed


class SubscriptionRouter:
    """Filters in the store, shared groups, retained messages on subscribe, subscription ACL and limits."""

    def __init__(self, store, ctx: SessionContext, retained, acl: ACL, limits: LimitsConfig) -> None:
        self.store = store
        self.ctx = ctx
        self.sessions_db: SessionStore = ctx.sessions_db
        self.retained = retained
        self.acl = acl
        self.limits = limits
        self.groups: dict[tuple[str, str], SharedGroup] = {}

    def now_ms(self) -> int:
        return self.ctx.delivery.now_ms()

    @defer.inlineCallbacks
    def restore_subscription(self, session: Session, key: str, ss):
        """A stored subscription back as a live one: its filter registered again, its group joined."""
        queue = yield self.store.add_filter(ss.topic_filter)
        sub = Subscription(key, ss.topic_filter, queue, ss.qos, ss.no_local, ss.retain_as_published, ss.sub_id,
                           next_offset=ss.next_offset)
        if ss.share_group is not None:
            sub.share = yield self.shared_group(ss.share_group, ss.topic_filter, queue)
            sub.share.subscribers += 1
        return sub

    @defer.inlineCallbacks
    def shared_group(self, group: str, topic_filter: str, queue: str):
        """The SharedGroup of ``$share/group/filter``, created at its committed offset."""
        g = self.groups.get((group, topic_filter))
        if g is None:
            start = self.sessions_db.load_group_offset(group, topic_filter)
            if start is None:
                start = yield self.store.max_offset(queue)
                self.sessions_db.save_group_offset(group, topic_filter, start)
            g = self.groups.get((group, topic_filter))  # created meanwhile by another subscribe?
            if g is None:
                g = self.groups[(group, topic_filter)] = SharedGroup(self.ctx, group, topic_filter, queue, start)
        return g

    def drop_group_member(self, sub: Subscription) -> None:
        g = sub.share
        g.subscribers -= 1
        if g.subscribers <= 0:
            g.close()
            self.groups.pop((g.group, g.topic_filter), None)

    def release(self, session: Session) -> None:
        """The session ends: its filters leave the store and its group memberships end."""
        for sub in session.subs.values():
            self.store.remove_filter(sub.topic_filter)
            if sub.share is not None:
                self.drop_group_member(sub)
        session.subs = {}

    def owed(self):
        """Retention holder part: per shared group, its committed offset."""
        for (group, topic_filter), g in self.groups.items():
            yield Owed(f"share {group} {topic_filter}", g.queue, g.committed)
