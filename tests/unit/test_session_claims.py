"""Session claims are bounded: one epoch counter per broker group, claims forgotten when their session ends.

Over real stores (RocksDB in a tmp dir) on a task.Clock: the MQTT front end
connecting and leaving, ``LocalStore`` reopened on the same KV as after a
restart, and ``RoutedStore`` over two groups, one of them unreachable.
"""

from __future__ import annotations

import pytest
from twisted.internet import task

from cluster.local import sessions as local_sessions
from cluster.remote.routed_store import RoutedStore
from cluster.routing import SlotTable
from mqtt_proxy.codec import (
    ConnAck,
    Disconnect,
    Properties,
    ReasonCode,
    Subscribe,
    Subscription,
)
from mqtt_proxy.codec.packets import SubAck
from store import api
from store.kv import DurableKV
from store.session_store import SessionStore
from tests.contract.conftest import T0, Harness, Parts
from tests.unit.test_mqtt_broker import Harness as FrontEnd

N = 200


def _claim_keys(kv: DurableKV) -> list[bytes]:
    return [k for k, _ in kv.scan(b"e/")]


@pytest.fixture
def front(tmp_path):
    harness = FrontEnd(tmp_path)
    yield harness
    harness.close()


# -- through the MQTT front end ------------------------------------------------------------------------------

def test_churn_of_clean_client_ids_leaves_no_claims_in_memory_or_rocksdb(tmp_path):
    """N clean clients with random ids connect and leave (DISCONNECT, v3 or a lost link): no claim is left."""
    front = FrontEnd(tmp_path)
    for n in range(N):
        cid = f"dev-{n:04d}"
        conn = front.connect(cid, level=4 if n % 2 else 5, clean_start=True)
        assert isinstance(conn.received()[0], ConnAck)
        if n % 3:
            conn.send(Disconnect())
        else:
            conn.lose()
    front.tick()
    assert front.broker.sessions == {}
    assert front.local.claims == 0
    assert _claim_keys(front.kv) == []
    front.close()
    kv = DurableKV(str(tmp_path / "sessions"), task.Clock())  # what RocksDB itself holds
    try:
        assert _claim_keys(kv) == [] and SessionStore(kv).load_epoch_mark() >= N
    finally:
        kv.close()


def test_a_persistent_session_keeps_its_claim_until_it_expires(front):
    """A stored session's claim outlives its connection (it fences older holders) and goes with its expiry."""
    conn = front.connect("keeper", properties=Properties(session_expiry_interval=10))
    conn.send(Subscribe(1, (Subscription("k/x"),)))
    conn.lose()
    assert front.local.claims == 1
    front.tick(11)
    assert "keeper" not in front.broker.sessions
    assert front.local.claims == 0 and _claim_keys(front.kv) == []


def test_a_takeover_on_the_same_proxy_keeps_the_new_connections_claim(front):
    """The old link's end does not release the claim the new CONNECT just made: its writes still pass."""
    first = front.connect("twin")
    first.received()
    second = front.connect("twin", properties=Properties(session_expiry_interval=60))
    assert isinstance(second.received()[0], ConnAck)
    second.send(Subscribe(1, (Subscription("twin/x"),)))
    (suback,) = second.received()
    assert isinstance(suback, SubAck) and suback.reason_codes == (ReasonCode.GRANTED_QOS_0,)
    assert not second.transport.disconnecting
    assert front.local.claims == 1


def test_a_clean_start_over_a_stored_session_keeps_its_claim(front):
    """Clean start ends the stored session but not the claim of the CONNECT that ended it."""
    persist = Properties(session_expiry_interval=60)
    front.connect("again", properties=persist).send(Disconnect())
    conn = front.connect("again", clean_start=True, properties=persist)
    assert conn.received()[0].session_present is False
    conn.send(Subscribe(1, (Subscription("again/x"),)))
    assert isinstance(conn.received()[0], SubAck) and not conn.transport.disconnecting
    conn.send(Disconnect(properties=Properties(session_expiry_interval=0)))
    assert front.local.claims == 0


# -- a node: the front end in the store's own process -------------------------------------------------------------

def _records(front) -> int:
    return front.session_log.appended


def test_a_nodes_clean_sessions_cost_no_session_record_from_connect_to_their_end(tmp_path):
    """On a node (its front end the store's own holder), clean sessions without a will write nothing to the log
    from CONNECT to their end, and a second CONNECT of an id still takes the first link over."""
    front = FrontEnd(tmp_path, own_holder="node")
    try:
        front.connect("warm-up", clean_start=True).lose()  # the first claim writes the epoch mark's block
        front.tick()
        before = _records(front)
        for n in range(20):
            conn = front.connect(f"dev-{n}", level=4 if n % 2 else 5, clean_start=True)
            assert conn.received()[0].reason_code == ReasonCode.SUCCESS
            conn.send(Disconnect()) if n % 3 else conn.lose()
        first = front.connect("twin", clean_start=True)
        first.received()
        second = front.connect("twin", clean_start=True)
        assert isinstance(second.received()[0], ConnAck)
        assert first.transport.disconnecting and not second.transport.disconnecting  # MQTT-3.1.4-3
        front.tick()
        assert _records(front) == before
        assert front.local.claims == 1 and _claim_keys(front.kv) == []
        second.lose()
        front.tick()
        assert front.local.claims == 0 and _records(front) == before
    finally:
        front.close()


def test_a_nodes_claim_is_written_before_its_sessions_first_write(tmp_path):
    """A persistent session on a node stores its claim ahead of its meta: both are in the log, in that order."""
    front = FrontEnd(tmp_path, own_holder="node")
    try:
        conn = front.connect("keeper", properties=Properties(session_expiry_interval=60))
        assert isinstance(conn.received()[0], ConnAck)
        front.tick()
        keys = [k for k, _ in front.kv.scan(b"")]
        assert b"e/keeper" in keys and b"s/keeper" in keys
        wheres = {k: v for k, v in front.kv.scan(b"\x01w/")}
        assert wheres[b"\x01w/e/keeper"] < wheres[b"\x01w/s/keeper"]  # the claim's record comes first
        epoch = front.local.session_claims.claims["keeper"][1]
        assert SessionStore(front.kv).load_claims()["keeper"] == ("node", epoch)
    finally:
        front.close()


# -- one broker group: the epoch counter -------------------------------------------------------------------------

class Group:
    """A LocalStore on Parts in ``path``; ``reopen`` closes and opens them again as a broker restart does."""

    def __init__(self, path, own_holder: str = "") -> None:
        self.path = str(path)
        self.own_holder = own_holder
        self.clock = task.Clock()
        self.clock.advance(T0)
        self._open()

    def _open(self) -> None:
        self.parts = Parts(self.path, self.clock)
        self.h = Harness(self.parts.local(self.own_holder), self.clock, self.parts)

    def reopen(self) -> None:
        self.parts.close(self.clock)
        self._open()

    def claim(self, cid: str, holder: str = "proxy-1") -> int:
        return self.h.wait(self.h.store.claim_session(cid, holder))

    def write(self, cid: str, epoch: int):
        return self.h.store.put_session(api.SessionMeta(cid, 60, 5, None), epoch)

    def mark(self) -> int:
        return SessionStore(self.parts.kv).load_epoch_mark()


@pytest.fixture
def group(tmp_path):
    g = Group(tmp_path)
    yield g
    g.parts.close(g.clock)


def test_a_stale_holder_from_before_a_forget_is_still_fenced(group):
    """Released and forgotten, then claimed again elsewhere or not at all: the old epoch stays fenced."""
    old = group.claim("c1")
    group.h.wait(group.h.store.release_session("c1", old))
    assert group.h.store.claims == 0
    assert isinstance(group.h.error(group.write("c1", old)), api.Fenced)
    group.reopen()
    assert isinstance(group.h.error(group.write("c1", old)), api.Fenced)
    new = group.claim("c1", "proxy-2")
    assert new > old
    assert isinstance(group.h.error(group.write("c1", old)), api.Fenced)
    group.h.wait(group.write("c1", new))


def test_the_epoch_counter_survives_a_restart_and_never_goes_back(group, monkeypatch):
    """Epochs grow across ids and restarts (even with every claim forgotten); the mark is written per block."""
    monkeypatch.setattr(local_sessions, "EPOCH_BLOCK", 4)
    epochs = [group.claim(f"c{n}") for n in range(6)]
    assert epochs == sorted(epochs) and len(set(epochs)) == 6
    assert group.mark() == 8  # two blocks of 4 for 6 claims: two writes of the mark, not six
    for n, e in enumerate(epochs):
        group.h.wait(group.h.store.release_session(f"c{n}", e))
    assert _claim_keys(group.parts.kv) == []
    group.reopen()
    after = group.claim("c0")
    assert after > 8 >= max(epochs)
    mark = group.mark()
    group.reopen()  # a restart in the middle of a block skips the rest of it
    assert group.claim("c1") > mark > after


def test_a_store_from_before_the_mark_resumes_above_its_claims(group):
    """A data dir with claims but no mark (an older version) hands out epochs above its highest claim."""
    SessionStore(group.parts.kv).save_claim("legacy", "proxy-9", 41)
    group.clock.advance(0)
    group.reopen()
    assert group.claim("new") > 41
    assert isinstance(group.h.error(group.write("legacy", 40)), api.Fenced)


def test_a_release_keeps_a_stored_session_and_ignores_an_old_epoch(group):
    """A claim is kept while its session is stored, and a release by a holder taken over changes nothing."""
    e = group.claim("kept")
    group.h.wait(group.write("kept", e))
    group.h.wait(group.h.store.release_session("kept", e))
    assert group.h.wait(group.h.store.get_session("kept")).epoch == e
    new = group.claim("kept", "proxy-2")
    group.h.wait(group.h.store.delete_session("kept", new))
    group.h.wait(group.h.store.release_session("kept", e))  # the old holder lets go late: not its claim
    assert group.h.store.claims == 1
    group.h.wait(group.h.store.release_session("kept", new))
    assert group.h.store.claims == 0 and _claim_keys(group.parts.kv) == []


# -- two groups behind a proxy's RoutedStore ----------------------------------------------------------------------

CALL_TIMEOUT = 5.0


class Unreachable:
    """A broker group that is down, as a RemoteStore sees it: every call fails with Unavailable after
    the call timeout."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            self.calls.append(name)

            def late():
                raise api.Unavailable(f"broker unreachable for {CALL_TIMEOUT:g} s")
            return task.deferLater(self.clock, CALL_TIMEOUT, late)
        return call


@pytest.fixture
def two(tmp_path):
    clock = task.Clock()
    clock.advance(T0)
    parts = {g: Parts(str(tmp_path / g), clock) for g in ("g1", "g2")}
    groups = {g: p.local() for g, p in parts.items()}
    h = Harness(RoutedStore(SlotTable.build(("g1", "g2")), groups), clock, None)
    h.groups = groups
    yield h
    for p in parts.values():
        p.close(clock)


def _homed(table: SlotTable, group: str, prefix: str) -> str:
    return next(f"{prefix}-{n}" for n in range(1000) if table.group_of_client(f"{prefix}-{n}") == group)


def test_proxy_churn_leaves_no_claims_on_either_side(two):
    """N ids claimed and released through a RoutedStore: its per-client map and both groups' claims are empty."""
    store = two.store
    for n in range(N):
        cid = f"dev-{n}"
        epoch = two.wait(store.claim_session(cid, "proxy-1"))
        assert store.claims == 1
        two.wait(store.release_session(cid, epoch))
    assert store.claims == 0
    assert [g.claims for g in two.groups.values()] == [0, 0]


def test_a_group_down_costs_a_fresh_session_one_call_timeout_at_its_first_write_there(two):
    """With g1 unreachable a fresh g2 client's CONNECT claims in g2 alone; its first meta write waits one call
    timeout for g1's claim, later writes wait for none; a client whose session lives in g1 is refused."""
    store, clock = two.store, two.clock
    store.groups["g1"] = down = Unreachable(clock)
    cid = _homed(store.table, "g2", "dev")
    epoch = two.wait(store.claim_session(cid, "proxy-1"))
    assert down.calls == [] and two.wait(store.get_session(cid)) is None
    written = []
    store.put_session(api.SessionMeta(cid, 60, 5, None), epoch).addCallback(written.append)
    clock.advance(CALL_TIMEOUT)
    assert written == [None] and down.calls == ["claim_session", "put_session"]  # the meta is still offered to g1
    two.wait(store.put_session(api.SessionMeta(cid, 90, 5, None), epoch))  # not waited for: g1 was missed
    assert down.calls == ["claim_session", "put_session", "put_session"]
    assert two.wait(store.get_session(cid)).meta.expiry_s == 90
    refused = []
    store.claim_session(_homed(store.table, "g1", "dev"), "proxy-1").addErrback(refused.append)
    clock.advance(CALL_TIMEOUT)
    assert refused and refused[0].check(api.Unavailable)
    clock.advance(0)
    assert two.groups["g2"].claims == 1  # only the g2 client's: the refused one claimed nowhere else


def test_an_unwritten_claim_still_fences_and_a_restart_never_hands_its_epoch_out_again(tmp_path, monkeypatch):
    """A node's claims kept in memory fence stale epochs as written ones do; after a restart (which forgets
    them) old epochs stay fenced and new ones are above every epoch handed out."""
    monkeypatch.setattr(local_sessions, "EPOCH_BLOCK", 4)
    g = Group(tmp_path, own_holder="node")
    try:
        old = g.claim("c1", "node")
        new = g.claim("c1", "node")
        assert new > old and _claim_keys(g.parts.kv) == []
        assert isinstance(g.h.error(g.write("c1", old)), api.Fenced)
        epochs = [g.claim(f"d{n}", "node") for n in range(5)]
        g.h.wait(g.h.store.release_session("c1", new))
        assert isinstance(g.h.error(g.write("c1", new)), api.Fenced)  # released: nobody's any more
        top = max(epochs)
        g.reopen()
        assert g.h.store.claims == 0
        assert isinstance(g.h.error(g.write("d0", epochs[0])), api.Fenced)
        assert g.claim("d0", "node") > top
        # Another holder's claim is written at once, also over an unwritten one.
        e = g.claim("d1", "node")
        other = g.claim("d1", "proxy-2")
        assert SessionStore(g.parts.kv).load_claims()["d1"] == ("proxy-2", other) and other > e
    finally:
        g.parts.close(g.clock)
