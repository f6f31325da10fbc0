"""Users and ACL rules kept in MongoDB (EMQX's document shapes), cached, refreshed, invalidated by change streams.

Documents::

    mqtt_user  {"username": "dev-1", "password_hash": "$7$101$...", "is_superuser": false}
    mqtt_acl   {"username": "dev-1" | "clientid": "c-1", "permission": "allow" | "deny",
                "action": "publish" | "subscribe" | "all", "topics": ["devices/${clientid}/#", ...]}

``password_hash`` is any encoding the password file accepts (``mqtt_proxy.auth.hashes``),
so a fleet moves between the file and MongoDB unchanged. ``${username}`` and
``${clientid}`` in topics are replaced by the client's; a value that is empty or
holds ``/``, ``+`` or ``#`` voids the rule (as ``%u``/``%c`` in the ACL file). A
document of another shape is skipped with one warning per document.

Nothing here imports ``pymongo`` or touches the reactor's thread with I/O: the
composition root passes ``call(fn, *args) -> Deferred``, which runs
``fn(database, *args)`` on its bounded pool (``cluster.mongodb.client.MongoPool``);
a failed call means MongoDB could not answer.

Caching, per ``cache_ttl`` seconds:

- A user document (with its hash) per username. The password is verified at every
  CONNECT, by the authenticator; only the document is cached, never a verdict. An
  unknown username is not cached (a device added a moment ago connects at once).
- A client's ACL rules and its superuser flag per (username, client id), loaded at
  CONNECT (``load_acl``) and read synchronously by every publish, subscribe and
  delivery check (``rules``). Rules of connected clients (``hold``/``release``)
  are refreshed in the background when half their TTL has passed, in batched
  queries, so a check never waits for MongoDB; rules nobody holds are dropped
  after the TTL. Rules older than the TTL (MongoDB down past it) are no rules:
  ``rules`` answers None and the checks deny.
- ``changed(change)`` (a change-stream event of either collection) marks the user
  document or the ACL entries the changed document touches stale at once and reads
  them again; until the new ones arrive (milliseconds) that user's CONNECT asks
  MongoDB itself and those clients' checks deny. Every read keeps the server's
  operation time, so an event the read already reflects (it arrives just after)
  changes nothing. ``restarted(since)`` (a change stream opened that reports changes
  after *since*) does that to everything read before. Without change streams the
  TTL bounds staleness.

``generation`` grows whenever a client's rules may have changed, so checks cached
against it (``ReadCheck``) are redone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet import defer, task
from twisted.logger import Logger

from lightqueue.topic import TopicError, validate_topic_filter
from mqtt_proxy.auth.acl import READ, WRITE
from mqtt_proxy.auth.hashes import HashError, parse_hash

__all__ = ["AclEntry", "MongoUserSource", "SourceRule", "UserDoc", "rules_from_documents"]

_log = Logger(namespace="twistmq.mqtt.auth.mongodb")

_ACTIONS = {"publish": frozenset({WRITE}), "subscribe": frozenset({READ}), "all": frozenset({READ, WRITE})}
_BATCH = 500
"""(username, client id) pairs refreshed in one query."""
_WARNED_MAX = 10000


@dataclass(frozen=True, slots=True)
class UserDoc:
    """The part of a user document the broker uses."""

    username: str
    password_hash: str
    """Checked with ``parse_hash`` when read; an unparsable one is kept as "" (no password matches it)."""
    is_superuser: bool = False
    doc_id: Any = None


@dataclass(frozen=True, slots=True)
class SourceRule:
    """One topic of an ACL document, placeholders substituted: allow or deny ``access`` on ``topic_filter``."""

    topic_filter: str
    access: frozenset
    deny: bool


class AclEntry:
    """One client's rules as last read, with when they were read and who holds them."""

    __slots__ = ("rules", "superuser", "doc_ids", "fetched_at", "optime", "refs", "loading")

    def __init__(self) -> None:
        self.rules: tuple[SourceRule, ...] = ()
        self.superuser = False
        self.doc_ids: frozenset = frozenset()
        self.fetched_at = -math.inf
        self.optime = None
        """The server's operation time of the read (None: unknown): a change at or before it is already in."""
        self.refs = 0
        self.loading: defer.Deferred | None = None


def _substitute(text: str, username: str | None, client_id: str | None) -> str | None:
    for token, value in (("${username}", username), ("${clientid}", client_id)):
        if token in text:
            if not value or any(ch in value for ch in "/+#"):
                return None
            text = text.replace(token, value)
    return text


def rules_from_documents(docs, username: str | None, client_id: str | None,
                         warn: Callable[[Any, str], None] = lambda doc_id, why: None) -> tuple[SourceRule, ...]:
    """The rules of ACL documents *docs* for one client; a malformed document is skipped and passed to *warn*."""
    rules = []
    for doc in docs:
        permission, action, topics = doc.get("permission"), doc.get("action"), doc.get("topics")
        if permission not in ("allow", "deny"):
            warn(doc.get("_id"), 'permission must be "allow" or "deny"')
            continue
        if action not in _ACTIONS:
            warn(doc.get("_id"), 'action must be "publish", "subscribe" or "all"')
            continue
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            warn(doc.get("_id"), "topics must be a list of strings")
            continue
        for topic in topics:
            resolved = _substitute(topic, username, client_id)
            if resolved is None:
                continue  # a placeholder with no usable value: the rule does not apply to this client
            try:
                validate_topic_filter(resolved)
            except TopicError as exc:
                warn(doc.get("_id"), f"topic {topic!r}: {exc}")
                continue
            rules.append(SourceRule(resolved, _ACTIONS[action], permission == "deny"))
    return tuple(rules)


def _find_user(database, collection: str, username: str):
    """The user document and the server's operation time of the read."""
    with database.client.start_session(causal_consistency=False) as session:
        doc = database[collection].find_one({"username": username},
                                            {"username": 1, "password_hash": 1, "is_superuser": 1},
                                            session=session)
        return doc, session.operation_time


def _find_acls(database, collection: str, acl_collection: str, usernames: list, client_ids: list):
    """ACL documents of any of the users or client ids, the users' superuser flags, and the server's operation time
    of the reads."""
    with database.client.start_session(causal_consistency=False) as session:
        return (*_read_acls(database, collection, acl_collection, usernames, client_ids, session),
                session.operation_time)


def _read_acls(database, collection, acl_collection, usernames, client_ids, session):
    clauses = []
    if usernames:
        clauses.append({"username": {"$in": usernames}})
    if client_ids:
        clauses.append({"clientid": {"$in": client_ids}})
    docs = list(database[acl_collection].find({"$or": clauses}, session=session)) if clauses else []
    supers = set()
    if usernames:
        for doc in database[collection].find({"username": {"$in": usernames}, "is_superuser": True},
                                             {"username": 1}, session=session):
            supers.add(doc.get("username"))
    return docs, supers


def _saw(optime, when) -> bool:
    """Whether a read at operation time *optime* already reflects a change at cluster time *when*."""
    return optime is not None and when is not None and optime >= when


class MongoUserSource:
    """The MongoDB users and ACL rules of one front end, cached (see the module docstring)."""

    def __init__(self, call: Callable[..., defer.Deferred], clock, collection: str = "mqtt_user",
                 acl_collection: str = "mqtt_acl", cache_ttl: float = 30.0) -> None:
        self._call = call
        self._clock = clock
        self.collection = collection
        self.acl_collection = acl_collection
        self.cache_ttl = cache_ttl
        self._users: dict[str, tuple[UserDoc, float, Any]] = {}
        """username -> (document, when it was read, the server's operation time of the read)."""
        self._acls: dict[tuple[str | None, str | None], AclEntry] = {}
        self._warned: set = set()
        self.generation = 0
        self._sweeper = task.LoopingCall(self.sweep)
        self._sweeper.clock = clock

    # -- life ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Refresh held rules in the background (every quarter TTL, at most every 5 s)."""
        self._sweeper.start(min(self.cache_ttl / 4, 5.0), now=False)

    def stop(self) -> None:
        if self._sweeper.running:
            self._sweeper.stop()

    # -- users --------------------------------------------------------------------------------

    def lookup(self, username: str) -> defer.Deferred:
        """The user's ``UserDoc``, or None when MongoDB has no such user; fails when MongoDB cannot answer and
        no document younger than the TTL is cached."""
        cached = self._users.get(username)
        if cached is not None and self._clock.seconds() - cached[1] < self.cache_ttl:
            return defer.succeed(cached[0])
        asked_at = self._clock.seconds()
        d = self._call(_find_user, self.collection, username)

        def found(result):
            doc, optime = result
            if doc is None:
                self._users.pop(username, None)
                return None
            user = self._user_doc(username, doc)
            if len(self._users) > 100_000:
                self._users.clear()
            self._users[username] = (user, asked_at, optime)
            return user

        return d.addCallback(found)

    def _user_doc(self, username: str, doc: dict) -> UserDoc:
        encoded = doc.get("password_hash")
        try:
            if not isinstance(encoded, str):
                raise HashError("password_hash must be a string")
            parse_hash(encoded)
        except HashError as exc:
            self._warn(doc.get("_id"), f"user {username!r}: {exc}")
            encoded = ""
        return UserDoc(username, encoded, doc.get("is_superuser") is True, doc.get("_id"))

    # -- ACL ----------------------------------------------------------------------------------

    def load_acl(self, username: str | None, client_id: str | None) -> defer.Deferred:
        """Make sure this client's rules are fresh (read them if not); fails when MongoDB cannot answer and the
        cached rules, if any, are older than the TTL."""
        entry = self._acls.get((username, client_id))
        if entry is not None and self._fresh(entry):
            return defer.succeed(entry)
        if entry is None:
            entry = self._acls[(username, client_id)] = AclEntry()
        return self._refresh([(username, client_id)])

    def rules(self, username: str | None, client_id: str | None) -> AclEntry | None:
        """This client's rules if younger than the TTL, else None (and a refresh starts)."""
        entry = self._acls.get((username, client_id))
        if entry is not None and self._fresh(entry):
            return entry
        if entry is None:
            entry = self._acls[(username, client_id)] = AclEntry()
        if entry.loading is None:
            self._refresh([(username, client_id)]).addErrback(lambda _: None)
        return None

    def hold(self, username: str | None, client_id: str | None) -> None:
        """A client connected with these rules: keep them refreshed until ``release``."""
        entry = self._acls.get((username, client_id))
        if entry is None:
            entry = self._acls[(username, client_id)] = AclEntry()
        entry.refs += 1

    def release(self, username: str | None, client_id: str | None) -> None:
        entry = self._acls.get((username, client_id))
        if entry is not None and entry.refs > 0:
            entry.refs -= 1

    def _fresh(self, entry: AclEntry) -> bool:
        return self._clock.seconds() - entry.fetched_at < self.cache_ttl

    def _refresh(self, keys: list) -> defer.Deferred:
        """Read the rules of *keys* in one query; the Deferred fires when they are in (or fails)."""
        asked_at = self._clock.seconds()
        usernames = sorted({u for u, _ in keys if u is not None})
        client_ids = sorted({c for _, c in keys if c is not None})
        d = self._call(_find_acls, self.collection, self.acl_collection, usernames, client_ids)
        entries = []
        for key in keys:
            entry = self._acls.get(key)
            if entry is None:
                entry = self._acls[key] = AclEntry()
            entries.append((key, entry))
            entry.loading = d

        def arrived(result):
            docs, supers, optime = result
            changed = False
            for (username, client_id), entry in entries:
                entry.loading = None
                mine = [doc for doc in docs if (username is not None and doc.get("username") == username)
                        or (client_id is not None and doc.get("clientid") == client_id)]
                rules = rules_from_documents(mine, username, client_id, self._warn)
                superuser = username in supers
                if rules != entry.rules or superuser != entry.superuser or not self._fresh(entry):
                    changed = True
                entry.rules, entry.superuser = rules, superuser
                entry.doc_ids = frozenset(doc.get("_id") for doc in mine)
                entry.fetched_at = max(entry.fetched_at, asked_at)
                entry.optime = optime
            if changed:
                self.generation += 1
            return entries[0][1] if len(entries) == 1 else None

        def failed(failure):
            for _, entry in entries:
                entry.loading = None
            if len(entries) == 1 and self._fresh(entries[0][1]):
                return entries[0][1]  # served from the cache while it is young enough
            return failure

        return d.addCallbacks(arrived, failed)

    def sweep(self) -> None:
        """Refresh held rules past half their TTL; drop unheld ones past it; notice rules that went stale."""
        now = self._clock.seconds()
        due, went_stale = [], False
        for key, entry in list(self._acls.items()):
            age = now - entry.fetched_at
            if entry.refs <= 0 and entry.loading is None and age >= self.cache_ttl:
                del self._acls[key]
                continue
            if entry.refs > 0 and age >= self.cache_ttl:
                went_stale = True  # MongoDB did not answer the refreshes in time
            if entry.refs > 0 and entry.loading is None and age >= self.cache_ttl / 2:
                due.append(key)
        if went_stale:
            self.generation += 1  # checks cached against the old rules must see that they are gone
        for start in range(0, len(due), _BATCH):
            self._refresh(due[start:start + _BATCH]).addErrback(lambda _: None)
        for username, (_, at, _optime) in list(self._users.items()):
            if now - at >= self.cache_ttl:
                del self._users[username]

    # -- change streams -----------------------------------------------------------------------

    def changed(self, change: dict) -> None:
        """A change-stream event of either collection: refetch what it touches, unless the read already saw it."""
        coll = (change.get("ns") or {}).get("coll")
        doc_id = (change.get("documentKey") or {}).get("_id")
        full = change.get("fullDocument") or {}
        when = change.get("clusterTime")
        if coll == self.collection:
            stale = {username for username, (user, _, optime) in self._users.items()
                     if (user.doc_id == doc_id or username == full.get("username")) and not _saw(optime, when)}
            self._refetch_users(stale)
            # The superuser flag lives in the user document: refetch that user's rules too.
            keys = [key for key, entry in self._acls.items()
                    if key[0] is not None and not _saw(entry.optime, when)
                    and (key[0] in stale or key[0] == full.get("username") or entry.superuser)]
        elif coll == self.acl_collection:
            keys = [key for key, entry in self._acls.items()
                    if not _saw(entry.optime, when)
                    and (doc_id in entry.doc_ids
                         or (key[0] is not None and key[0] == full.get("username"))
                         or (key[1] is not None and key[1] == full.get("clientid")))]
        else:
            return
        self._invalidate(keys)

    def _refetch_users(self, usernames) -> None:
        """Stop trusting these cached documents at once and read them again."""
        for username in usernames:
            user, _, optime = self._users[username]
            self._users[username] = (user, -math.inf, optime)
            self.lookup(username).addErrback(lambda _: None)

    def restarted(self, since=None) -> None:
        """A change stream opened that reports the changes after operation time *since* (None: unknown): what was
        read before it may have missed changes, so it is read again."""
        self._refetch_users([username for username, (_, _, optime) in self._users.items()
                             if not _saw(optime, since)])
        self._invalidate([key for key, entry in self._acls.items() if not _saw(entry.optime, since)])

    def _invalidate(self, keys: list) -> None:
        if not keys:
            return
        for key in keys:
            self._acls[key].fetched_at = -math.inf
        self.generation += 1
        # Every one, held or not: an event may arrive just after the read it is already part of, and a client
        # that reconnects during an outage needs rules younger than the TTL.
        for start in range(0, len(keys), _BATCH):
            self._refresh(keys[start:start + _BATCH]).addErrback(lambda _: None)

    def _warn(self, doc_id, why: str) -> None:
        key = (repr(doc_id), why)
        if key in self._warned:
            return
        if len(self._warned) >= _WARNED_MAX:
            self._warned.clear()
        self._warned.add(key)
        _log.warn("mqtt.auth.mongodb.bad_document id={doc_id!r} reason={why}", doc_id=doc_id, why=why)
