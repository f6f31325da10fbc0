"""Session state of the store interface on today's ``SessionStore`` (a DurableKV, WAL on), in-process.

``SessionStore`` keeps bare queue offsets; the interface speaks ``QueuePosition``s.
A local store is one broker group, so each persisted offset is that group's
position in the light queue of the subscription's filter: positions of other
groups are refused (``WrongGroup``), and positions are rebuilt on load from the
filter's queue name and the group.
"""

from __future__ import annotations

from twisted.internet import defer

from lightqueue.names import QueueNameError, lmq_name
from mqtt_proxy.session_store import SessionStore, StoredSession, StoredSubscription
from store import api

MAX_PACKET_ID = 0xFFFF


def filter_of(key: str) -> str:
    """The topic filter of a subscription key (``filter`` or ``$share/<group>/<filter>``)."""
    if key.startswith("$share/"):
        return key[len("$share/"):].partition("/")[2]
    return key


def queue_of(topic_filter: str) -> str:
    """The light queue of a topic filter (``InvalidArgument`` if it cannot name one)."""
    try:
        return lmq_name(topic_filter)
    except QueueNameError as exc:
        raise api.InvalidArgument(f"topic filter {topic_filter!r}: {exc}") from None


def check_packet_id(packet_id: int) -> int:
    if not isinstance(packet_id, int) or isinstance(packet_id, bool) or not 1 <= packet_id <= MAX_PACKET_ID:
        raise api.InvalidArgument(f"packet id must be 1..{MAX_PACKET_ID}, not {packet_id!r}")
    return packet_id


def position_offset(position: api.QueuePosition, group: str, queue: str | None = None) -> int:
    """Group ``group``'s offset of ``position``, which must be in ``queue`` (if given)."""
    if not isinstance(position, api.QueuePosition):
        raise api.InvalidArgument(f"expected a QueuePosition, got {type(position).__name__}")
    if position.group != group:
        raise api.WrongGroup(f"position of broker group {position.group!r}; this store is group {group!r}")
    if queue is not None and position.queue != queue:
        raise api.InvalidArgument(f"position is in queue {position.queue!r}, expected {queue!r}")
    if position.offset < 0:
        raise api.InvalidArgument(f"position offset {position.offset} is negative")
    return position.offset


class LocalSessions:
    """``store.api.Sessions`` over a SessionStore, for broker group ``group``."""

    def __init__(self, sessions: SessionStore, group: str) -> None:
        self._db = sessions
        self._group = group

    # -- positions ----------------------------------------------------------------------------------

    def offset_in(self, position: api.QueuePosition, queue: str | None = None) -> int:
        return position_offset(position, self._group, queue)

    def _position(self, topic_filter: str, offset: int) -> api.QueuePosition:
        return api.QueuePosition(lmq_name(topic_filter), self._group, offset)

    def _state(self, s: StoredSession) -> api.SessionState:
        subs = []
        for key in sorted(s.subscriptions):
            ss = s.subscriptions[key]
            positions = () if ss.share_group is not None else (self._position(ss.topic_filter, ss.next_offset),)
            subs.append(api.SubscriptionState(ss.topic_filter, ss.qos, positions, ss.no_local,
                                              ss.retain_as_published, ss.sub_id, ss.share_group))
        outbound = tuple(api.OutboundState(pid, key, self._position(filter_of(key), qoff), qos)
                         for pid, (key, qoff, qos) in sorted(s.outbound.items()))
        meta = api.SessionMeta(s.client_id, s.expiry, s.level, s.disconnected_at)
        return api.SessionState(meta, tuple(subs), outbound, frozenset(s.released), frozenset(s.inbound_qos2))

    # -- the interface ----------------------------------------------------------------------------

    def get_session(self, client_id: str) -> defer.Deferred:
        stored = self._db.load(client_id)
        return defer.succeed(None if stored is None else self._state(stored))

    def list_sessions(self) -> defer.Deferred:
        stored = self._db.load_all()
        return defer.succeed(tuple(self._state(stored[cid]) for cid in sorted(stored)))

    def put_session(self, meta: api.SessionMeta) -> defer.Deferred:
        return self._db.save_session(meta.client_id, meta.expiry_s, meta.protocol_level, meta.disconnected_at_ms)

    def delete_session(self, client_id: str) -> defer.Deferred:
        return self._db.delete_session(client_id).addCallback(lambda _: None)

    def put_subscription(self, client_id: str, sub: api.SubscriptionState) -> defer.Deferred:
        queue = queue_of(sub.topic_filter)
        offsets = [self.offset_in(p, queue) for p in sub.positions]
        if sub.share_group is not None and offsets:
            raise api.InvalidArgument(f"shared subscription {sub.key!r} has no positions of its own: "
                                      f"its share group's are kept with put_share_position")
        if sub.share_group is None and len(offsets) != 1:
            raise api.InvalidArgument(f"subscription {sub.key!r} needs one position in group {self._group!r}, "
                                      f"got {len(offsets)}")
        stored = StoredSubscription(sub.topic_filter, sub.qos, sub.no_local, sub.retain_as_published, sub.sub_id,
                                    sub.share_group, offsets[0] if offsets else 0)
        return self._db.save_subscription(client_id, sub.key, stored)

    def delete_subscription(self, client_id: str, key: str) -> defer.Deferred:
        share_group = None
        if key.startswith("$share/"):
            share_group = key[len("$share/"):].partition("/")[0]
        stored = StoredSubscription(filter_of(key), 0, share_group=share_group)  # only its key is used
        return self._db.delete_subscription(client_id, stored)

    def put_outbound(self, client_id: str, outbound: api.OutboundState) -> defer.Deferred:
        pid = check_packet_id(outbound.packet_id)
        offset = self.offset_in(outbound.position, queue_of(filter_of(outbound.subscription_key)))
        return self._db.save_outbound(client_id, pid, outbound.subscription_key, offset, outbound.qos)

    def delete_outbound(self, client_id: str, packet_id: int) -> defer.Deferred:
        return self._db.delete_outbound(client_id, check_packet_id(packet_id))

    def put_released(self, client_id: str, packet_id: int) -> defer.Deferred:
        return self._db.save_released(client_id, check_packet_id(packet_id))

    def delete_released(self, client_id: str, packet_id: int) -> defer.Deferred:
        return self._db.delete_released(client_id, check_packet_id(packet_id))

    def put_inbound_qos2(self, client_id: str, packet_id: int) -> defer.Deferred:
        return self._db.save_inbound_qos2(client_id, check_packet_id(packet_id))

    def delete_inbound_qos2(self, client_id: str, packet_id: int) -> defer.Deferred:
        return self._db.delete_inbound_qos2(client_id, check_packet_id(packet_id))

    def get_share_positions(self, share_group: str, topic_filter: str) -> defer.Deferred:
        offset = self._db.load_group_offset(share_group, topic_filter)
        return defer.succeed(() if offset is None else (self._position(topic_filter, offset),))

    def put_share_position(self, share_group: str, topic_filter: str,
                           position: api.QueuePosition) -> defer.Deferred:
        offset = self.offset_in(position, queue_of(topic_filter))
        return self._db.save_group_offset(share_group, topic_filter, offset)
