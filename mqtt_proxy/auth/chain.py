"""The ``[auth] backends`` chain: password sources asked in order, and ACL rules merged from every source.

Authentication (``PasswordChain``): each source answers a CONNECT's username with
``MATCH``, ``MISMATCH``, ``UNKNOWN`` (no such user here: ask the next source) or
``UNAVAILABLE`` (could not ask: MongoDB down and nothing cached). The first source
that knows the user decides. No source knowing it is bad credentials; but when
one could not be asked, nobody can say: ``SERVER_UNAVAILABLE`` (CONNACK 0x88 / 3),
which is not counted as a failed login.

ACL (``ChainACL``, the ``ACL`` interface the broker checks): a deny rule from any
source wins, then an allow rule from any source, then ``[auth] acl_nomatch``. The
file's rules are ``mqtt_proxy.auth.acl``'s (its ``deny`` denies both reading and
writing); MongoDB's come from ``MongoUserSource.rules``, and when those are not
fresh (MongoDB down past ``cache_ttl``, or a change being fetched) the client is
denied everything until they are. A MongoDB superuser bypasses every rule.
``subscribe`` in a MongoDB document is the file's ``read``: checked at SUBSCRIBE
and at every delivery.
"""

from __future__ import annotations

from typing import Any, Callable

from twisted.internet import defer

from lightqueue.topic import filter_matches
from mqtt_proxy.auth.acl import ACL, READ, WRITE, filter_covers, filters_overlap
from mqtt_proxy.auth.hashes import burn
from mqtt_proxy.auth.mongodb import MongoUserSource, SourceRule
from mqtt_proxy.auth.passwords import verify_password

__all__ = ["ChainACL", "ChainClientACL", "FileSource", "MATCH", "MISMATCH", "MongoSource", "PasswordChain",
           "UNAVAILABLE", "UNKNOWN"]

MATCH, MISMATCH, UNKNOWN, UNAVAILABLE = "match", "mismatch", "unknown", "unavailable"
_BOTH = frozenset({READ, WRITE})


class FileSource:
    """The password file as a chain source; *passwords* returns the current table (it is swapped on SIGHUP)."""

    name = "file"

    def __init__(self, passwords: Callable[[], Any], executor) -> None:
        self._passwords = passwords
        self._executor = executor

    def check(self, username: str, password: str) -> defer.Deferred:
        table = self._passwords()
        if table is None or username not in table:
            return defer.succeed(UNKNOWN)
        return self._executor.submit(table.verify, username, password).addCallback(
            lambda ok: MATCH if ok else MISMATCH)


class MongoSource:
    """MongoDB's users as a chain source: the cached document's hash is verified on the executor every time."""

    name = "mongodb"

    def __init__(self, users: MongoUserSource, executor) -> None:
        self.users = users
        self._executor = executor

    def check(self, username: str, password: str) -> defer.Deferred:
        d = self.users.lookup(username)

        def verify(user):
            if user is None:
                return UNKNOWN
            if not user.password_hash:
                return MISMATCH  # a malformed hash matches nothing (logged when read)
            return self._executor.submit(verify_password, password, user.password_hash).addCallback(
                lambda ok: MATCH if ok else MISMATCH)

        return d.addCallbacks(verify, lambda _failure: UNAVAILABLE)


class PasswordChain:
    """The sources in ``[auth] backends`` order; ``check`` gives the chain's verdict."""

    def __init__(self, sources: list, executor) -> None:
        self.sources = list(sources)
        self._executor = executor

    @defer.inlineCallbacks
    def check(self, username: str, password: str):
        unavailable = False
        for source in self.sources:
            verdict = yield source.check(username, password)
            if verdict in (MATCH, MISMATCH):
                return verdict
            unavailable = unavailable or verdict == UNAVAILABLE
        if unavailable:
            return UNAVAILABLE
        yield self._executor.submit(burn, password)  # an unknown user costs what a known one does
        return MISMATCH


class ChainClientACL:
    """The merged rules of one client: deny from any source, then allow, then the no-match answer."""

    __slots__ = ("_allows", "_denies", "_nomatch")

    def __init__(self, rules, nomatch: bool) -> None:
        self._allows = [r for r in rules if not r.deny]
        self._denies = [r for r in rules if r.deny]
        self._nomatch = nomatch

    def _decide(self, topic: str, access: str) -> bool:
        if any(access in r.access and filter_matches(r.topic_filter, topic) for r in self._denies):
            return False
        if any(access in r.access and filter_matches(r.topic_filter, topic) for r in self._allows):
            return True
        return self._nomatch

    def can_publish(self, topic: str) -> bool:
        return self._decide(topic, WRITE)

    def can_read(self, topic: str) -> bool:
        return self._decide(topic, READ)

    def can_subscribe(self, topic_filter: str) -> bool:
        """As the file ACL's rule: no read deny may overlap the filter, and a read grant must cover it (else
        the no-match answer)."""
        if any(READ in r.access and filters_overlap(r.topic_filter, topic_filter) for r in self._denies):
            return False
        if any(READ in r.access and filter_covers(r.topic_filter, topic_filter) for r in self._allows):
            return True
        return self._nomatch


_ALLOW_ALL = ChainClientACL((), True)
_DENY_ALL = ChainClientACL((), False)


class ChainACL:
    """The ``ACL`` interface over the file's rules and MongoDB's (see the module docstring)."""

    configured = True
    path = None

    def __init__(self, file_acl: ACL | None, mongo: MongoUserSource | None, nomatch: bool = False) -> None:
        self.file_acl = file_acl if file_acl is not None else ACL.allow_all()
        """The ACL file's rules (``allow_all()`` when none): SIGHUP reloads it in place."""
        self.mongo = mongo
        self.nomatch = nomatch
        self._resolved: dict[tuple, ChainClientACL] = {}
        self._generation = -1

    @property
    def generation(self) -> int:
        """Grows whenever any source's rules may have changed (both counters only grow)."""
        return self.file_acl.generation + (self.mongo.generation if self.mongo is not None else 0)

    def for_client(self, username: str | None, client_id: str | None) -> ChainClientACL:
        generation = self.generation
        if generation != self._generation:
            self._resolved.clear()
            self._generation = generation
        entry = None
        if self.mongo is not None:
            entry = self.mongo.rules(username, client_id)
            if entry is None:
                return _DENY_ALL  # MongoDB's rules are unknown right now: whatever they say could deny
            if entry.superuser:
                return _ALLOW_ALL
        key = (username, client_id)
        client = self._resolved.get(key)
        if client is None:
            rules = list(entry.rules) if entry is not None else []
            if self.file_acl.configured:
                rules += [SourceRule(r.topic_filter, _BOTH if r.deny else r.access, r.deny)
                          for r in self.file_acl.rules_for(username, client_id)]
            if len(self._resolved) >= 4096:
                self._resolved.clear()
            client = self._resolved[key] = ChainClientACL(rules, self.nomatch)
        return client

    def allowed(self, username: str | None, client_id: str | None, topic: str, access: str) -> bool:
        if access not in (READ, WRITE):
            raise ValueError(f"access must be 'read' or 'write', not {access!r}")
        client = self.for_client(username, client_id)
        return client.can_read(topic) if access == READ else client.can_publish(topic)

    def can_subscribe(self, username: str | None, client_id: str | None, topic_filter: str) -> bool:
        return self.for_client(username, client_id).can_subscribe(topic_filter)

    def load(self, username: str | None, client_id: str | None) -> defer.Deferred:
        """Read a connecting client's MongoDB rules (fails when MongoDB cannot answer and none are fresh)."""
        return self.mongo.load_acl(username, client_id) if self.mongo is not None else defer.succeed(None)

    def hold(self, username: str | None, client_id: str | None) -> None:
        if self.mongo is not None:
            self.mongo.hold(username, client_id)

    def release(self, username: str | None, client_id: str | None) -> None:
        if self.mongo is not None:
            self.mongo.release(username, client_id)

    def stats(self) -> dict[str, int]:
        return self.file_acl.stats() if self.file_acl.configured else {}

    def __repr__(self) -> str:
        return f"<ChainACL file={self.file_acl!r} mongodb={self.mongo is not None}>"
