"""Durable MQTT session state: typed keys in the session KV, written through the commit log.

Key layout (``cid`` is the client id, ``\\x00`` separates it from the rest)::

    s/<cid>                    -> {"expiry": s, "level": 4|5, "disc": ms or null, "owner": identity}
                                  ("owner" absent in sessions stored before owners were recorded)
    u/<cid>\\x00<filter>         -> subscription: qos, options, sub id, next offset (send mark)
    o/<cid>\\x00<pid u16>        -> outbound QoS 1/2 PUBLISH in flight: filter, queue offset, qos
    r/<cid>\\x00<pid u16>        -> outbound QoS 2 released (PUBREL owed until PUBCOMP)
    i/<cid>\\x00<pid u16>        -> inbound QoS 2 stored, PUBREL not yet seen (exactly once)
    g/<group>\\x00<filter>       -> shared subscription group's committed offset
    e/<cid>                    -> the session's claim: {"holder": member id, "epoch": n}, while a holder
                                  has the session or it is stored (``LocalSessions`` forgets it after)
    c/epoch-mark               -> the claim epochs' high-water mark: no epoch above it was ever handed out
    w/<cid>                    -> the client's will as its proxy's publish decision accepted it (``StoredWill``),
                                  with its due time once its group took the session over from a lost holder
    l/<holder>                 -> the last life (process) of a holder its group saw connect: {"boot": id,
                                  "first": the group's first claim epoch then} (``SessionKeeper``)

The KV handed in is a ``store.session_log.SessionLog`` in a broker: each write
is a commit-log record (so replicas and a rebuilt KV have it) and its Deferred
fires once that record is durable under the flush policy. Delivery positions
(``u/``'s next offset alone, ``o/`` at QoS 1, ``g/``) go through its
``put_position``: in the KV at once, in the log at most ``position_log_s``
later. A plain ``DurableKV`` (tests, tools) takes every write as a ``put``.
Callers that must not answer the client before the state is durable wait on
the Deferred a write returns.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from twisted.internet import defer

from store import record as rec

if TYPE_CHECKING:  # the KV is handed in by the composition root; its RocksDB stays on the broker side
    from store.kv import DurableKV

_PID = struct.Struct(">H")
SEP = b"\x00"
EPOCH_MARK = b"c/epoch-mark"


@dataclass
class StoredSubscription:
    """A subscription as persisted."""

    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    sub_id: int = 0
    share_group: str | None = None
    next_offset: int = 0


@dataclass
class StoredSession:
    """Everything a persistent session needs after a restart."""

    client_id: str
    expiry: int
    level: int
    disconnected_at: int | None
    owner: str | None = None  # the identity that made it; None: stored before owners were recorded
    subscriptions: dict[str, StoredSubscription] = field(default_factory=dict)
    outbound: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # pid -> (filter key, qoff, qos)
    released: set[int] = field(default_factory=set)
    inbound_qos2: set[int] = field(default_factory=set)


@dataclass
class StoredWill:
    """A will as persisted: the message to publish (the accepted verdict's topic), its delay, and when it is due
    (None while its holder has the connection: the delay runs from the loss)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    born_ts: int
    properties: dict[str, str]
    delay_s: int
    due_ms: int | None = None

    def message(self, client_id: str) -> rec.Message:
        """The will as the message ``client_id`` left, born at its CONNECT."""
        return rec.Message(self.topic, self.payload, rec.RecordKind.MQTT_PUBLISH, self.qos, self.retain, client_id,
                           self.born_ts, self.properties)


def _cid(client_id: str) -> bytes:
    return client_id.encode("utf-8")


class SessionStore:
    """Typed access to session keys in a DurableKV."""

    def __init__(self, kv: DurableKV) -> None:
        self.kv = kv
        # Delivery positions may lag in the log (store.session_log); a plain KV has one kind of write.
        self._put_position = getattr(kv, "put_position", None) or kv.put
        self._delete_position = getattr(kv, "delete_position", None) or kv.delete

    def kv_barrier(self) -> defer.Deferred:
        """Fires once every session write made so far is durable."""
        return self.kv.barrier()

    # -- sessions -----------------------------------------------------------------------

    def save_session(self, client_id: str, expiry: int, level: int, disconnected_at: int | None,
                     owner: str | None = None) -> defer.Deferred:
        meta = {"expiry": expiry, "level": level, "disc": disconnected_at}
        if owner is not None:
            meta["owner"] = owner
        value = json.dumps(meta).encode()
        return self.kv.put(b"s/" + _cid(client_id), value)

    def delete_session(self, client_id: str) -> defer.Deferred:
        """Remove a session and everything under it."""
        cid = _cid(client_id)
        ds = [self.kv.delete(b"s/" + cid)]
        for prefix in (b"u/", b"o/", b"r/", b"i/"):
            for key, _ in list(self.kv.scan(prefix + cid + SEP)):
                ds.append(self.kv.delete(key))
        return defer.gatherResults(ds)

    def load_all(self) -> dict[str, StoredSession]:
        """Every persisted session, with its subscriptions and in-flight state."""
        sessions: dict[str, StoredSession] = {}
        for key, value in self.kv.scan(b"s/"):
            meta = json.loads(value)
            cid = key[2:].decode("utf-8")
            sessions[cid] = StoredSession(cid, meta["expiry"], meta["level"], meta.get("disc"), meta.get("owner"))
        for key, value in self.kv.scan(b"u/"):
            cid, rest = key[2:].split(SEP, 1)
            s = sessions.get(cid.decode("utf-8"))
            if s is None:
                continue
            d = json.loads(value)
            sub = StoredSubscription(d["f"], d["qos"], d["nl"], d["rap"], d["sid"], d["g"], d["next"])
            s.subscriptions[rest.decode("utf-8")] = sub
        for prefix, attr in ((b"o/", "outbound"), (b"r/", "released"), (b"i/", "inbound_qos2")):
            for key, value in self.kv.scan(prefix):
                cid, rest = key[2:].split(SEP, 1)
                s = sessions.get(cid.decode("utf-8"))
                if s is None or len(rest) != 2:
                    continue
                (pid,) = _PID.unpack(rest)
                if attr == "outbound":
                    d = json.loads(value)
                    s.outbound[pid] = (d["f"], d["q"], d["qos"])
                else:
                    getattr(s, attr).add(pid)
        return sessions

    def load(self, client_id: str) -> StoredSession | None:
        """One persisted session with everything under it (a scan of its own keys only), or None."""
        cid = _cid(client_id)
        value = self.kv.get(b"s/" + cid)
        if value is None:
            return None
        meta = json.loads(value)
        s = StoredSession(client_id, meta["expiry"], meta["level"], meta.get("disc"), meta.get("owner"))
        head = len(cid) + 3  # prefix, client id, separator
        for key, value in self.kv.scan(b"u/" + cid + SEP):
            d = json.loads(value)
            s.subscriptions[key[head:].decode("utf-8")] = StoredSubscription(
                d["f"], d["qos"], d["nl"], d["rap"], d["sid"], d["g"], d["next"])
        for key, value in self.kv.scan(b"o/" + cid + SEP):
            d = json.loads(value)
            s.outbound[_PID.unpack(key[head:])[0]] = (d["f"], d["q"], d["qos"])
        for prefix, ids in ((b"r/", s.released), (b"i/", s.inbound_qos2)):
            for key, _ in self.kv.scan(prefix + cid + SEP):
                ids.add(_PID.unpack(key[head:])[0])
        return s

    # -- subscriptions ------------------------------------------------------------------------

    def save_subscription(self, client_id: str, key: str, sub: StoredSubscription) -> defer.Deferred:
        value = json.dumps({"f": sub.topic_filter, "qos": sub.qos, "nl": sub.no_local, "rap": sub.retain_as_published,
                            "sid": sub.sub_id, "g": sub.share_group, "next": sub.next_offset}).encode()
        key = b"u/" + _cid(client_id) + SEP + _stored_key(sub)
        old = self.kv.get(key)
        # "next" is the last field: the same text before it is the same subscription, only its send mark moved.
        if old is not None and old.rpartition(b'"next":')[0] == value.rpartition(b'"next":')[0]:
            return self._put_position(key, value)
        return self.kv.put(key, value)

    def delete_subscription(self, client_id: str, sub: StoredSubscription) -> defer.Deferred:
        return self.kv.delete(b"u/" + _cid(client_id) + SEP + _stored_key(sub))

    # -- packet ids ---------------------------------------------------------------------------

    def _pid_key(self, prefix: bytes, client_id: str, pid: int) -> bytes:
        return prefix + _cid(client_id) + SEP + _PID.pack(pid)

    def save_outbound(self, client_id: str, pid: int, filter_key: str, queue_offset: int, qos: int) -> defer.Deferred:
        value = json.dumps({"f": filter_key, "q": queue_offset, "qos": qos}).encode()
        key = self._pid_key(b"o/", client_id, pid)
        # QoS 2 in flight is exactly-once state (a replica must not send it again once completed): logged
        # at once; QoS 1 in flight is a delivery position (a lagging copy redelivers, never loses).
        return self.kv.put(key, value) if qos >= 2 else self._put_position(key, value)

    def delete_outbound(self, client_id: str, pid: int) -> defer.Deferred:
        key = self._pid_key(b"o/", client_id, pid)
        old = self.kv.get(key)
        if old is not None and json.loads(old).get("qos", 0) >= 2:
            return self.kv.delete(key)
        return self._delete_position(key)

    def save_released(self, client_id: str, pid: int) -> defer.Deferred:
        return self.kv.put(self._pid_key(b"r/", client_id, pid), b"")

    def delete_released(self, client_id: str, pid: int) -> defer.Deferred:
        return self.kv.delete(self._pid_key(b"r/", client_id, pid))

    def save_inbound_qos2(self, client_id: str, pid: int) -> defer.Deferred:
        return self.kv.put(self._pid_key(b"i/", client_id, pid), b"")

    def delete_inbound_qos2(self, client_id: str, pid: int) -> defer.Deferred:
        return self.kv.delete(self._pid_key(b"i/", client_id, pid))

    # -- claims -------------------------------------------------------------------------------

    def save_claim(self, client_id: str, holder: str, epoch: int, owner: str = "") -> defer.Deferred:
        record = {"holder": holder, "epoch": epoch}
        if owner:
            record["owner"] = owner
        return self.kv.put(b"e/" + _cid(client_id), json.dumps(record).encode())

    def delete_claim(self, client_id: str) -> defer.Deferred:
        return self.kv.delete(b"e/" + _cid(client_id))

    def load_claims(self) -> dict[str, tuple[str, int]]:
        """Client id -> (holder, epoch) of every claim."""
        return {key[2:].decode("utf-8"): (d["holder"], d["epoch"])
                for key, d in ((k, json.loads(v)) for k, v in self.kv.scan(b"e/"))}

    def load_claim_owners(self) -> dict[str, str]:
        """Client id -> the identity that made each claim (claims from before owners were kept have none)."""
        return {key[2:].decode("utf-8"): d["owner"]
                for key, d in ((k, json.loads(v)) for k, v in self.kv.scan(b"e/")) if d.get("owner")}

    def stored_owner(self, client_id: str) -> str | None:
        """The owner of the stored session of ``client_id`` (None: none stored, or stored without an owner)."""
        value = self.kv.get(b"s/" + _cid(client_id))
        return json.loads(value).get("owner") if value is not None else None

    def has_session(self, client_id: str) -> bool:
        """Whether a session of ``client_id`` is stored (its meta; every stored session has one)."""
        return self.kv.get(b"s/" + _cid(client_id)) is not None

    def save_epoch_mark(self, mark: int) -> defer.Deferred:
        return self.kv.put(EPOCH_MARK, b"%d" % mark)

    def load_epoch_mark(self) -> int:
        """The claim epochs' high-water mark (0: none saved, a new store or one from before the mark)."""
        v = self.kv.get(EPOCH_MARK)
        return 0 if v is None else int(v)

    # -- wills ---------------------------------------------------------------------------------

    def save_will(self, client_id: str, will: StoredWill) -> defer.Deferred:
        value = json.dumps({"t": will.topic, "b": base64.b64encode(will.payload).decode("ascii"), "q": will.qos,
                            "r": will.retain, "born": will.born_ts, "p": will.properties, "d": will.delay_s,
                            "due": will.due_ms}).encode()
        return self.kv.put(b"w/" + _cid(client_id), value)

    def delete_will(self, client_id: str) -> defer.Deferred:
        return self.kv.delete(b"w/" + _cid(client_id))

    @staticmethod
    def _will(value: bytes) -> StoredWill:
        d = json.loads(value)
        return StoredWill(d["t"], base64.b64decode(d["b"]), d["q"], d["r"], d["born"], d["p"], d["d"], d.get("due"))

    def load_will(self, client_id: str) -> StoredWill | None:
        value = self.kv.get(b"w/" + _cid(client_id))
        return None if value is None else self._will(value)

    def load_wills(self) -> dict[str, StoredWill]:
        """Client id -> its stored will, for every will stored."""
        return {key[2:].decode("utf-8"): self._will(value) for key, value in self.kv.scan(b"w/")}

    # -- holders' lives ---------------------------------------------------------------------------------

    def save_life(self, holder: str, boot: str, first_epoch: int) -> defer.Deferred:
        return self.kv.put(b"l/" + _cid(holder), json.dumps({"boot": boot, "first": first_epoch}).encode())

    def load_lives(self) -> dict[str, tuple[str, int]]:
        """Holder -> (boot, first epoch) of its last life on record."""
        return {key[2:].decode("utf-8"): (d["boot"], d["first"])
                for key, d in ((k, json.loads(v)) for k, v in self.kv.scan(b"l/"))}

    def load_meta(self, client_id: str) -> StoredSession | None:
        """A stored session's meta only (no scan of what is under it), or None."""
        value = self.kv.get(b"s/" + _cid(client_id))
        if value is None:
            return None
        meta = json.loads(value)
        return StoredSession(client_id, meta["expiry"], meta["level"], meta.get("disc"), meta.get("owner"))

    # -- shared groups ------------------------------------------------------------------------

    def save_group_offset(self, group: str, topic_filter: str, offset: int) -> defer.Deferred:
        return self._put_position(b"g/" + group.encode() + SEP + topic_filter.encode(), b"%d" % offset)

    def load_group_offset(self, group: str, topic_filter: str) -> int | None:
        v = self.kv.get(b"g/" + group.encode() + SEP + topic_filter.encode())
        return None if v is None else int(v)


def _stored_key(sub: StoredSubscription) -> bytes:
    if sub.share_group is None:
        return sub.topic_filter.encode("utf-8")
    return f"$share/{sub.share_group}/{sub.topic_filter}".encode("utf-8")
