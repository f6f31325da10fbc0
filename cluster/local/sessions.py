"""Session state of the store interface on today's ``SessionStore`` (a DurableKV, WAL on), in-process.

``SessionStore`` keeps bare queue offsets; the interface speaks ``QueuePosition``s.
A local store is one broker group, so each persisted offset is that group's
position in the light queue of the subscription's filter: positions of other
groups are refused (``WrongGroup``), and positions are rebuilt on load from the
filter's queue name and the group.

Claims (``claim_session``) are kept beside the sessions, and every session
write is checked against the last claim's epoch first (``Fenced`` if older).
Epochs come from one counter per broker group, so a claim's epoch is above
every epoch the group ever handed out, to any client id. That lets a claim be
forgotten once nobody needs it (its holder released it and no session is
stored): a write carrying an epoch the group handed out but holds no claim
for is stale, ``Fenced`` like one below the current claim. So client-id churn
leaves nothing behind. The counter is persisted as a high-water mark reserved
``EPOCH_BLOCK`` epochs at a time (one write per block, in the same KV batch as
the claim that crosses it); a restart resumes above the mark.

This object is the only writer of its session keys while its broker masters
the group, so the claims are read once and then kept in memory; a broker that
becomes master (its KV followed another's) reads them again (``reload``). Listeners added with ``add_claim_listener`` hear
of every claim that moves a session to another holder: the way the old holder
learns it was taken over (the RPC layer carries the event to it).

A claim by the store's own holder (``own_holder``: the front end in the same
process, a node's) of an id nobody else claimed is not written at once: it is
kept in memory and written just before the first write of that session
(``_fence``), or never if the session stores nothing (a clean session without
a will: CONNECT to release costs no record). It only fences writers in this
process, which die with the memory that holds it; after a restart no writer
of it is left, and the epoch mark still keeps every epoch it handed out from
being handed out again. A claim that moves an id from another holder, or finds
one written, is written before it is answered, as every other claim is.
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.internet import defer

from lightqueue.names import QueueNameError, lmq_name
from lightqueue.topic import filter_of
from store import api
from store import record as rec
from store.session_store import SessionStore, StoredSession, StoredSubscription, StoredWill

MAX_PACKET_ID = 0xFFFF
EPOCH_BLOCK = 1024
"""Claim epochs reserved per write of the high-water mark (a restart skips what is left of a block)."""

log = logging.getLogger("twistmq.cluster.sessions")


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

    def __init__(self, sessions: SessionStore, group: str, own_holder: str = "") -> None:
        self._db = sessions
        self._group = group
        self._own_holder = own_holder  # the holder in this process, whose claims wait for a write (module doc)
        self._unwritten: set[str] = set()  # client ids whose claim (own_holder's) is in memory only
        self._claims: dict[str, tuple[str, int]] | None = None  # client id -> (holder, epoch); all, once read
        self._claim_owners: dict[str, str] = {}  # client id -> the identity whose CONNECT made the claim
        self._next_epoch = 0  # the epoch of the next claim
        self._epoch_mark = 0  # the persisted high-water mark: epochs up to it may have been handed out
        self._claim_listeners: list[Callable[[str, str, int], None]] = []
        self._wills: set[str] = set()  # client ids with a stored will (read with the claims)

    # -- claims and fencing ---------------------------------------------------------------------

    def add_claim_listener(self, listener: Callable[[str, str, int], None]) -> None:
        """Call ``listener(client_id, old_holder, new_epoch)`` when a claim takes a session from another holder."""
        self._claim_listeners.append(listener)

    @property
    def claims(self) -> dict[str, tuple[str, int]]:
        """Every claim on record: client id -> (holder, epoch) (read from the KV on first use)."""
        if self._claims is None:
            self._claims = self._db.load_claims()
            self._claim_owners = self._db.load_claim_owners()
            self._wills = set(self._db.load_wills())
            # A store from before the mark has claims but no mark: resume above both.
            self._epoch_mark = max(self._db.load_epoch_mark(), max((e for _, e in self._claims.values()), default=0))
            self._next_epoch = self._epoch_mark + 1
        return self._claims

    @property
    def next_epoch(self) -> int:
        """The epoch of the next claim: every claim made from now on has this one or a later one."""
        self.claims  # noqa: B018 - read the claims and the mark first: the counter resumes above them
        return self._next_epoch

    def reload(self) -> None:
        """Read the claims, their owners, the wills and the epoch mark from the KV again on next use: a slave's
        KV follows its master's through replication while these stay as first read, so a broker that becomes
        master reloads before it serves (else it would refuse its sessions' writes as never claimed, and hand
        out epochs the old master already gave, letting a fenced holder's writes through)."""
        self._claims = None
        self._claim_owners = {}
        self._wills = set()
        self._unwritten = set()

    def claim_session(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred:
        return self._claim(client_id, holder, owner, keep_will=False)

    def claim_and_get(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred:
        claim = self.claims.get(client_id) if isinstance(client_id, str) else None
        taken_from = claim[0] if claim is not None else ""
        return self._claim(client_id, holder, owner, keep_will=False).addCallback(
            lambda epoch: api.ClaimedSession(epoch, self._stored_state(client_id), taken_from))

    def adopt(self, client_id: str, holder: str) -> defer.Deferred:
        """Claim ``client_id`` for ``holder`` (the group itself, taking over from a lost holder), keeping the
        claim's owner and the stored will; fires with the new epoch."""
        self.claims  # noqa: B018 - read the claims (and their owners) first
        return self._claim(client_id, holder, self._claim_owners.get(client_id, ""), keep_will=True)

    def _claim(self, client_id: str, holder: str, owner: str, keep_will: bool) -> defer.Deferred:
        if not isinstance(client_id, str) or not isinstance(holder, str) or not holder or not isinstance(owner, str):
            raise api.InvalidArgument(f"claim_session needs a client id and a holder, got {client_id!r}, {holder!r}")
        claims = self.claims
        if owner:
            # The session belongs to the identity that made it: a live claim's, else a stored session's.
            other = (self._claim_owners.get(client_id) if client_id in claims else None) \
                or self._db.stored_owner(client_id)
            if other and other != owner:
                raise api.NotAuthorized(f"session {client_id!r} belongs to another identity")
        old_holder = claims.get(client_id, ("", 0))[0]
        epoch = self._next_epoch
        self._next_epoch += 1
        writes = []
        if epoch > self._epoch_mark:
            self._epoch_mark = epoch + EPOCH_BLOCK - 1
            writes.append(self._db.save_epoch_mark(self._epoch_mark).addErrback(self._mark_failed, epoch))
        # In memory only (module doc): this process's holder, nobody else's claim moved, no written one replaced.
        unwritten = holder == self._own_holder and not keep_will and client_id not in self._wills and (
            client_id not in claims or client_id in self._unwritten)
        claims[client_id] = (holder, epoch)
        if owner:
            self._claim_owners[client_id] = owner
        else:
            self._claim_owners.pop(client_id, None)
        if unwritten:
            self._unwritten.add(client_id)
        else:
            self._unwritten.discard(client_id)
            writes.append(self._db.save_claim(client_id, holder, epoch, owner))
        if not keep_will and client_id in self._wills:
            self._wills.discard(client_id)
            # A new connection's CONNECT stores its own will: the old connection's is published by its live
            # holder (a takeover) or cancelled by the return (MQTT 5 3.1.2.8), never by this group.
            writes.append(self._db.delete_will(client_id))
        if old_holder and old_holder != holder:
            for listener in list(self._claim_listeners):
                try:
                    listener(client_id, old_holder, epoch)
                except Exception:  # noqa: BLE001 - a broken listener must not fail the claim
                    log.exception("claim_listener_failed client=%s", client_id)
        if not writes:
            return defer.succeed(epoch)
        d = writes[0] if len(writes) == 1 else defer.gatherResults(writes, consumeErrors=True).addErrback(
            lambda f: f.value.subFailure)
        return d.addCallback(lambda _: epoch)

    def _write_claim(self, client_id: str) -> None:
        """Write the in-memory claim of ``client_id`` now, ahead of its session's first write (the log keeps
        the order, so the claim is durable before that write is answered)."""
        self._unwritten.discard(client_id)
        holder, epoch = self._claims[client_id]
        self._db.save_claim(client_id, holder, epoch, self._claim_owners.get(client_id, "")).addErrback(
            self._claim_write_failed, client_id, holder, epoch)

    def _claim_write_failed(self, failure, client_id: str, holder: str, epoch: int) -> None:
        log.error("claim_write_failed client=%s epoch=%d error=%s", client_id, epoch, failure.getErrorMessage())
        if self._claims is not None and self._claims.get(client_id) == (holder, epoch):
            self._unwritten.add(client_id)  # the session's next write tries again

    def _mark_failed(self, failure, epoch: int):
        # The block is not durable: the next claim writes the mark again (its claim fails with this one).
        self._epoch_mark = min(self._epoch_mark, epoch - 1)
        return failure

    def release_session(self, client_id: str, epoch: int) -> defer.Deferred:
        """The holder of ``epoch`` let the session go: forget the claim unless a session is stored.

        Its stored will goes (the holder published it or cancelled it). A release with any other epoch (a holder taken over
        since) changes nothing.
        """
        if not isinstance(client_id, str) or not isinstance(epoch, int) or isinstance(epoch, bool):
            raise api.InvalidArgument(f"release_session needs a client id and an epoch, got {client_id!r}, "
                                      f"{epoch!r}")
        claims = self.claims
        claim = claims.get(client_id)
        if claim is None or claim[1] != epoch:
            return defer.succeed(None)
        if client_id in self._unwritten:  # never written, so nothing of the session was (and no will)
            self._unwritten.discard(client_id)
            del claims[client_id]
            self._claim_owners.pop(client_id, None)
            return defer.succeed(None)
        if client_id in self._wills:  # the holder that lets go published it or cancelled it
            self._wills.discard(client_id)
            self._db.delete_will(client_id)
        if self._db.has_session(client_id):
            return defer.succeed(None)
        del claims[client_id]
        self._claim_owners.pop(client_id, None)
        return self._db.delete_claim(client_id).addCallback(lambda _: None)

    def _fence(self, client_id: str, epoch: int) -> None:
        """Refuse a write of ``client_id`` whose ``epoch`` is not the last claim's."""
        if not isinstance(epoch, int) or isinstance(epoch, bool):
            raise api.InvalidArgument(f"epoch must be an int, not {epoch!r}")
        claim = self.claims.get(client_id)
        if claim is None:
            if epoch == 0:
                return  # a writer that never claimed (an id assigned by its proxy): nobody holds it
            if epoch < self._next_epoch:
                raise api.Fenced(f"session {client_id!r} was released or claimed again since epoch {epoch}")
            raise api.InvalidArgument(f"session {client_id!r} epoch {epoch} was never claimed")
        current = claim[1]
        if epoch < current:
            raise api.Fenced(f"session {client_id!r} was claimed with epoch {current}; "
                             f"this write carries epoch {epoch}")
        if epoch > current:
            raise api.InvalidArgument(f"session {client_id!r} epoch {epoch} was never claimed (last: {current})")
        if client_id in self._unwritten:
            self._write_claim(client_id)  # before the write the caller makes next

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
        meta = api.SessionMeta(s.client_id, s.expiry, s.level, s.disconnected_at, s.owner)
        holder, epoch = self.claims.get(s.client_id, ("", 0))
        return api.SessionState(meta, tuple(subs), outbound, frozenset(s.released), frozenset(s.inbound_qos2),
                                epoch, holder)

    # -- the interface ----------------------------------------------------------------------------

    def _stored_state(self, client_id: str) -> api.SessionState | None:
        stored = self._db.load(client_id)
        return None if stored is None else self._state(stored)

    def get_session(self, client_id: str) -> defer.Deferred:
        return defer.succeed(self._stored_state(client_id))

    def list_sessions(self) -> defer.Deferred:
        stored = self._db.load_all()
        return defer.succeed(tuple(self._state(stored[cid]) for cid in sorted(stored)))

    def list_wills(self) -> defer.Deferred:
        claims = self.claims
        out = []
        for cid, w in sorted(self._db.load_wills().items()):
            holder, epoch = claims.get(cid, ("", 0))
            out.append(api.HeldWill(cid, api.WillState(w.message(cid), w.delay_s), epoch, holder))
        return defer.succeed(tuple(out))

    def put_session(self, meta: api.SessionMeta, epoch: int) -> defer.Deferred:
        self._fence(meta.client_id, epoch)
        return self._db.save_session(meta.client_id, meta.expiry_s, meta.protocol_level, meta.disconnected_at_ms,
                                     meta.owner)

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

    def put_will(self, client_id: str, will: api.WillState, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        if not isinstance(will, api.WillState) or not isinstance(will.message, rec.Message):
            raise api.InvalidArgument(f"expected a WillState with a Message, got {type(will).__name__}")
        m = will.message
        if m.kind != rec.RecordKind.MQTT_PUBLISH or not isinstance(will.delay_s, int) or will.delay_s < 0:
            raise api.InvalidArgument("a will is an MQTT publish with a delay of 0 or more seconds")
        self._wills.add(client_id)
        return self._db.save_will(client_id, StoredWill(m.topic, bytes(m.body), m.qos, m.retain, m.born_ts,
                                                        dict(m.properties), will.delay_s))

    def delete_will(self, client_id: str, epoch: int) -> defer.Deferred:
        self._fence(client_id, epoch)
        if client_id not in self._wills:
            return defer.succeed(None)
        self._wills.discard(client_id)
        return self._db.delete_will(client_id).addCallback(lambda _: None)

    def get_share_positions(self, share_group: str, topic_filter: str) -> defer.Deferred:
        offset = self._db.load_group_offset(share_group, topic_filter)
        return defer.succeed(() if offset is None else (self._position(topic_filter, offset),))

    def put_share_position(self, share_group: str, topic_filter: str,
                           position: api.QueuePosition) -> defer.Deferred:
        offset = self.offset_in(position, queue_of(topic_filter))
        return self._db.save_group_offset(share_group, topic_filter, offset)
