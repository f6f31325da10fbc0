"""Who a session belongs to, stored with it; the per-session read check delivery asks, refreshed by a reload."""

from __future__ import annotations

import json

from twisted.internet import defer, task

from cluster.local.sessions import LocalSessions
from store.session_store import SessionStore
from mqtt_proxy.auth.acl import ACL, ReadCheck
from mqtt_proxy.codec import PubAck, Publish, Subscribe, Subscription, SubscriptionOptions
from mqtt_proxy.config import LimitsConfig, MQTTConfig
from mqtt_proxy.front_end import build_front_end
from mqtt_proxy.protocol import MQTTServerFactory
from mqtt_proxy.sessions import ANONYMOUS, identity_of
from store import api
from store.kv import DurableKV
from tests.unit.test_mqtt_broker import Harness


def test_owner_is_stored_and_old_sessions_have_none(tmp_path):
    """put_session keeps the owner across a reopen; a session written without one (older data) reads as None."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    sessions = LocalSessions(SessionStore(kv), "g1")
    epoch = []
    sessions.claim_session("c1", "node").addCallback(epoch.append)
    clock.advance(0)
    sessions.put_session(api.SessionMeta("c1", 60, 5, None, "user:alice"), epoch[0])
    kv.put(b"s/legacy", json.dumps({"expiry": 60, "level": 4, "disc": None}).encode())  # the old layout
    clock.advance(0)
    kv.close()
    reopened = LocalSessions(SessionStore(DurableKV(str(tmp_path), clock)), "g1")
    got = {}
    for cid in ("c1", "legacy"):
        reopened.get_session(cid).addCallback(lambda s, cid=cid: got.__setitem__(cid, s.meta.owner))
    assert got == {"c1": "user:alice", "legacy": None}


def test_identity_of():
    """A verified username wins, then the certificate, else anonymous; an unverified name is no identity."""
    assert identity_of("alice", "CN=dev-1") == "user:alice"
    assert identity_of(None, "CN=dev-1") == "cert:CN=dev-1"
    assert identity_of(None, None) == ANONYMOUS


def test_read_check_follows_reloads(tmp_path):
    """A filter wholly readable needs no per-message check; after a reload the cached verdicts are dropped."""
    path = tmp_path / "acl"
    path.write_text("user alice\ntopic read news/#\ntopic read alice/#\n")
    acl = ACL.load(str(path))
    check = ReadCheck(acl, "alice", "c1")
    assert check.whole("news/#") and check.can_read("news/a")
    path.write_text("user alice\ntopic read alice/#\ntopic read news/public/#\n")
    acl.reload()
    assert not check.whole("news/#")
    assert not check.can_read("news/a") and check.can_read("news/public/x")
    assert check.whole("alice/#")


def test_read_check_topic_cache_is_bounded():
    """Per-topic verdicts are kept for a bounded number of topics."""
    acl = ACL.parse("user u\ntopic read a/#\n")
    check = ReadCheck(acl, "u", "c")
    for index in range(5000):
        assert check.can_read(f"a/{index}")
    assert len(check._topics) <= 1024


def test_resend_and_delivery_follow_an_acl_reload(tmp_path):
    """A message in flight when the ACL stopped granting its topic is not resent on return, nor is a new one."""
    path = tmp_path / "acl"
    path.write_text("topic readwrite news/#\ntopic readwrite other/#\n")  # for anonymous clients
    acl = ACL.load(str(path))
    h = Harness(tmp_path / "node")
    h.broker = build_front_end(h.local, h.clock, MQTTConfig(sys_interval=0), LimitsConfig(), None, acl)
    h.factory = MQTTServerFactory(h.broker, h.clock)
    try:
        reader = h.connect("reader", level=4, clean_start=False)
        reader.send(Subscribe(1, (Subscription("news/#", SubscriptionOptions(qos=1)),
                                  Subscription("other/#", SubscriptionOptions(qos=1)))))
        writer = h.connect("writer", level=4)
        writer.send(Publish("news/a", b"in flight", qos=1, packet_id=1))
        h.tick()
        assert [p.payload for p in reader.received() if isinstance(p, Publish)] == [b"in flight"]
        reader.lose()  # without acknowledging it
        path.write_text("topic write news/#\ntopic readwrite other/#\n")  # news/ no longer readable
        acl.reload()
        writer.send(Publish("news/b", b"after the reload", qos=1, packet_id=2))
        writer.send(Publish("other/c", b"still readable", qos=1, packet_id=3))
        back = h.connect("reader", level=4, clean_start=False)
        h.tick()
        got = [p.payload for p in back.received() if isinstance(p, Publish)]
        assert got == [b"still readable"]
        assert h.broker.stats.messages_denied == 2
        assert [p.reason_code for p in writer.received() if isinstance(p, PubAck)] == [0, 0, 0]
    finally:
        h.close()


def test_a_reload_takes_the_claims_and_epoch_mark_that_replication_wrote(tmp_path):
    """A slave's claims, read once, go stale as its KV follows the master's: after reload (on becoming master) the
    replicated claim's writes pass and the next claim's epoch is above every epoch the old master handed out."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    replica = LocalSessions(SessionStore(kv), "g1")
    assert replica.claims == {}  # read while a slave
    old_master = LocalSessions(SessionStore(kv), "g1")  # what replication writes into the same KV
    epoch = []
    old_master.claim_session("c1", "proxy-1").addCallback(epoch.append)
    clock.advance(0)
    failed = []
    defer.maybeDeferred(replica.put_session, api.SessionMeta("c1", 60, 5, None), epoch[0]).addErrback(failed.append)
    assert failed and "never claimed" in failed[0].getErrorMessage()
    replica.reload()
    done = []
    replica.put_session(api.SessionMeta("c1", 60, 5, None), epoch[0]).addCallback(done.append)
    clock.advance(0)
    assert done
    fresh = []
    replica.claim_session("c2", "proxy-1").addCallback(fresh.append)
    clock.advance(0)
    assert fresh[0] > epoch[0]
