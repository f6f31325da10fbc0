"""Who a session belongs to, stored with it; the per-session read check delivery asks, refreshed by a reload."""

from __future__ import annotations

import json

from twisted.internet import task

from cluster.local_sessions import LocalSessions
from cluster.session_store import SessionStore
from mqtt_proxy.auth.acl import ACL, ReadCheck
from mqtt_proxy.sessions import ANONYMOUS, identity_of
from store import api
from store.kv import DurableKV


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
