"""The session registry: who holds a client id, connect and takeover, session expiry, will messages.

One ``SessionRegistry`` per process, on the reactor thread. It owns the life of
a session: CONNECT finds or creates it (taking it over from an older link),
DISCONNECT or a lost link ends its connection (publishing the will, at once or
after its delay), expiry forgets it, and ``restore`` brings persistent sessions
back after a restart. Subscriptions go through the ``SubscriptionRouter``;
delivery through the ``DeliveryPump`` in the sessions' ``SessionContext``.
"""

from __future__ import annotations

import logging
import sys
import uuid

from twisted.internet import defer

from mqtt_proxy.auth.acl import ACL, ReadCheck
from mqtt_proxy.codec import MQTT_5, NO_PROPERTIES, ConnAck, Properties, ReasonCode
from mqtt_proxy.config import LimitsConfig, MQTTConfig
from mqtt_proxy.delivery import SessionContext
from mqtt_proxy.inbound import InboundBatcher
from mqtt_proxy.router import SubscriptionRouter
from mqtt_proxy.session import Session
from mqtt_proxy.session_state import NEVER_EXPIRES, PeerError, ScheduleWill
from store.api import NotAuthorized, Owed, SessionMeta, SessionState, Sessions, StoreError, WillState

log = logging.getLogger("twistmq.mqtt.broker")  # the logger name is a stable, greppable part of the log lines

ANONYMOUS = "anonymous"
_ACCEPTED = {present: ConnAck(present, ReasonCode.SUCCESS, NO_PROPERTIES) for present in (False, True)}
"""The CONNACKs without properties (every 3.1.1 one), made once: a frozen dataclass and an empty Properties
(a field per MQTT 5 property) per CONNECT were a connect storm's share."""


def identity_of(acl_username: str | None, cert_identity: str | None) -> str:
    """Who a connection is, as a session's owner: its verified username, else its certificate, else anonymous.

    An unverified username (no password file) is no identity: anybody may claim it.
    """
    if acl_username is not None:
        return "user:" + acl_username
    if cert_identity:
        return "cert:" + cert_identity
    return ANONYMOUS


class SessionRegistry:
    """Sessions by client id, connected or not, and the timers of their expiry and delayed wills."""

    def __init__(self, ctx: SessionContext, router: SubscriptionRouter, inbound: InboundBatcher, auth, acl: ACL,
                 config: MQTTConfig, limits: LimitsConfig, holder: str = "node", publisher=None,
                 log_connections: bool = True, left_wills: bool = False) -> None:
        self.ctx = ctx
        self.router = router
        self.store: Sessions = ctx.sessions  # claims, session state
        self.inbound = inbound  # a session's writes wait for what its client published (flush)
        self.publisher = publisher  # wills are decided and published by it, like a client's PUBLISH
        self.auth = auth
        self.acl = acl
        self.config = config
        self.limits = limits
        self.holder = holder  # who claims sessions here (``Sessions.claim_session``): this proxy's member id
        self.clock = ctx.delivery.clock
        self.stats = ctx.delivery.stats
        self.sessions: dict[str, Session] = {}
        self._connecting: dict[str, int] = {}  # client id -> CONNECTs that claimed it and are not done yet
        self._on_fenced = self._fenced  # one bound method for every session, not one each
        # Off, the routine connect and disconnect lines are not even made: a record each (the caller's frame
        # looked up) was a share of a connect storm, only for the log's filter to drop it.
        self.log_connections = log_connections
        # Whether ``restore`` publishes the wills this holder's last life left: a node's (no one else will); a
        # proxy's are published by its broker groups, which take a lost proxy's sessions over.
        self.left_wills = left_wills

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    # -- restore after a restart ---------------------------------------------------------

    @defer.inlineCallbacks
    def restore(self):
        """Bring back the persistent sessions this holder held (before listeners open), and with ``left_wills``
        publish the wills its last life's connections left: they went with the process, unannounced.

        Such a will goes out after its Will Delay Interval, counted from its client's disconnect if that came
        before the restart, else from the restart (the crash's time is not known), or when its session ends if
        that is sooner; its client's return first cancels it. A will of a session that was not persistent goes
        out at once, its claim released after it is stored.
        """
        left = {}
        if self.left_wills:
            wills = yield self.store.list_wills()
            left = {held.client_id: held for held in wills if held.holder in ("", self.holder)}
        stored = yield self.store.list_sessions()
        now = self.now_ms()
        restored = 0
        ended = []
        for state in stored:
            meta = state.meta
            if state.holder not in ("", self.holder) or meta.client_id in self.sessions:
                continue  # held by another proxy: it comes back when its client connects here
            if meta.disconnected_at_ms is not None and meta.expiry_s != NEVER_EXPIRES \
                    and meta.disconnected_at_ms + meta.expiry_s * 1000 <= now:
                ended.append(state)
                continue
            session = yield self._revive(state)
            self.sessions[meta.client_id] = session
            self._schedule_expiry(session, meta.disconnected_at_ms or now)
            held = left.pop(meta.client_id, None)
            if held is not None:
                self._arm_left_will(session, held.will, meta.disconnected_at_ms or now)
            restored += 1
        # The wills go out once every restored subscription's filter interest is back, so they reach them.
        for state in ended:  # sessions that ended while the process was down
            cid = state.meta.client_id
            held = left.pop(cid, None)
            if held is not None:  # due at the session's end at the latest
                yield self.publisher.publish_stored_will(cid, held.will)
            try:
                yield self.store.delete_session(cid, state.epoch)
            except StoreError as exc:
                log.warning("session_expire_failed client=%s error=%s", cid, exc)
            else:
                self._release(cid, state.epoch)
        published = [self.publisher.publish_stored_will(held.client_id, held.will).addCallback(
            self._left_will_published, held.client_id, held.epoch) for held in left.values()]
        yield defer.gatherResults(published)
        log.info("sessions_restored sessions=%d expired=%d wills_left=%d", restored, len(ended), len(published))

    def _arm_left_will(self, session: Session, will: WillState, lost_ms: int) -> None:
        """A restored session's will, left by the connection lost at ``lost_ms``: due after its delay, or at the
        session's end if that is sooner (``_expire`` then publishes it first)."""
        due = lost_ms + will.delay_s * 1000
        end = session.state.expiry_deadline_ms(lost_ms)
        if end is not None:
            due = min(due, end)
        session.will_stored = True
        session.will_call = self.clock.callLater(max(0.0, (due - self.now_ms()) / 1000), self._left_will_due,
                                                 session, will)

    def _left_will_due(self, session: Session, will: WillState) -> None:
        session.will_call = None
        epoch = session.epoch

        def stored(written: bool):
            # unless its client came back meanwhile (then the claim dropped it) or the session ended (its release did)
            if written and self.sessions.get(session.client_id) is session and session.epoch == epoch \
                    and session.conn is None:
                self._will_done(session)

        self.publisher.publish_stored_will(session.client_id, will).addCallback(stored)

    def _left_will_published(self, written: bool, client_id: str, epoch: int) -> defer.Deferred | None:
        """The will of a session that did not persist is out: the store forgets it, and the claim it was kept under
        (a will the store refused stays, for the next start)."""
        if not written:
            return None
        d = self.store.delete_will(client_id, epoch)
        d.addCallback(lambda _: self._release(client_id, epoch))
        d.addErrback(lambda f: log.warning("will_delete_failed client=%s error=%s", client_id, f.getErrorMessage()))
        return d

    @defer.inlineCallbacks
    def _revive(self, state: SessionState):
        """A stored session as a live one (not yet in ``sessions``): subscriptions, in-flight state."""
        meta = state.meta
        session = self._new_session(meta.client_id, meta.protocol_level, meta.expiry_s, state.epoch)
        session.owner = meta.owner
        for ss in state.subscriptions:
            sub = yield self.router.restore_subscription(session, ss)
            session.add_subscription(sub)
        session.state.restored(state.outbound, state.released, state.inbound_qos2)
        session.stored = True
        return session

    def _new_session(self, client_id: str, level: int, expiry: int, epoch: int) -> Session:
        session = Session(self.ctx, client_id, level, expiry, epoch)
        session.on_fenced = self._on_fenced
        return session

    # -- CONNECT ------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def connect(self, conn, packet):
        """Authenticate, claim the session, find or create it, answer CONNACK, then resume delivery."""
        level = packet.protocol_level
        props = packet.properties
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if level != MQTT_5 and not packet.clean_start:
                conn.refuse(ReasonCode.CLIENT_IDENTIFIER_NOT_VALID)  # MQTT-3.1.3-8
                return
            client_id = assigned = "auto-" + uuid.uuid4().hex
        if packet.will is not None and packet.will.retain and not self.config.retain_available:
            conn.refuse(ReasonCode.RETAIN_NOT_SUPPORTED)
            return
        result = yield self.auth.authenticate(
            packet.username, packet.password, client_id, conn.peer_host, conn.cert_identity())
        if not conn.connected:
            return
        if not result.ok:
            conn.refuse(ReasonCode(result.v5_reason_code))
            return
        # Interned: many clients share a few user names, and each CONNECT decodes its own copy.
        conn.username = sys.intern(result.username) if type(result.username) is str else result.username
        # An unverified name never gets that user's rules.
        conn.acl_username = conn.username if result.acl_username is not None else None
        if self.config.use_username_as_clientid:
            # The client id is the identity (as Mosquitto's option): rules keyed by client id are safe then.
            if conn.acl_username is None:  # anonymous or unverified: nothing to bind the id to (as Mosquitto)
                conn.refuse(ReasonCode.NOT_AUTHORIZED)
                return
            client_id, assigned = conn.acl_username, None
        identity = identity_of(conn.acl_username, conn.cert_identity())
        if assigned is None and not self._may_take(client_id, identity, conn):
            return
        if level == MQTT_5:
            expiry = props.session_expiry_interval or 0
            if expiry != NEVER_EXPIRES:
                expiry = min(expiry, self.config.session_expiry_max)
        else:
            expiry = 0 if packet.clean_start else self.config.session_expiry_max
        receive_maximum, max_packet_size, alias_maximum = 65535, 0, 0  # the client's limits (v5 only)
        if level == MQTT_5:
            if props.receive_maximum is not None:
                receive_maximum = props.receive_maximum
            max_packet_size = props.maximum_packet_size or 0
            alias_maximum = props.topic_alias_maximum or 0

        # MQTT-3.1.4-3: claim the session first, so a holder elsewhere is fenced off before we read its state.
        # An id assigned here is new: nobody else can hold it.
        epoch = 0
        claimed = None
        if assigned is None:
            self._connecting[client_id] = self._connecting.get(client_id, 0) + 1
        try:
            if assigned is None:
                try:
                    # the claim and the stored session in one call (read after the claim fenced its old holder)
                    claimed = yield self.store.claim_and_get(client_id, self.holder, identity)
                    epoch = claimed.epoch
                except NotAuthorized:
                    self._refuse_foreign(conn, client_id, identity, "another")
                    return
                except StoreError as exc:
                    log.error("session_claim_failed client=%s error=%s", client_id, exc)
                    conn.refuse(ReasonCode.SERVER_UNAVAILABLE)
                    return
            session = self.sessions.get(client_id)
            if session is not None and not self._owned_by(session, identity):
                # Made by another identity while this CONNECT waited: the claim is this holder's either way,
                # so the owner's session keeps it, untouched otherwise.
                session.epoch, session.fenced = epoch, False
                self._refuse_foreign(conn, client_id, identity, session.owner)
                return
            if session is not None:
                session.epoch, session.fenced = epoch, False
                if session.conn is not None:
                    self.take_over(session)
                    session = self.sessions.get(client_id)  # a non-persistent session ended with the old link
            elif assigned is None:
                session = yield self._loaded(claimed.session, client_id, epoch, packet.clean_start, identity)
                if session is not None and not self._owned_by(session, identity):
                    # Stored by another identity since the check before the claim: kept as it was.
                    self._schedule_expiry(session, self.now_ms())
                    self._refuse_foreign(conn, client_id, identity, session.owner)
                    return
            session_present = False
            if session is not None and packet.clean_start:
                yield self.end_session(session)
                session = None
            if session is None:
                session = self.sessions.get(client_id)  # another CONNECT of the id made one meanwhile
                if session is not None:
                    session.epoch, session.fenced = epoch, False
            if session is None:
                session = self._new_session(client_id, level, expiry, epoch)
                session.owner = identity
                self.sessions[client_id] = session
            elif not self._owned_by(session, identity):  # made by another CONNECT of the id meanwhile
                self._refuse_foreign(conn, client_id, identity, session.owner)
                return
            elif not packet.clean_start:
                session_present = True
            if not conn.connected:
                # The client left while we waited for the store: keep the session as it is.
                self._schedule_expiry(session, self.now_ms())
                return
            if session.will_call is not None and session.will_call.active():
                session.will_call.cancel()  # MQTT-3.1.3-9: a delayed will is cancelled by the return
            session.will_call = None
            session.state.connect_accepted(expiry, packet.will, receive_maximum, max_packet_size, alias_maximum)
            session.acl_username = conn.acl_username
            yield self._store_will(session, packet.will)
            if session.owner is None:
                if session_present:
                    log.warning("session_owner_adopted client=%r owner=%r (stored without an owner)",
                                client_id, identity)
                session.owner = identity
            session.reads = ReadCheck(self.acl, conn.acl_username, client_id) if self.acl.configured else None
            if session.persistent:
                yield session.save_session(SessionMeta(client_id, expiry, level, None, session.owner))
                session.stored = True
            elif session.stored:
                # Scans of a RocksDB range full of tombstones get slow: only delete what was written.
                session.stored = False
                yield session.delete_session()
            if session.fenced:  # claimed elsewhere while we were connecting: the other connection has it
                conn.refuse(ReasonCode.SERVER_UNAVAILABLE)
                return
            if not conn.connected:
                self._schedule_expiry(session, self.now_ms())
                return

            ack_props = None
            if level == MQTT_5:
                kw = {"receive_maximum": self.config.receive_maximum,
                      "topic_alias_maximum": self.config.topic_alias_maximum,
                      "maximum_packet_size": self.limits.max_packet_size}
                if not self.config.retain_available:
                    kw["retain_available"] = 0
                if assigned:
                    kw["assigned_client_identifier"] = assigned
                if props.session_expiry_interval is not None and expiry != props.session_expiry_interval:
                    kw["session_expiry_interval"] = expiry
                if conn.server_keep_alive is not None:
                    kw["server_keep_alive"] = conn.server_keep_alive
                ack_props = Properties(**kw)
            conn.client_id = client_id
            conn.session = session
            self.acl.hold(conn.acl_username, client_id)  # a MongoDB ACL keeps a connected client's rules fresh
            conn.send_connack(ConnAck(session_present, ReasonCode.SUCCESS, ack_props) if ack_props is not None
                              else _ACCEPTED[session_present])
            self.stats.clients_connected += 1
            session.attach(conn)  # resends what was in flight
            session.pump()
            if self.log_connections:
                log.info("client_connected client=%s level=%d clean=%s expiry=%d present=%s peer=%s",
                         client_id, level, packet.clean_start, expiry, session_present, conn.peer_host)
        finally:
            if assigned is None:
                self._connect_done(client_id, epoch)

    def _store_will(self, session: Session, will):
        """Store the will this CONNECT set, as the publish decision takes it, in its group before CONNACK, so the
        group publishes it if this holder is lost (the claim dropped the will of any connection before)."""
        session.will_stored = False
        state = (self.publisher.will_state(session.client_id, will, session.acl_username)
                 if will is not None and self.publisher is not None else None)
        if state is None:
            return None
        session.will_stored = True
        return session.save_will(state)

    def _will_done(self, session: Session) -> None:
        """The stored will was published here, or cancelled: its group forgets it."""
        if session.will_stored:
            session.will_stored = False
            session.delete_will()

    # -- who a session belongs to ------------------------------------------------------------

    @staticmethod
    def _owned_by(session: Session, identity: str) -> bool:
        """Whether ``identity`` may take ``session`` (one stored before owners were kept: anybody, once)."""
        return session.owner is None or session.owner == identity

    def _may_take(self, client_id: str, identity: str, conn) -> bool:
        """Before the claim (which would fence the holder): refuse a client id whose session here is another's.

        A session made by another identity, connected or stored, is neither
        taken over nor discarded, whatever the clean-start flag: CONNACK
        0x87 / 5 and the owner's session and connection stay as they are. A
        session held elsewhere is checked by its group at the claim
        (``claim_session``'s ``owner``: ``NotAuthorized``, nobody fenced).
        """
        session = self.sessions.get(client_id)
        owner = session.owner if session is not None else None
        if owner is not None and owner != identity:
            self._refuse_foreign(conn, client_id, identity, owner)
            return False
        return True

    def _refuse_foreign(self, conn, client_id: str, identity: str, owner: str | None) -> None:
        log.warning("session_foreign_refused client=%r identity=%r owner=%r peer=%s",
                    client_id, identity, owner, conn.peer_host)
        conn.refuse(ReasonCode.NOT_AUTHORIZED)

    def _connect_done(self, client_id: str, epoch: int) -> None:
        """A CONNECT that claimed ``client_id`` finished: if it left no session here, let the claim go."""
        left = self._connecting[client_id] - 1
        if left:
            self._connecting[client_id] = left
        else:
            del self._connecting[client_id]
        self._release(client_id, epoch)

    def _release(self, client_id: str, epoch: int) -> None:
        """Tell the store this holder let ``client_id`` go, unless a session or a CONNECT of it is still here.

        The store then forgets the claim (if nothing of the session is stored), so ids that come and go
        leave no claims behind, here or in the store.
        """
        if not epoch or client_id in self.sessions or client_id in self._connecting:
            return
        self.store.release_session(client_id, epoch).addErrback(
            lambda f: log.warning("session_release_failed client=%s error=%s", client_id, f.getErrorMessage()))

    def _loaded(self, state: SessionState | None, client_id: str, epoch: int, clean_start: bool, identity: str):
        """The stored session ``state`` of ``client_id`` (held elsewhere before, or by nobody since a restart) made
        live here, or None.

        A clean start by its owner deletes what was stored instead (another identity's is loaded and kept).
        A new client id (nothing stored: the common case) costs no generator of its own.
        """
        return None if state is None else self._load_stored(state, client_id, epoch, clean_start, identity)

    @defer.inlineCallbacks
    def _load_stored(self, state: SessionState, client_id: str, epoch: int, clean_start: bool, identity: str):
        if clean_start and state.meta.owner in (None, identity):
            try:
                yield self.store.delete_session(client_id, epoch)
            except StoreError as exc:
                log.warning("session_delete_failed client=%s error=%s", client_id, exc)
            return None
        session = yield self._revive(state)
        session.epoch = epoch
        if client_id in self.sessions:  # another CONNECT of the id won the race: keep its session
            self.router.release(session)
            return self.sessions[client_id]
        self.sessions[client_id] = session
        return session

    def take_over(self, session: Session) -> None:
        """MQTT-3.1.4-3: a new connection of the client id here closes the old one (v5: 0x8E)."""
        old = session.conn
        log.info("session_taken_over client=%s", session.client_id)
        self.conn_gone(old, publish_will=True)
        old.close(ReasonCode.SESSION_TAKEN_OVER)

    def taken_over(self, client_id: str, epoch: int) -> None:
        """Another holder claimed ``client_id`` with ``epoch`` (the store's event, carried to the old holder).

        A session held here with an older epoch is fenced: its client is
        disconnected (v5: 0x8E) and it is forgotten here, without a write.
        """
        session = self.sessions.get(client_id)
        if session is not None and session.epoch < epoch and not session.fenced:
            session.fenced = True
            self._fenced(session)

    def _fenced(self, session: Session) -> None:
        """A write of ``session`` was refused as ``Fenced``: a newer holder has it. Let it go here."""
        log.info("session_taken_over client=%s epoch=%d holder=elsewhere", session.client_id, session.epoch)
        conn = session.conn
        if conn is not None:
            self.conn_gone(conn, publish_will=True)  # as a takeover here: the old link's will goes out
            conn.close(ReasonCode.SESSION_TAKEN_OVER)
        if session.will_call is not None and session.will_call.active():
            session.will_call.cancel()  # MQTT-3.1.3-9: its client is back, on the new holder
        session.will_call = None
        if self.sessions.get(session.client_id) is session:
            session.stored = False  # the new holder owns what is stored
            self.end_session(session)

    def close_group_sessions(self, has_part) -> list[tuple[str, int]]:
        """A broker group is lost for a lease: close every session ``has_part(session)`` says has state there.

        Its client is disconnected (v5: 0x89 Server busy) and reconnects where its group can be reached; the
        session is forgotten here without a write (its group owns what is stored, and takes it over once it
        sees this holder gone or lets it go), so a will never fires for a client still connected. The will
        goes out from here if its own group can be reached. Returns the (client id, epoch) dropped.
        """
        dropped = []
        for session in [s for s in self.sessions.values() if has_part(s)]:
            dropped.append((session.client_id, session.epoch))
            session.fenced = True  # write nothing more: its group cannot be reached, and owns what is stored
            conn = session.conn
            if conn is not None:
                self.conn_gone(conn, publish_will=True)
                conn.close(ReasonCode.SERVER_BUSY)
            if self.sessions.get(session.client_id) is session:
                session.stored = False
                self.end_session(session)
        if dropped:
            log.warning("sessions_dropped_group_lost sessions=%d", len(dropped))
        return dropped

    # -- leaving ------------------------------------------------------------------------------

    def disconnect(self, conn, packet) -> None:
        """A DISCONNECT from the client: no will unless it asked for one (v5 0x04)."""
        session = conn.session
        if session is None:
            conn.close(None)
            return
        try:
            session.state.disconnect_received(packet.properties.session_expiry_interval,
                                              self.config.session_expiry_max)
        except PeerError as exc:
            log.info("protocol_violation client=%s %s", session.client_id, exc.text)
            conn.close(exc.reason_code)
            self.conn_gone(conn, publish_will=True)
            return
        publish_will = packet.reason_code == ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
        self.conn_gone(conn, publish_will=publish_will)
        conn.close(None)

    def connection_lost(self, conn) -> None:
        """The transport closed: without a DISCONNECT first, the will goes out."""
        if conn.session is not None:
            self.conn_gone(conn, publish_will=True)

    def conn_gone(self, conn, publish_will: bool) -> None:
        session = conn.session
        if session is None:
            return
        conn.session = None
        self.acl.release(conn.acl_username, conn.client_id)
        if session.conn is not conn:
            return
        self.stats.clients_connected -= 1
        will_actions = session.detach(publish_will)
        delayed = False
        for action in will_actions:
            if isinstance(action, ScheduleWill):
                delayed = True
                session.will_call = self.clock.callLater(action.delay, self._delayed_will, session, action.will)
            else:
                self._publish_will(session.client_id, action.will, session.acl_username)
        if not delayed:  # published now, or cancelled (a normal DISCONNECT)
            self._will_done(session)
        if not session.persistent:
            self.end_session(session)
        else:
            session.save_session(SessionMeta(session.client_id, session.expiry, session.level, self.now_ms(),
                                             session.owner))
            session.stored = True
            self._schedule_expiry(session, self.now_ms())
        if self.log_connections:
            log.info("client_disconnected client=%s will=%s", session.client_id, bool(will_actions))

    def _schedule_expiry(self, session: Session, since_ms: int) -> None:
        deadline = session.state.expiry_deadline_ms(since_ms)
        if deadline is None or session.conn is not None:
            return
        if session.expiry_call is not None and session.expiry_call.active():
            session.expiry_call.cancel()
        delay = max(0.0, (deadline - self.now_ms()) / 1000)
        session.expiry_call = self.clock.callLater(delay, self._expire, session)

    def _expire(self, session: Session) -> None:
        if session.conn is not None or self.sessions.get(session.client_id) is not session:
            return
        log.info("session_expired client=%s", session.client_id)
        call = session.will_call
        if call is not None and call.active():
            due, args = call.func, call.args  # MQTT-3.1.3-9: the will goes out when the session ends first
            call.cancel()
            session.state.expired()
            due(*args)
        self.end_session(session)

    def end_session(self, session: Session) -> defer.Deferred:
        """Forget a session: its filters, its group memberships, its stored state."""
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        if session.expiry_call is not None and session.expiry_call.active():
            session.expiry_call.cancel()
        self.router.release(session)  # the session's ``ended`` event
        if not session.stored or session.fenced:
            self._release(session.client_id, session.epoch)
            return defer.succeed(None)
        session.stored = False
        d = session.delete_session()
        self._release(session.client_id, session.epoch)  # after the delete: writes of an id apply in call order
        return d

    # -- will ---------------------------------------------------------------------------------

    def _delayed_will(self, session: Session, will) -> None:
        session.will_call = None
        self._publish_will(session.client_id, will, session.acl_username)
        self._will_done(session)

    def _publish_will(self, client_id: str, will, acl_username: str | None = None) -> None:
        if will is not None:
            self.publisher.publish_will(client_id, will, acl_username)  # the one publish decision

    # -- retention ---------------------------------------------------------------------------

    def owed(self):
        """Retention holder: per session subscription and shared group, the lowest queue offset still owed.

        A subscription owes, in each broker group, from its oldest unacknowledged
        QoS 1/2 message there, else from its next position; a shared group from
        its committed positions. (Retention is the local store's: the offsets
        are its own group's, read only here, at the composition root's request.)
        """
        for cid, session in self.sessions.items():
            for sub in session.subs.values():
                if sub.share is None:
                    owed = session.state.owed(sub.key)
                    for position in sub.positions.values():
                        low = min((p for p in owed if p.group == position.group), default=position)
                        yield Owed("session " + cid, sub.queue, min(low, position).offset)
        yield from self.router.owed()
