"""Session state of the store interface on today's ``SessionStore`` (a DurableKV, WAL on), in-process.

``SessionStore`` keeps bare queue offsets; the interface speaks ``QueuePosition``s.
A local store is one broker group, so each persisted offset is that group's
position in the light queue of the subscription's filter: positions of other
groups are refused (``WrongGroup``), and positions are rebuilt on load from the
filter's queue name and the group.

Claims (``claim_session``) are kept beside the sessions, and every session
write is checked against the last claim's epoch first (``Fenced`` if older).
This object is the only writer of its session keys, so the epochs are cached
in memory once read. Listeners added with ``add_claim_listener`` hear of every
claim that moves a session to another holder: the way the old holder learns
it was taken over (the RPC layer carries the event to it).
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.internet import defer

from lightqueue.names import QueueNameError, lmq_name
from cluster.session_store import SessionStore, StoredSession, StoredSubscription
from store import api

MAX_PACKET_ID = 0xFFFF

log = logging.getLogger("twistmq.cluster.sessions")


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
        self._claims: dict[str, tuple[str, int]] = {}  # client id -> (holder, epoch), read through
        self._claim_listeners: list[Callable[[str, str, int], None]] = []

    # -- claims and fencing ---------------------------------------------------------------------

    def add_claim_listener(self, listener: Callable[[str, str, int], None]) -> None:
        """Call ``listener(client_id, old_holder, new_epoch)`` when a claim takes a session from another holder."""
        self._claim_listeners.append(listener)

    def _claim(self, client_id: str) -> tuple[str, int]:
        claim = self._claims.get(client_id)
        if claim is None:
            claim = self._claims[client_id] = self._db.load_claim(client_id)
        return claim

    def claim_session(self, client_id: str, holder: str) -> defer.Deferred:
        if not isinstance(client_id, str) or not isinstance(holder, str) or not holder:
            raise api.InvalidArgument(f"claim_session needs a client id and a holder, got {client_id!r}, {holder!r}")
        old_holder, epoch = self._claim(client_id)
        epoch += 1
        self._claims[client_id] = (holder, epoch)
        d = self._db.save_claim(client_id, holder, epoch)
        if old_holder and old_holder != holder:
            for listener in list(self._claim_listeners):
                try:
                    listener(client_id, old_holder, epoch)
                except Exception:  # noqa: BLE001 - a broken listener must not fail the claim
                    log.exception("claim_listener_failed client=%s", client_id)
        return d.addCallback(lambda _: epoch)

    def _fence(self, client_id: str, epoch: int) -> None:
        """Refuse a write of ``client_id`` whose ``epoch`` is not the last claim's."""
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise api.InvalidArgument(f"epoch must be an int, not {epoch!r}")
        current = self._claim(client_id)[1]
        if epoch < current:
            raise api.Fenced(f"session {client_id!r} was claimed with epoch {current}; "
                             f"this write carries epoch {epoch}")
        if epoch > current:
            raise api.InvalidArgument(f"session {client_id!r} epoch {epoch} was never claimed (last: {current})")

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
        holder, epoch = self._claim(s.client_id)
        return api.SessionState(meta, tuple(subs), outbound, frozenset(s.released), frozenset(s.inbound_qos2),
                                epoch, holder)

    # -- the interface ----------------------------------------------------------------------------

    def get_session(self, client_id: str) -> defer.Deferred:
        stored = self._db.load(client_id)
        return defer.succeed(None if stored is None else self._state(stored))

    def list_sessions(self) -> defer.Deferred:
        stored = self._db.load_all()
        claims = self._db.load_claims()
        for cid in stored:
            self._claims.setdefault(cid, claims.get(cid, ("", 0)))
        return defer.succeed(tuple(self._state(stored[cid]) for cid in sorted(stored)))

    def put_session(self, meta: api.SessionMeta, epoch: int) -> defer.Deferred:
        self._fence(meta.client_id, epoch)
        return self._db.save_session(meta.client_id, meta.expiry_s, meta.protocol_level, meta.disconnected_at_ms)

    def delete_session(self, client_id: str, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        return self._db.delete_session(client_id).addCallback(lambda _: None)

    def put_subscription(self, client_id: str, sub: api.SubscriptionState, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
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

    def delete_subscription(self, client_id: str, key: str, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        share_group = None
        if key.startswith("$share/"):
            share_group = key[len("$share/"):].partition("/")[0]
        stored = StoredSubscription(filter_of(key), 0, share_group=share_group)  # only its key is used
        return self._db.delete_subscription(client_id, stored)

    def put_outbound(self, client_id: str, outbound: api.OutboundState, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        pid = check_packet_id(outbound.packet_id)
        offset = self.offset_in(outbound.position, queue_of(filter_of(outbound.subscription_key)))
        return self._db.save_outbound(client_id, pid, outbound.subscription_key, offset, outbound.qos)

    def delete_outbound(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        return self._db.delete_outbound(client_id, check_packet_id(packet_id))

    def put_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        return self._db.save_released(client_id, check_packet_id(packet_id))

    def delete_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        return self._db.delete_released(client_id, check_packet_id(packet_id))

    def put_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        return self._db.save_inbound_qos2(client_id, check_packet_id(packet_id))

    def delete_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        return self._db.delete_inbound_qos2(client_id, check_packet_id(packet_id))

    def get_share_positions(self, share_group: str, topic_filter: str) -> defer.Deferred:
        offset = self._db.load_group_offset(share_group, topic_filter)
        return defer.succeed(() if offset is None else (self._position(topic_filter, offset),))

    def put_share_position(self, share_group: str, topic_filter: str,
                           position: api.QueuePosition) -> defer.Deferred:
        offset = self.offset_in(position, queue_of(topic_filter))
        return self._db.save_group_offset(share_group, topic_filter, offset)
