"""The subscription router: filters registered in the store, shared groups, and what a session drops at its end.

SUBSCRIBE and UNSUBSCRIBE (``subscribe.py``) go through it; the session
registry asks it to rebuild stored subscriptions after a restart and to release
a session's filters when the session ends. Shared groups (``$share/g/filter``)
live here, one per group and filter, created at their committed positions.
"""

from __future__ import annotations

import logging

from twisted.internet import defer

from mqtt_proxy.auth.acl import ACL
from mqtt_proxy.config import LimitsConfig
from mqtt_proxy.delivery import SessionContext
from mqtt_proxy.session import Session, Subscription
from mqtt_proxy.session_state import SubOptions
from mqtt_proxy.shared import SharedGroup
from store.api import Owed, Store, SubscriptionState

log = logging.getLogger("twistmq.mqtt.router")


class SubscriptionRouter:
    """Filters in the store, shared groups, retained messages on subscribe, subscription ACL and limits."""

    def __init__(self, store: Store, ctx: SessionContext, acl: ACL, limits: LimitsConfig) -> None:
        self.store = store  # filters, end positions, retained messages, share positions
        self.ctx = ctx
        self.acl = acl
        self.limits = limits
        self.groups: dict[tuple[str, str], SharedGroup] = {}

    def now_ms(self) -> int:
        return self.ctx.delivery.now_ms()

    @defer.inlineCallbacks
    def restore_subscription(self, session: Session, ss: SubscriptionState):
        """A stored subscription back as a live one: its filter registered again, its group joined."""
        queue = yield self.store.add_filter(ss.topic_filter, restoring=True)  # accepted before: never refused
        sub = Subscription(ss.key, ss.topic_filter, queue,
                           SubOptions(ss.qos, ss.no_local, ss.retain_as_published, ss.sub_id),
                           positions={p.group: p for p in ss.positions})
        if ss.share_group is not None:
            sub.share = yield self.shared_group(ss.share_group, ss.topic_filter, queue)
            sub.share.subscribers += 1
        elif not sub.positions:  # stored before its queue had a position in any group: start at the end
            sub.positions = {p.group: p for p in (yield self.store.end_positions(queue))}
        return sub

    @defer.inlineCallbacks
    def shared_group(self, group: str, topic_filter: str, queue: str):
        """The SharedGroup of ``$share/group/filter``, created at its committed positions."""
        g = self.groups.get((group, topic_filter))
        if g is None:
            committed = {p.group: p for p in (yield self.store.get_share_positions(group, topic_filter))}
            ends = yield self.store.end_positions(queue)
            for end in ends:  # a broker group with no committed position starts at its end
                if end.group not in committed:
                    committed[end.group] = end
                    yield self.store.put_share_position(group, topic_filter, end)
            g = self.groups.get((group, topic_filter))  # created meanwhile by another subscribe?
            if g is None:
                starts = tuple(committed[k] for k in sorted(committed))
                g = self.groups[(group, topic_filter)] = SharedGroup(self.ctx, group, topic_filter, queue, starts)
        return g

    def drop_group_member(self, sub: Subscription) -> None:
        g = sub.share
        g.subscribers -= 1
        if g.subscribers <= 0:
            g.close()
            self.groups.pop((g.group, g.topic_filter), None)

    def remove_filter(self, topic_filter: str) -> None:
        """Drop one reference to a filter's interest (nothing waits on it)."""
        self.store.remove_filter(topic_filter).addErrback(
            lambda f: log.warning("remove_filter_failed filter=%s error=%s", topic_filter, f.getErrorMessage()))

    def release(self, session: Session) -> None:
        """The session ends: its filters leave the store, its group memberships end, its state holds nothing."""
        for sub in session.subs.values():
            self.remove_filter(sub.topic_filter)
            if sub.share is not None:
                self.drop_group_member(sub)
        session.end()

    def owed(self):
        """Retention holder part: per shared group and broker group, its committed position."""
        for (group, topic_filter), g in self.groups.items():
            for cursor in g.cursors.values():
                yield Owed(f"share {group} {topic_filter}", g.queue, cursor.committed.offset)
