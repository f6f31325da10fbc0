"""``SessionKeeper``: a broker group's care of the sessions nobody holds: wills of lost proxies, session expiry.

A proxy holds a session while its client is connected or until it expires, and keeps its will
and expiry timers. When the proxy is lost (killed, stopped, cut off) they would go with it: its
clients' wills never published, its persistent sessions never expired, their filters keeping
light-queue interest and pinning retention forever. So the group takes over the sessions a lost
proxy held here, the lease being the test of loss:

- the proxy has had no RPC connection to this broker for a lease (``member_up``/``member_down``,
  counted by ``cluster.discovery.absence``; at start every holder on record is away until it
  connects), or the controllers evicted it (``metadata``: listed with ``joined`` false);
- an eviction names the life it ends (the member record's ``boot``, the process's, also in the HELLO of
  its connections): a proxy killed and started again under the same id within a lease has connected and
  claimed its returning clients' sessions before its old life's lease ran out. The claims its new life
  made are not the old life's to lose: the keeper notes the group's next claim epoch when a new life first
  connects, the old one (dead: the same id) claims nothing after that, so the eviction of an earlier life
  takes over only the claims below that epoch. An eviction of the life that is connected (a proxy stopped
  with its connections open, or cut off from the controllers) takes everything, as one naming no life does;
- a new life of a proxy connects while the keeper knows an earlier one (the same id, another boot): the earlier
  process is dead, so its claims (those below the new life's first epoch) are taken over at once, before that
  connection's first call is served. A proxy back before its lease ran out (and its registration, which
  spares it the eviction) would otherwise restore its old life's sessions itself: the restore skips a session
  the group holds, and the will its old life's client left, lost with its connection, is published. The life
  a holder connected in last is stored (``l/<holder>``: its boot and first epoch, through the session log), so
  a broker restarted since, or a slave that became master (its KV followed the master's), knows it too: a log
  that has a claim of a life has that life's record before it, so a life on record is never one whose claims
  are newer than the record says;
- a holder may hand a session over itself, by claiming it in the group's name (``group_holder``): a
  proxy that closed the sessions of a group it had lost for a lease does so once the group is back.

A group takes over the sessions that live in it (the client id's group) and, of the others, those
with a part here: a will (kept in the group of its topic) or a subscription whose filter spans this
group. A proxy cut off from a group for a lease closes exactly these sessions (``cluster.roles.proxy``),
so none of it happens to a client still connected.

A mere copy of the meta (every group keeps one of every session) is left to the session's own group,
which publishes the will and ends the session; but that group cannot delete the copies, so each group
drops its own: on the same loss, at the same deadline (the loss + the session's expiry interval, the
loss stored as the copy's ``disconnected_at``, so a restart keeps it), and only if the claim is still
the lost holder's (holder and epoch): a client that connected again anywhere claimed it anew in
every group, and its copies are its new holder's.

Taking over is a claim by the group itself (``group:<name>``, keeping the owner and the stored
will), so the lost proxy's writes are fenced; then the loss is stored as the session's
``disconnected_at`` and the will's due time with the will (``store.session_deadlines``), so a
restart re-arms both. The will is published (``append``, or ``put_retained`` for a retained one
with a payload: the route its proxy's publish decision gave it at CONNECT) after its delay, unless
the client comes back first: its new claim (on any proxy) cancels it (MQTT 5 3.1.2.8). The session
expires when due: deleted through the broker's ``SessionInterest`` (its filters' interest released,
so retention no longer keeps what it owed) and its claim released.
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.internet import defer, task

from cluster.discovery.absence import Absences
from cluster.local.sessions import LocalSessions
from store import api
from store import record as rec
from store.session_deadlines import ExpireSession, SessionDeadlines, expiry_due, group_holder, will_due
from store.session_store import SessionStore

log = logging.getLogger("twistmq.cluster.local.session_keeper")

ENDS_PER_TICK = 16
"""Sessions expired per tick at most: a lost proxy's sessions come due together, and deleting one scans four
key ranges of the session KV (measured 0.3-3 ms of CPU each once RocksDB holds many tombstones), so a burst
would stall the reactor; the rest wait a tick (wills are not held back)."""


class SessionKeeper:
    """``SessionKeeper(store, sessions, db, group, clock, lease, tick)``: ``start()`` once the store is open.

    ``store`` is the group's store interface as the broker serves it (the ``SessionInterest`` wrapper,
    so an expired session's interest goes), ``sessions`` its claims, ``db`` the session KV.
    """

    def __init__(self, store: api.Store, sessions: LocalSessions, db: SessionStore, group: str, clock,
                 lease: float, tick: float, homed: Callable[[str], bool] = lambda _client_id: True,
                 start_grace: float = 0.0) -> None:
        self.store = store
        self.sessions = sessions
        self.db = db
        self.group = group
        self.holder = group_holder(group)
        self.clock = clock
        self.tick = tick
        self.homed = homed  # whether a client id's session lives in this group (its other groups keep parts)
        self.start_grace = start_grace  # beyond the lease, how long a holder may take to reconnect after a start
        self.deadlines = SessionDeadlines()
        self.absences = Absences(lease)
        self._epochs: dict[str, int] = {}  # client id -> the epoch this group claimed it with
        self._connections: dict[str, int] = {}  # member id -> its open RPC connections to this broker
        self._boots: dict[str, str] = {}  # member id -> the life its last connection opened came from
        self._evicted: dict[str, str] = {}  # proxies the controllers' metadata lists as not joined -> the life evicted
        self._lives: dict[str, tuple[str, int]] = {}  # proxy -> its last life (boot) to connect, the next epoch then
        # (stored: ``start`` reads those on record)
        self._loop: task.LoopingCall | None = None
        self.copies = SessionDeadlines()  # when the copies of lost holders' sessions homed elsewhere are dropped
        self._copy_claims: dict[str, tuple[str, int]] = {}  # client id -> its claim (holder, epoch) at the loss
        self.takeovers = 0
        self.wills_published = 0
        self.sessions_expired = 0
        self.copies_dropped = 0
        sessions.add_claim_listener(self._claimed)

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Re-arm the sessions this group held before a restart, expire what came due meanwhile, and count
        every other holder on record away until it connects."""
        now = self.now_ms()
        self._lives = {**self.db.load_lives(), **self._lives}  # on record, unless one connected here since
        holders: set[str] = set()
        for cid, (holder, epoch) in list(self.sessions.claims.items()):
            if holder == self.holder:
                self._arm(cid, epoch, None, now)
            elif holder not in self._connections:
                holders.add(holder)
        for holder in sorted(holders):  # a proxy's reconnect back-off may be longer than a lease
            self.absences.gone(holder, self.clock.seconds() + self.start_grace)
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = self.clock
        self._loop.start(self.tick, now=True)
        log.info("session_keeper_started held=%d holders_awaited=%d", len(self.deadlines), len(holders))

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def restart(self) -> None:
        """Start again from the claims as they are now (a broker that became master: its KV followed the old
        master's, whose keeper held the group's sessions; their wills and expiry are armed here from the stored
        due times)."""
        self.stop()
        self.deadlines = SessionDeadlines()
        self._epochs.clear()
        self.copies = SessionDeadlines()  # re-held when their holders are found lost again (the loss is stored)
        self._copy_claims.clear()
        # absences counted while it was a slave (proxies dial the master, not it) are not absences: each holder
        # gets a lease and the start grace from now to reach it
        self.absences = Absences(self.absences.lease)
        # the lives seen meanwhile got their first epochs from the claims as a slave had them: those on record
        # (the master's, ``start`` reads them) replace them
        self._lives.clear()
        self.start()
        for member, boot in sorted(self._boots.items()):  # connected while a slave: known to this master now
            self._life(member, boot)

    # -- who is there ---------------------------------------------------------------------------------

    def member_up(self, member: str, boot: str = "") -> None:
        """An RPC connection from ``member`` opened; ``boot`` is the life (process) it comes from."""
        self._connections[member] = self._connections.get(member, 0) + 1
        self.absences.seen(member)
        if boot:
            self._boots[member] = boot
        self._life(member, boot)

    def _life(self, member: str, boot: str) -> None:
        earlier = self._lives.get(member)
        if boot and (earlier is None or earlier[0] != boot):
            # a new life of it: every claim it makes gets this epoch or a later one (module doc)
            first = self._lives[member] = (boot, self.sessions.next_epoch)
            log.info("member_life holder=%s boot=%s first_epoch=%d", member, boot, first[1])
            if self._running:  # a slave's stopped keeper neither writes nor takes anything: its master does
                self.db.save_life(member, *first).addErrback(self._failed, "save_life", member)
                if earlier is not None:
                    # the life seen before is dead (one process per id): its sessions are lost now, whether or
                    # not its lease ran out
                    self.take_over(member, "restarted", before=first[1])

    @property
    def _running(self) -> bool:
        return self._loop is not None and self._loop.running

    def member_down(self, member: str) -> None:
        """An RPC connection from ``member`` closed; with its last one its absence starts."""
        left = self._connections.get(member, 0) - 1
        if left > 0:
            self._connections[member] = left
            return
        self._connections.pop(member, None)
        self._boots.pop(member, None)
        self.absences.gone(member, self.clock.seconds())

    def metadata(self, metadata: dict) -> None:
        """The controllers' metadata: a proxy listed as not joined (evicted) is lost, in the life it names."""
        evicted: dict[str, str] = {}
        for member in metadata.get("members", ()):
            if isinstance(member, dict) and member.get("node_type") == "proxy" and member.get("joined") is False \
                    and isinstance(member.get("node_id"), str):
                boot = member.get("boot")
                evicted[member["node_id"]] = boot if isinstance(boot, str) else ""
        for node_id in sorted(evicted):
            if self._evicted.get(node_id) != evicted[node_id]:
                self.take_over(node_id, "evicted", self._first_epoch_after(node_id, evicted[node_id]))
        self._evicted = evicted

    def _first_epoch_after(self, member: str, boot: str) -> int | None:
        """The first epoch of the life of ``member`` that connected after life ``boot`` (which claims nothing
        from then on: it is dead), or None when that is the life connected last or either is unknown."""
        life = self._lives.get(member)
        if not boot or life is None or life[0] == boot:
            return None
        return life[1]

    # -- taking over ---------------------------------------------------------------------------------

    def take_over(self, holder: str, why: str, before: int | None = None) -> int:
        """Take over every session ``holder`` holds here (only the claims of an epoch below ``before``, if given:
        a later life's are its own); returns how many."""
        held = [(cid, e) for cid, (h, e) in self.sessions.claims.items() if h == holder]
        mine = [cid for cid, e in held if before is None or e < before]
        if mine or len(held) > len(mine):
            log.info("sessions_taken_over holder=%s reason=%s sessions=%d kept_of_later_life=%d", holder, why,
                     len(mine), len(held) - len(mine))
        taken = copies = 0
        for cid in mine:
            stored = self.db.has_session(cid)
            if not stored and self.db.load_will(cid) is None:
                # nothing of it to keep here (a clean session without a will): its claim just goes
                epoch = self.sessions.claims[cid][1]
                self.store.release_session(cid, epoch).addErrback(self._failed, "release", cid)
                continue
            if stored and self._mere_copy(cid):
                # only the copy of the meta every group keeps: its home group publishes the will and ends the
                # session, this group drops the copy then (the holder may be alive, cut off from this group
                # only: the claim is left as it is, not fenced)
                copies += self._hold_copy(cid, holder, self.sessions.claims[cid][1])
                continue
            # the claim's listener (``_claimed``) arms it, as for a session handed over in the group's name
            self.sessions.adopt(cid, self.holder).addErrback(self._failed, "take_over", cid)
            taken += 1
        if copies:
            log.info("session_copies_held holder=%s reason=%s sessions=%d", holder, why, copies)
        return taken

    def _mere_copy(self, client_id: str) -> bool:
        """Whether all this group keeps of a stored session is the copy of its meta: it lives in another group, and
        neither its will nor any of its subscriptions is kept here."""
        if self.homed(client_id) or self.db.load_will(client_id) is not None:
            return False
        stored = self.db.load(client_id)
        return stored is not None and not stored.subscriptions

    def _hold_copy(self, client_id: str, holder: str, epoch: int) -> bool:
        """Drop the copy of ``client_id`` when its home group would expire the session ``holder`` lost now; True if
        held (not already, and it expires)."""
        if self._copy_claims.get(client_id) == (holder, epoch):
            return False  # already held: the controllers evicted the holder and it was gone for a lease
        meta = self.db.load_meta(client_id)
        lost_ms = self.now_ms()
        end = expiry_due(meta.expiry, meta.disconnected_at, lost_ms)
        if end is None:
            return False  # never expires: neither does its home group's session
        self._copy_claims[client_id] = (holder, epoch)
        self.copies.hold(client_id, None, end)
        if meta.disconnected_at is None:
            # the loss stored as the home group stores it, so a restart drops the copy at the same time (written
            # with the holder's epoch: the claim stays the holder's)
            d = defer.maybeDeferred(self.sessions.put_session, api.SessionMeta(
                client_id, meta.expiry, meta.level, lost_ms, meta.owner), epoch)
            d.addErrback(self._failed, "hold_copy", client_id)
        return True

    @defer.inlineCallbacks
    def _took(self, client_id: str, epoch: int, lost_ms: int):
        self.takeovers += 1
        meta = self.db.load_meta(client_id)
        if meta is not None and meta.disconnected_at is None:
            # the loss is when its client left: stored, so a restart counts the expiry from it too
            yield self.sessions.put_session(api.SessionMeta(client_id, meta.expiry, meta.level, lost_ms, meta.owner),
                                            epoch)
        if self.sessions.claims.get(client_id) == (self.holder, epoch):  # not back elsewhere meanwhile
            self._arm(client_id, epoch, lost_ms, self.now_ms(), store_due=True)

    def _arm(self, client_id: str, epoch: int, lost_ms: int | None, now_ms: int, store_due: bool = False) -> None:
        meta = self.db.load_meta(client_id)
        will = self.db.load_will(client_id)
        if meta is None and will is None:  # nothing left of it: the claim goes
            self._epochs.pop(client_id, None)
            self.store.release_session(client_id, epoch).addErrback(self._failed, "release", client_id)
            return
        if lost_ms is None:  # re-armed after a restart: the loss is what was stored
            lost_ms = meta.disconnected_at if meta is not None and meta.disconnected_at is not None else (
                will.due_ms if will is not None and will.due_ms is not None else now_ms)
        end = expiry_due(meta.expiry if meta is not None else None,
                         meta.disconnected_at if meta is not None else None, lost_ms)
        due = will_due(will.delay_s, will.due_ms, lost_ms, end) if will is not None else None
        if store_due and will is not None and will.due_ms != due:
            will.due_ms = due
            self.db.save_will(client_id, will)
        self._epochs[client_id] = epoch
        self.deadlines.hold(client_id, due, end)

    # -- events of the claims ------------------------------------------------------------------------

    def _claimed(self, client_id: str, old_holder: str, epoch: int) -> None:
        if self._copy_claims.pop(client_id, None) is not None:
            self.copies.forget(client_id)  # claimed again: the copy is its new holder's
        if self.sessions.claims.get(client_id) == (self.holder, epoch) and old_holder != self.holder:
            # our own takeover, or a session handed over in the group's name by a holder that let it go
            if client_id not in self._epochs:
                self._epochs[client_id] = epoch
                self._took(client_id, epoch, self.now_ms()).addErrback(self._failed, "hand_over", client_id)
            return
        if old_holder == self.holder:  # the client is back (on any proxy): its will and expiry are cancelled
            self._epochs.pop(client_id, None)
            if self.deadlines.forget(client_id):
                log.info("session_returned client=%s epoch=%d", client_id, epoch)

    # -- what comes due ------------------------------------------------------------------------------

    def _tick(self) -> None:
        for holder in self.absences.lost(self.clock.seconds()):
            self.take_over(holder, "connection gone for a lease")
        ends = 0
        if self.deadlines.next_due() is not None:
            for action in self.deadlines.due(self.now_ms(), ENDS_PER_TICK):
                ends += isinstance(action, ExpireSession)
                epoch = self._epochs.get(action.client_id)
                if epoch is None or self.sessions.claims.get(action.client_id) != (self.holder, epoch):
                    continue  # back elsewhere
                if isinstance(action, ExpireSession):
                    self._expire(action.client_id, epoch).addErrback(self._failed, "expire", action.client_id)
                else:
                    self._publish_will(action.client_id, epoch)
        if ends < ENDS_PER_TICK and self.copies.next_due() is not None:  # a drop costs the same KV scans
            for action in self.copies.due(self.now_ms(), ENDS_PER_TICK - ends):
                self._drop_copy(action.client_id)

    def _publish_will(self, client_id: str, epoch: int) -> None:
        will = self.db.load_will(client_id)
        if will is None:
            return
        message = rec.published_later(will.message(client_id), self.now_ms())
        d = self.store.put_retained(message) if message.retain and message.body else self.store.append(message)

        def published(result):
            self.wills_published += 1
            log.info("will_published client=%s topic=%s by=%s status=%s", client_id, will.topic, self.holder,
                     getattr(getattr(result, "status", None), "name", "PUT_OK"))
            return self.sessions.delete_will(client_id, epoch)

        d.addCallback(published).addErrback(self._failed, "publish_will", client_id)

    @defer.inlineCallbacks
    def _expire(self, client_id: str, epoch: int):
        self._epochs.pop(client_id, None)
        yield self.store.delete_session(client_id, epoch)  # the broker's interest in its filters goes with it
        yield self.store.release_session(client_id, epoch)
        self.sessions_expired += 1
        log.info("session_expired client=%s by=%s", client_id, self.holder)

    def _drop_copy(self, client_id: str) -> None:
        lost = self._copy_claims.pop(client_id, None)
        if lost is None or self.sessions.claims.get(client_id) != lost:
            return  # claimed again (its client is back, on any proxy): the copy is its new holder's
        if not self._mere_copy(client_id):
            return  # more than a copy now (the slots moved its home here, or a holder cut off only wrote a part)
        self._drop(client_id, *lost).addErrback(self._failed, "drop_copy", client_id)

    @defer.inlineCallbacks
    def _drop(self, client_id: str, holder: str, epoch: int):
        yield self.store.delete_session(client_id, epoch)
        yield self.store.release_session(client_id, epoch)
        self.copies_dropped += 1
        log.info("session_copy_dropped client=%s holder=%s group=%s", client_id, holder, self.group)

    @staticmethod
    def _failed(failure, what: str, client_id: str) -> None:
        log.warning("session_keeper_failed op=%s client=%s reason=%s", what, client_id, failure.getErrorMessage())

    def stats(self) -> dict:
        return {"held": len(self.deadlines), "takeovers": self.takeovers, "wills_published": self.wills_published,
                "sessions_expired": self.sessions_expired, "copies_held": len(self.copies),
                "copies_dropped": self.copies_dropped}
