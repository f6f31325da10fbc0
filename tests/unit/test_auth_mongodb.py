"""MongoDB users and ACL rules (mqtt_proxy.auth.mongodb, .chain) without a server: placeholders, the merge of
sources, caching on a task.Clock, change-stream invalidation, and "server unavailable" that is no failed login."""

from __future__ import annotations

import pytest
from twisted.internet import defer, task

from mqtt_proxy.auth.acl import ACL
from mqtt_proxy.auth.authenticator import BAD_CREDENTIALS, OK, SERVER_UNAVAILABLE, Authenticator
from mqtt_proxy.auth.chain import (MATCH, MISMATCH, UNAVAILABLE, UNKNOWN, ChainACL, FileSource, MongoSource,
                                   PasswordChain)
from mqtt_proxy.auth.mongodb import MongoUserSource, rules_from_documents
from mqtt_proxy.auth.passwords import PasswordFile, hash_password
from store.executor import SynchronousExecutor

PW = "pa55-W0rd"
HASH = hash_password(PW, log_n=4)


class FakeDatabase:
    """Collections as lists of dicts, answering the few queries the source makes (``find_one``/``find``)."""

    def __init__(self):
        self.collections = {"mqtt_user": [], "mqtt_acl": []}
        self.client = self
        self.down = False
        self.calls = 0

    # -- the pymongo surface the source's functions use
    def __getitem__(self, name):
        return _Collection(self, name)

    def start_session(self, causal_consistency=False):
        return _Session()

    def call(self, fn, *args):
        """The MongoPool.call interface, run at once (a SynchronousExecutor for MongoDB)."""
        self.calls += 1
        if self.down:
            return defer.fail(ConnectionError("down"))
        return defer.maybeDeferred(fn, self, *args)


class _Session:
    operation_time = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _matches(doc, query):
    for key, cond in query.items():
        if key == "$or":
            if not any(_matches(doc, q) for q in cond):
                return False
        elif isinstance(cond, dict) and "$in" in cond:
            if doc.get(key) not in cond["$in"]:
                return False
        elif doc.get(key) != cond:
            return False
    return True


class _Collection:
    def __init__(self, db, name):
        self.docs = db.collections.setdefault(name, [])

    def find_one(self, query, projection=None, session=None):
        return next((dict(d) for d in self.docs if _matches(d, query)), None)

    def find(self, query, projection=None, session=None):
        return [dict(d) for d in self.docs if _matches(d, query)]


def result_of(d):
    box = []
    d.addBoth(box.append)
    assert box, "Deferred has not fired"
    return box[0]


@pytest.fixture
def world():
    db, clock = FakeDatabase(), task.Clock()
    db.collections["mqtt_user"].append({"_id": 1, "username": "dev", "password_hash": HASH})
    db.collections["mqtt_user"].append({"_id": 2, "username": "root", "password_hash": HASH, "is_superuser": True})
    source = MongoUserSource(db.call, clock, cache_ttl=10.0)
    return db, clock, source


def test_placeholders_are_substituted_and_unusable_values_void_the_rule():
    """${username}/${clientid} take the client's values; an empty value or one holding / + # voids the rule."""
    docs = [{"permission": "allow", "action": "all", "topics": ["d/${username}/#", "c/${clientid}"]}]
    assert [r.topic_filter for r in rules_from_documents(docs, "u1", "c1")] == ["d/u1/#", "c/c1"]
    assert [r.topic_filter for r in rules_from_documents(docs, None, "c1")] == ["c/c1"]
    assert rules_from_documents(docs, "a/b", "+") == ()


def test_malformed_documents_are_skipped_with_a_warning():
    """A document with an unknown permission or action, topics that are no list, or an invalid filter is skipped."""
    warned = []
    docs = [{"_id": 1, "permission": "maybe", "action": "all", "topics": ["a"]},
            {"_id": 2, "permission": "allow", "action": "read", "topics": ["a"]},
            {"_id": 3, "permission": "allow", "action": "all", "topics": "a"},
            {"_id": 4, "permission": "allow", "action": "all", "topics": ["a/#/b", "ok"]}]
    rules = rules_from_documents(docs, "u", "c", lambda doc_id, why: warned.append(doc_id))
    assert [r.topic_filter for r in rules] == ["ok"] and warned == [1, 2, 3, 4]


def test_deny_from_any_source_wins_then_allow_then_nomatch(world):
    """The file's grant and MongoDB's deny: deny wins; a MongoDB allow covers what the file does not grant; the
    rest gets acl_nomatch; a subscribe to a filter a read deny overlaps is refused."""
    db, clock, source = world
    db.collections["mqtt_acl"] += [
        {"_id": 10, "username": "dev", "permission": "deny", "action": "publish", "topics": ["shared/locked"]},
        {"_id": 11, "username": "dev", "permission": "allow", "action": "subscribe", "topics": ["m/#"]},
        {"_id": 12, "username": "dev", "permission": "deny", "action": "subscribe", "topics": ["m/private/#"]}]
    file_acl = ACL.parse("user dev\ntopic readwrite shared/#\n")
    for nomatch in (False, True):
        acl = ChainACL(file_acl, source, nomatch=nomatch)
        result_of(acl.load("dev", "c1"))
        assert acl.allowed("dev", "c1", "shared/open", "write")
        assert not acl.allowed("dev", "c1", "shared/locked", "write")
        assert acl.allowed("dev", "c1", "shared/locked", "read")  # the deny is for publish only
        assert not acl.can_subscribe("dev", "c1", "m/+/x")  # m/private/x: a read deny overlaps it
        assert acl.can_subscribe("dev", "c1", "n/x") is nomatch
        assert not acl.can_subscribe("dev", "c1", "m/private/a")
        assert acl.can_subscribe("dev", "c1", "m/public/#")
        assert acl.allowed("dev", "c1", "elsewhere", "write") is nomatch


def test_superuser_bypasses_every_rule(world):
    """is_superuser: every publish and subscribe is allowed, even one a deny rule names."""
    db, clock, source = world
    db.collections["mqtt_acl"].append({"_id": 10, "username": "root", "permission": "deny", "action": "all",
                                       "topics": ["#"]})
    acl = ChainACL(None, source)
    result_of(acl.load("root", "c1"))
    assert acl.allowed("root", "c1", "x/y", "write") and acl.can_subscribe("root", "c1", "#")


def test_rules_older_than_the_ttl_deny_until_refreshed(world):
    """Held rules are refreshed in the background; with MongoDB down past cache_ttl they are gone: deny."""
    db, clock, source = world
    db.collections["mqtt_acl"].append({"_id": 10, "username": "dev", "permission": "allow", "action": "all",
                                       "topics": ["a"]})
    acl = ChainACL(None, source)
    source.start()
    result_of(acl.load("dev", "c1"))
    acl.hold("dev", "c1")
    calls = db.calls
    clock.advance(6)  # past half the TTL: the sweep refreshes it
    assert db.calls > calls and acl.allowed("dev", "c1", "a", "write")
    db.down = True
    generation = acl.generation
    clock.advance(12)
    assert not acl.allowed("dev", "c1", "a", "write") and acl.generation != generation
    db.down = False
    clock.advance(3)
    assert acl.allowed("dev", "c1", "a", "write")
    source.stop()


def test_user_document_cached_for_the_ttl_and_served_while_mongodb_is_down(world):
    """A looked-up user is served from the cache (no query) within cache_ttl, also while MongoDB is down; past it
    the lookup fails (unavailable); an unknown user is not cached."""
    db, clock, source = world
    assert result_of(source.lookup("dev")).username == "dev"
    calls = db.calls
    db.down = True
    assert result_of(source.lookup("dev")).username == "dev" and db.calls == calls
    clock.advance(10)
    failure = result_of(source.lookup("dev"))
    failure.trap(ConnectionError)
    db.down = False
    assert result_of(source.lookup("nobody")) is None
    db.collections["mqtt_user"].append({"_id": 3, "username": "nobody", "password_hash": HASH})
    assert result_of(source.lookup("nobody")).username == "nobody"


def test_change_event_drops_the_user_and_refetches_touched_rules(world):
    """A delete event for a cached user makes the next lookup ask MongoDB; an ACL event refetches the rules of
    the clients it touches (found by the document's _id for a delete)."""
    db, clock, source = world
    db.collections["mqtt_acl"].append({"_id": 10, "username": "dev", "permission": "allow", "action": "all",
                                       "topics": ["a"]})
    acl = ChainACL(None, source)
    result_of(source.lookup("dev"))
    result_of(acl.load("dev", "c1"))
    acl.hold("dev", "c1")
    del db.collections["mqtt_user"][0]
    source.changed({"operationType": "delete", "ns": {"coll": "mqtt_user"}, "documentKey": {"_id": 1}})
    assert result_of(source.lookup("dev")) is None
    db.collections["mqtt_acl"].clear()
    source.changed({"operationType": "delete", "ns": {"coll": "mqtt_acl"}, "documentKey": {"_id": 10}})
    assert not acl.allowed("dev", "c1", "a", "write")


def test_chain_asks_sources_in_order_and_unavailable_is_not_bad_credentials(world):
    """The first source that knows the user decides; nobody knowing it is a mismatch; a source that could not be
    asked (and nobody deciding) makes the answer UNAVAILABLE."""
    db, clock, source = world
    executor = SynchronousExecutor()
    table = PasswordFile()
    table.add("filer", PW, log_n=4)
    chain = PasswordChain([FileSource(lambda: table, executor), MongoSource(source, executor)], executor)
    assert result_of(chain.check("filer", PW)) == MATCH
    assert result_of(chain.check("dev", PW)) == MATCH
    assert result_of(chain.check("dev", "wrong")) == MISMATCH
    assert result_of(chain.check("nobody", PW)) == MISMATCH
    db.down = True
    assert result_of(chain.check("filer", PW)) == MATCH  # decided before MongoDB is asked
    assert result_of(chain.check("stranger", PW)) == UNAVAILABLE
    assert result_of(MongoSource(source, executor).check("stranger", PW)) == UNAVAILABLE
    assert result_of(FileSource(lambda: None, executor).check("x", PW)) == UNKNOWN


def test_server_unavailable_is_no_failed_login(world):
    """CONNACK 0x88 / 3 when MongoDB cannot answer; no delay and no failure counted, so the next good login is
    answered at once."""
    db, clock, source = world
    executor = SynchronousExecutor()
    auth = Authenticator(None, False, clock, executor, base_delay=1.0,
                         chain=PasswordChain([MongoSource(source, executor)], executor))
    db.down = True
    result = result_of(auth.authenticate("dev", PW, "c1", "10.0.0.1"))
    assert (result.ok, result.reason, result.v5_reason_code, result.v3_return_code) == \
        (False, SERVER_UNAVAILABLE, 0x88, 3)
    assert auth.delay_for("10.0.0.1", "dev") == 0
    db.down = False
    assert result_of(auth.authenticate("dev", PW, "c1", "10.0.0.1")).reason == OK
    d = auth.authenticate("dev", "wrong", "c1", "10.0.0.1")
    assert auth.delay_for("10.0.0.1", "dev") > 0  # a real failed login is counted
    clock.advance(1.0)
    assert result_of(d).reason == BAD_CREDENTIALS
