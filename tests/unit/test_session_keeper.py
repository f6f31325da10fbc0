"""What a lost proxy leaves behind: its group publishes the wills and expires the sessions it held.

The sans-IO parts (``store.session_deadlines``, ``cluster.discovery.absence``) on plain times; the
keeper (``cluster.local.session_keeper``) over a real broker group's parts (RocksDB in a tmp dir) on a
task.Clock, reopened on the same files as after a broker restart.
"""

from __future__ import annotations

import pytest

from cluster.discovery.absence import Absences
from cluster.local.session_interest import SessionInterest
from cluster.local.session_keeper import SessionKeeper
from lightqueue.names import lmq_name
from store import api
from store import record as rec
from store.session_deadlines import (
    NEVER_EXPIRES,
    ExpireSession,
    PublishWill,
    SessionDeadlines,
    expiry_due,
    group_holder,
    will_due,
)
from store.session_store import SessionStore
from tests.contract.conftest import GROUP, Harness, Parts
from tests.unit.test_session_claims import Group

LEASE = 3.0
TICK = 0.1


# -- deadlines, sans IO ---------------------------------------------------------------------------------------

def test_expiry_counts_from_the_loss_or_from_when_the_client_left():
    """A connected session expires its interval after the loss; one already left, after it left; 0xFFFFFFFF
    never; no stored session (not persistent) ends at the loss."""
    assert expiry_due(5, None, 10_000) == 15_000
    assert expiry_due(5, 7_000, 10_000) == 12_000
    assert expiry_due(NEVER_EXPIRES, None, 10_000) is None
    assert expiry_due(None, None, 10_000) == 10_000


def test_a_will_is_due_after_its_delay_and_never_after_its_session_ends():
    """MQTT 5 3.1.3.2.2: the will goes at the delay or the session's end, whichever is first; a due time stored
    at the takeover wins over a new count (a restart does not push it back)."""
    assert will_due(0, None, 10_000, 15_000) == 10_000
    assert will_due(30, None, 10_000, 15_000) == 15_000
    assert will_due(30, None, 10_000, None) == 40_000
    assert will_due(30, 12_000, 20_000, None) == 12_000


def test_deadlines_come_due_in_order_each_once_a_will_before_its_sessions_end():
    """Due actions in deadline order; a session ending with its will still waiting publishes it first."""
    d = SessionDeadlines()
    d.hold("a", 5_000, 9_000)
    d.hold("b", None, 3_000)
    d.hold("c", 20_000, 8_000)
    assert d.next_due() == 3_000
    assert d.due(2_999) == []
    assert d.due(8_500) == [ExpireSession("b"), PublishWill("a"), PublishWill("c"), ExpireSession("c")]
    assert d.due(8_500) == []
    assert d.due(9_000) == [ExpireSession("a")]
    assert d.next_due() is None and len(d) == 0


def test_session_ends_come_due_a_bounded_number_at_a_time_the_rest_on_the_next_call():
    """With a limit, session ends come in order over several calls, none lost, none twice; wills are not held
    back by it."""
    d = SessionDeadlines()
    for i in range(10):
        d.hold(f"c{i}", None, 1_000 + i)
    d.hold("w", 1_005, None)
    got = [d.due(5_000, 4), d.due(5_000, 4), d.due(5_000, 4), d.due(5_000, 4)]
    assert [len(g) for g in got] == [4, 5, 2, 0]
    assert [a.client_id for g in got for a in g if isinstance(a, ExpireSession)] == [f"c{i}" for i in range(10)]
    assert PublishWill("w") in got[1]


def test_forgotten_or_replaced_deadlines_never_come_due():
    """A client back elsewhere cancels its will and expiry; holding again replaces the old times."""
    d = SessionDeadlines()
    d.hold("a", 1_000, 2_000)
    assert d.forget("a") and not d.forget("a")
    d.hold("b", 1_000, 2_000)
    d.hold("b", None, 5_000)
    assert d.next_due() == 5_000
    assert d.due(10_000) == [ExpireSession("b")]


def test_an_absence_is_reported_once_after_a_lease_and_ends_when_seen():
    """Away for a lease: reported once, however often ``gone`` is repeated; seen again: a new absence counts anew."""
    a = Absences(3.0)
    a.gone("p1", 100.0)
    a.gone("p1", 101.0)  # polling while it is down keeps the first time
    assert a.lost(102.9) == []
    assert a.lost(103.0) == ["p1"]
    a.gone("p1", 104.0)
    assert a.lost(200.0) == []
    a.seen("p1")
    a.gone("p1", 300.0)
    assert a.lost(302.0) == [] and a.lost(303.0) == ["p1"]
    a.gone("p2", 0.0)
    a.seen("p2")
    assert a.lost(10.0) == []
    with pytest.raises(ValueError):
        Absences(0)


# -- the keeper over a broker group's parts ------------------------------------------------------------------

class Broker(Group):
    """A broker group's store as the broker role serves it (``SessionInterest``) and its ``SessionKeeper``."""

    def _open(self) -> None:
        self.parts = Parts(self.path, self.clock)
        local = self.parts.local()
        self.db = SessionStore(self.parts.kv)
        self.served = SessionInterest(local, self.db)
        self.h = Harness(self.served, self.clock, self.parts)
        self.h.wait(self.served.restore())
        self.h.wait(self.served.add_filter("will/#"))  # a subscriber of the wills, elsewhere
        self.keeper = SessionKeeper(self.served, local.session_claims, self.db, GROUP, self.clock, LEASE, TICK)
        self.keeper.start()

    def reopen(self) -> None:
        self.keeper.stop()
        super().reopen()

    def advance(self, seconds: float) -> None:
        steps = int(round(seconds / TICK))
        for _ in range(steps):
            self.clock.advance(TICK)
        for _ in range(5):
            self.clock.advance(0)

    def connect(self, cid: str, holder: str = "proxy-1", expiry: int | None = 5, will_delay: int | None = 0,
                subscribe: str | None = "exp/#") -> int:
        """What a proxy does at CONNECT and SUBSCRIBE: claim, store the session, the will, a subscription."""
        epoch = self.claim(cid, holder)
        if expiry is not None:
            self.h.wait(self.h.store.put_session(api.SessionMeta(cid, expiry, 5, None, "anonymous"), epoch))
        if will_delay is not None:
            will = api.WillState(rec.Message("will/" + cid, b"gone", rec.RecordKind.MQTT_PUBLISH, 1, False, cid), will_delay)
            self.h.wait(self.h.store.put_will(cid, will, epoch))
        if subscribe is not None:
            queue = self.h.wait(self.h.store.add_filter(subscribe))
            end = self.h.wait(self.h.store.end_positions(queue))
            self.h.wait(self.h.store.put_subscription(cid, api.SubscriptionState(subscribe, 1, end), epoch))
            self.h.wait(self.h.store.remove_filter(subscribe))  # the proxy's own interest goes with it
        return epoch

    def wills(self) -> list[str]:
        """The client ids of the wills published so far (read from the ``will/#`` light queue)."""
        queue = lmq_name("will/#")
        (first,) = self.h.wait(self.h.store.first_positions(queue))
        return [m.record.client_id for m in self.h.wait(self.h.store.read_queue(first, 100)).messages]


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path)
    yield b
    b.keeper.stop()
    b.parts.close(b.clock)


def test_a_proxy_gone_for_a_lease_has_its_wills_published_and_its_sessions_expired(broker):
    """The proxy's last connection goes: after one lease its group claims its sessions (fencing it), publishes
    the will (delay 0) at once, and after the expiry deletes the session, its filter interest and its claim."""
    epoch = broker.connect("c1")
    broker.keeper.member_up("proxy-1")
    assert broker.served.held == 1
    broker.keeper.member_down("proxy-1")
    broker.advance(LEASE - 2 * TICK)
    assert broker.wills() == [] and broker.keeper.takeovers == 0
    broker.advance(5 * TICK)  # the loss is seen on a tick, the will goes out on the next
    assert broker.wills() == ["c1"]
    state = broker.h.wait(broker.h.store.get_session("c1"))
    assert state.holder == group_holder(GROUP) and state.meta.disconnected_at_ms is not None
    assert isinstance(broker.h.error(broker.h.store.put_session(api.SessionMeta("c1", 5, 5, None), epoch)),
                      api.Fenced)
    assert broker.db.load_will("c1") is None
    broker.advance(5 - 4 * TICK)
    assert broker.h.wait(broker.h.store.get_session("c1")) is not None
    broker.advance(3 * TICK)
    assert broker.h.wait(broker.h.store.get_session("c1")) is None
    assert broker.served.held == 0 and "c1" not in broker.parts.local().session_claims.claims
    assert broker.keeper.stats() == {"held": 0, "takeovers": 1, "wills_published": 1, "sessions_expired": 1,
                                     "copies_held": 0, "copies_dropped": 0}
    assert broker.wills() == ["c1"]  # once


def test_a_proxy_that_reconnects_within_the_lease_keeps_its_sessions(broker):
    """A connection that comes back before the lease ends is no loss: nothing taken over, no will."""
    broker.connect("c1")
    broker.keeper.member_up("proxy-1")
    broker.keeper.member_down("proxy-1")
    broker.advance(LEASE / 2)
    broker.keeper.member_up("proxy-1")
    broker.advance(2 * LEASE)
    assert broker.wills() == [] and broker.keeper.takeovers == 0
    assert broker.h.wait(broker.h.store.get_session("c1")).holder == "proxy-1"


def test_a_client_back_within_its_will_delay_cancels_the_will_and_the_expiry(broker):
    """MQTT 5 3.1.2.8: the client reconnects on another proxy (a new claim) before the delay ends: no will is
    published, and its session is the new holder's, never expired by the group."""
    broker.connect("c1", expiry=60, will_delay=10)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    assert broker.keeper.stats()["held"] == 1
    broker.claim("c1", "proxy-2")
    broker.advance(70)
    assert broker.wills() == [] and broker.keeper.stats()["held"] == 0
    assert broker.h.wait(broker.h.store.get_session("c1")).holder == "proxy-2"


def test_a_will_waits_for_its_delay_unless_the_session_ends_first(broker):
    """Delay 10 s with expiry 60 s: published after 10 s; delay 10 s with a session that was not persistent (no
    session stored): published at the takeover, and the claim goes with it."""
    broker.connect("late", expiry=60, will_delay=10, subscribe=None)
    broker.connect("clean", expiry=None, will_delay=10, subscribe=None)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    assert broker.wills() == ["clean"]
    assert "clean" not in broker.parts.local().session_claims.claims
    broker.advance(10)
    assert broker.wills() == ["clean", "late"]


def test_a_will_published_or_cancelled_by_its_holder_is_not_published_again(broker):
    """The holder deletes the will it published (or that a normal DISCONNECT cancelled), and a release drops
    it too: a later takeover publishes nothing."""
    e1 = broker.connect("c1", expiry=60)
    broker.h.wait(broker.h.store.delete_will("c1", e1))
    e2 = broker.connect("c2", expiry=None, subscribe=None)
    broker.h.wait(broker.h.store.release_session("c2", e2))
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    assert broker.wills() == []
    assert broker.db.load_wills() == {}


def test_an_evicted_proxys_sessions_are_taken_over(broker):
    """The controllers' metadata lists the proxy as not joined: its sessions are the group's at once (once)."""
    broker.connect("c1")
    broker.keeper.member_up("proxy-1")
    members = [{"node_id": "proxy-1", "node_type": "proxy", "joined": False},
               {"node_id": "b1", "node_type": "broker", "joined": False}]
    broker.keeper.metadata({"version": 3, "members": members})
    broker.keeper.metadata({"version": 4, "members": members})
    broker.advance(2 * TICK)
    assert broker.wills() == ["c1"] and broker.keeper.takeovers == 1


def _evicted(boot: str, joined: bool = False) -> dict:
    return {"version": 5, "members": [{"node_id": "proxy-1", "node_type": "proxy", "joined": joined, "boot": boot}]}


def test_an_evicted_old_life_leaves_the_claims_its_restarted_successor_made(broker):
    """A proxy killed and restarted under the same id within a lease reclaims a client's session before its old
    life's eviction arrives: that eviction takes over only what the old life still holds, and the new life's
    writes are not fenced; the new life's own eviction later takes the rest."""
    broker.keeper.member_up("proxy-1", "life-1")
    broker.connect("back")
    broker.connect("gone")
    broker.keeper.member_down("proxy-1")  # SIGKILL
    broker.keeper.member_up("proxy-1", "life-2")  # the same id, started again
    epoch = broker.connect("back")  # its client came back to it
    broker.keeper.metadata(_evicted("life-1"))  # the old life's lease ran out
    broker.advance(2 * TICK)
    claims = broker.keeper.sessions.claims
    assert broker.wills() == ["gone"] and claims["gone"][0] == group_holder(GROUP)
    assert claims["back"] == ("proxy-1", epoch)
    broker.h.wait(broker.h.store.put_session(api.SessionMeta("back", 5, 5, None, "anonymous"), epoch))
    broker.keeper.metadata(_evicted("life-2", joined=True))  # the new life registered
    broker.keeper.metadata(_evicted("life-2"))  # then stopped (SIGSTOP, connections open): evicted in turn
    broker.advance(2 * TICK)
    assert broker.wills() == ["gone", "back"] and claims["back"][0] == group_holder(GROUP)


def test_an_evicted_life_that_is_still_connected_loses_all_it_holds(broker):
    """A proxy stopped with its connections open (or cut off from the controllers only) is evicted in the life
    that is connected: every session it holds here is taken over, however recent its claim."""
    broker.keeper.member_up("proxy-1", "life-1")
    broker.connect("c1")
    broker.advance(LEASE)
    broker.connect("c2")
    broker.keeper.metadata(_evicted("life-1"))
    broker.advance(2 * TICK)
    assert sorted(broker.wills()) == ["c1", "c2"] and broker.keeper.takeovers == 2


def test_a_proxy_restarted_before_its_lease_ran_out_loses_its_old_lifes_sessions(broker):
    """A proxy SIGKILLed and back under its id at once (no absence, no eviction): its new life's first connection
    ends the old one, whose sessions the group takes over before the new life's restore lists them; their wills
    go out after their delay (a clean session's at once, its claim with it), their expiry counts from then, and
    a client back within its will delay cancels its will (MQTT 5 3.1.2.8)."""
    broker.keeper.member_up("proxy-1", "life-1")
    broker.connect("late", expiry=30, will_delay=5)
    broker.connect("clean", expiry=None, will_delay=5, subscribe=None)
    broker.connect("back", expiry=30, will_delay=5)
    broker.keeper.member_down("proxy-1")  # SIGKILL
    broker.advance(TICK)
    broker.keeper.member_up("proxy-1", "life-2")  # the same id, started again within the lease
    listed = {s.meta.client_id: s.holder for s in broker.h.wait(broker.h.store.list_sessions())}
    assert listed == {"late": group_holder(GROUP), "back": group_holder(GROUP)}  # the restore leaves them be
    broker.advance(2 * TICK)
    assert broker.wills() == ["clean"] and "clean" not in broker.keeper.sessions.claims
    epoch = broker.claim("back", "proxy-1")  # its client came back to the new process
    broker.advance(5)
    assert broker.wills() == ["clean", "late"]
    assert broker.keeper.sessions.claims["back"] == ("proxy-1", epoch)
    broker.advance(30 - 5 - 2 * TICK)
    assert broker.h.wait(broker.h.store.get_session("late")) is not None
    broker.advance(4 * TICK)
    assert broker.h.wait(broker.h.store.get_session("late")) is None
    assert broker.h.wait(broker.h.store.get_session("back")).holder == "proxy-1"
    assert broker.wills() == ["clean", "late"]


def test_a_proxy_reconnecting_in_the_same_life_or_to_a_slave_loses_nothing(broker):
    """Another connection of the life the keeper knows is no restart; a keeper stopped (its broker a slave)
    takes nothing over, and once master again the life on record connecting is no restart either."""
    broker.keeper.member_up("proxy-1", "life-1")
    broker.connect("c1")
    broker.keeper.member_down("proxy-1")
    broker.keeper.member_up("proxy-1", "life-1")
    broker.keeper.member_up("proxy-1", "life-1")  # a second connection
    broker.keeper.stop()
    broker.keeper.member_up("proxy-1", "life-1")
    broker.keeper.restart()
    broker.keeper.member_up("proxy-1", "life-1")
    broker.advance(2 * LEASE)
    assert broker.wills() == [] and broker.keeper.takeovers == 0
    assert broker.keeper.sessions.claims["c1"][0] == "proxy-1"


def test_a_life_that_connected_while_the_broker_was_a_slave_ends_the_one_on_record_once_it_is_master(broker):
    """A slave's keeper takes nothing over; when its broker becomes master, a connected holder's life that is not
    the one on record (the process restarted meanwhile) ends that one, as if it had connected then."""
    broker.keeper.member_up("proxy-1", "life-1")
    broker.connect("c1")
    broker.keeper.member_down("proxy-1")
    broker.keeper.stop()
    broker.keeper.member_up("proxy-1", "life-2")
    broker.advance(2 * TICK)
    assert broker.wills() == []
    broker.keeper.restart()
    broker.advance(2 * TICK)
    assert broker.wills() == ["c1"]


def test_a_keeper_restarted_on_becoming_master_knows_the_lives_on_record(broker):
    """The life a holder connected in last is stored with its first epoch: a keeper restarted as master (its KV
    the old master's) lets an old life's eviction take only what that life held, and a new life connecting
    ends the one on record."""
    broker.keeper.member_up("proxy-1", "life-1")
    broker.connect("old")
    broker.keeper.member_up("proxy-1", "life-2")  # the same id started again: "old" taken over
    broker.advance(2 * TICK)
    assert broker.wills() == ["old"]
    epoch = broker.connect("c1")
    broker.keeper.restart()
    broker.keeper.metadata(_evicted("life-1"))
    broker.advance(2 * TICK)
    assert broker.wills() == ["old"] and broker.keeper.sessions.claims["c1"] == ("proxy-1", epoch)
    broker.keeper.member_up("proxy-1", "life-3")
    broker.advance(2 * TICK)
    assert broker.wills() == ["old", "c1"]


def test_a_broker_restarted_since_a_proxys_old_life_knows_it_when_the_new_life_connects(broker):
    """A proxy's life connects and claims; the broker restarts (the proxy, down meanwhile, never reconnects in that
    life); the proxy's new life connects within the start's lease: the old life's sessions are taken over at
    once (their wills go out), and nothing the new life claims after is."""
    broker.keeper.member_up("proxy-1", "life-1")
    broker.connect("gone", expiry=None, subscribe=None)
    broker.connect("away", expiry=30, will_delay=2)
    broker.reopen()
    broker.keeper.member_up("proxy-1", "life-2")
    listed = {s.meta.client_id: s.holder for s in broker.h.wait(broker.h.store.list_sessions())}
    assert listed == {"away": group_holder(GROUP)}  # before the new life's restore lists them
    epoch = broker.connect("new")
    broker.advance(2 * TICK)
    assert broker.wills() == ["gone"]
    broker.advance(2)
    assert broker.wills() == ["gone", "away"] and broker.keeper.sessions.claims["new"] == ("proxy-1", epoch)


def test_deadlines_survive_a_broker_restart_and_what_came_due_meanwhile_is_done_at_start(broker):
    """Taken over, then the broker restarts: the will (delay 10) and the expiry (20 s) are re-armed from what was
    stored; a restart after both came due publishes and expires at start."""
    broker.connect("c1", expiry=20, will_delay=10)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    broker.reopen()
    broker.advance(5)
    assert broker.wills() == []
    broker.advance(6)
    assert broker.wills() == ["c1"]
    broker.connect("c2", expiry=20, will_delay=10)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    broker.keeper.stop()
    broker.parts.close(broker.clock)
    broker.clock.advance(60)  # down past both deadlines
    broker._open()
    broker.advance(2 * TICK)
    assert broker.wills() == ["c1", "c2"]
    assert broker.h.wait(broker.h.store.get_session("c1")) is None
    assert broker.h.wait(broker.h.store.get_session("c2")) is None and broker.served.held == 0


def test_a_holder_that_never_comes_back_after_a_restart_is_lost_after_a_lease(broker):
    """At start every holder on record is away until it connects: one that connects in time keeps its sessions,
    one that does not is taken over one lease after the start."""
    broker.connect("c1", holder="proxy-1")
    broker.connect("c2", holder="proxy-2")
    broker.reopen()
    broker.keeper.member_up("proxy-1")
    broker.advance(LEASE + 2 * TICK)
    assert broker.wills() == ["c2"]
    assert broker.h.wait(broker.h.store.get_session("c1")).holder == "proxy-1"


def test_a_session_handed_over_in_the_groups_name_is_kept_by_the_group(broker):
    """A proxy that closed a session of a group it had lost claims it in the group's name once it is back: the
    group counts its expiry from then and ends it."""
    broker.connect("c1", expiry=5, will_delay=None)
    broker.keeper.member_up("proxy-1")
    broker.claim("c1", group_holder(GROUP))
    broker.advance(2 * TICK)
    assert broker.keeper.stats()["held"] == 1
    broker.advance(5)
    assert broker.h.wait(broker.h.store.get_session("c1")) is None and broker.served.held == 0


def test_a_lost_proxys_clean_sessions_without_a_will_leave_no_claim(broker):
    """A clean session without a will has nothing for the group to keep: its claim is released, not taken."""
    broker.connect("bare", expiry=None, will_delay=None, subscribe=None)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    assert "bare" not in broker.parts.local().session_claims.claims
    assert broker.keeper.stats() == {"held": 0, "takeovers": 0, "wills_published": 0, "sessions_expired": 0,
                                     "copies_held": 0, "copies_dropped": 0}


def test_a_session_of_another_group_is_taken_over_only_for_the_part_kept_here(broker):
    """Of the sessions living in another group, the lost proxy's claim is taken only where this group keeps a
    will or a subscription of it; a mere copy of the meta is left to the session's own group (the proxy may be
    alive, cut off from this group only, and still serving the client)."""
    broker.keeper.homed = lambda cid: False
    broker.connect("meta-only", will_delay=None, subscribe=None)
    broker.connect("with-will", subscribe=None)
    broker.connect("with-sub", will_delay=None)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    holders = {cid: h for cid, (h, _e) in broker.parts.local().session_claims.claims.items()}
    assert holders == {"meta-only": "proxy-1", "with-will": group_holder(GROUP), "with-sub": group_holder(GROUP)}
    assert broker.wills() == ["with-will"]



def copy_of(broker, cid: str):
    """This group's stored copy of ``cid`` (None once dropped) and its claim (None once released)."""
    return broker.h.wait(broker.h.store.get_session(cid)), broker.parts.local().session_claims.claims.get(cid)


def test_a_copy_of_a_session_living_elsewhere_is_dropped_when_its_home_group_would_expire_it(broker):
    """The holder of a session homed in another group (only the copy of its meta here, expiry 5 s) is gone for a
    lease: the claim stays the holder's, the loss is stored as the copy's disconnect time, and 5 s after the loss
    the copy and its claim are deleted (no will published, nothing taken over)."""
    broker.keeper.homed = lambda cid: False
    epoch = broker.connect("copy", expiry=5, will_delay=None, subscribe=None)
    broker.keeper.member_up("proxy-1")
    broker.keeper.member_down("proxy-1")
    broker.advance(LEASE + TICK)
    lost_ms = broker.h.now_ms()
    state, claim = copy_of(broker, "copy")
    assert claim == ("proxy-1", epoch) and broker.keeper.stats()["copies_held"] == 1
    assert lost_ms - 1000 <= state.meta.disconnected_at_ms <= lost_ms
    broker.advance(5 - 3 * TICK)
    assert copy_of(broker, "copy") != (None, None)
    broker.advance(3 * TICK)
    assert copy_of(broker, "copy") == (None, None)
    assert broker.keeper.stats() == {"held": 0, "takeovers": 0, "wills_published": 0, "sessions_expired": 0,
                                     "copies_held": 0, "copies_dropped": 1}
    assert broker.wills() == []


def test_a_copy_claimed_again_before_its_expiry_is_kept(broker):
    """A client back before the expiry claimed its session anew in every group: on another proxy, or on its
    proxy relaunched under the same id (a new epoch); its copy stays, with the new claim."""
    broker.keeper.homed = lambda cid: False
    broker.connect("elsewhere", expiry=5, will_delay=None, subscribe=None)
    broker.connect("same-proxy", expiry=5, will_delay=None, subscribe=None)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    assert broker.keeper.stats()["copies_held"] == 2
    e2 = broker.claim("elsewhere", "proxy-2")
    e1 = broker.claim("same-proxy", "proxy-1")
    broker.advance(20)
    assert copy_of(broker, "elsewhere")[1] == ("proxy-2", e2)
    assert copy_of(broker, "same-proxy")[1] == ("proxy-1", e1)
    assert copy_of(broker, "elsewhere")[0] is not None and copy_of(broker, "same-proxy")[0] is not None
    assert broker.keeper.stats()["copies_dropped"] == 0


def test_a_copys_drop_keeps_its_time_across_a_broker_restart(broker):
    """Held at the loss (expiry 5 s), then the broker restarts 3 s later and the holder never connects: found lost
    a lease after the start, the copy is dropped at once (its stored loss + 5 s is past), not 5 s later."""
    broker.keeper.homed = lambda cid: False
    broker.connect("copy", expiry=5, will_delay=None, subscribe=None)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(3)
    broker.reopen()
    broker.keeper.homed = lambda cid: False
    broker.advance(LEASE + 2 * TICK)
    assert copy_of(broker, "copy") == (None, None)
    assert broker.keeper.stats()["copies_dropped"] == 1


def test_a_copy_ends_as_its_home_group_ends_the_session_at_once_or_never(broker):
    """Expiry 0 (a session that ends with its connection): dropped at the loss; 0xFFFFFFFF: never dropped; a copy
    that is more than a copy by its drop (a subscription written by a holder cut off from this group only) is
    left alone."""
    broker.keeper.homed = lambda cid: False
    broker.connect("zero", expiry=0, will_delay=None, subscribe=None)
    broker.connect("never", expiry=NEVER_EXPIRES, will_delay=None, subscribe=None)
    epoch = broker.connect("grew", expiry=5, will_delay=None, subscribe=None)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    assert copy_of(broker, "zero") == (None, None)
    queue = broker.h.wait(broker.h.store.add_filter("late/#"))
    end = broker.h.wait(broker.h.store.end_positions(queue))
    broker.h.wait(broker.h.store.put_subscription("grew", api.SubscriptionState("late/#", 1, end), epoch))
    broker.advance(3600)
    assert copy_of(broker, "never")[0] is not None and copy_of(broker, "grew")[0] is not None
    assert broker.keeper.stats()["copies_dropped"] == 1 and broker.wills() == []

def test_a_wills_message_expiry_counts_from_its_publish_by_the_group(broker):
    """A will set with a Message Expiry Interval of 60 s at CONNECT and published by the group an hour later
    expires 60 s after that publish, not before it."""
    epoch = broker.claim("c1")
    born = broker.h.now_ms()
    message = rec.Message("will/c1", b"gone", rec.RecordKind.MQTT_PUBLISH, 1, False, "c1", born,
                          {rec.EXPIRES_AT: str(born + 60_000)})
    broker.h.wait(broker.h.store.put_will("c1", api.WillState(message, 0), epoch))
    broker.advance(3600)
    broker.keeper.take_over("proxy-1", "test")
    broker.advance(2 * TICK)
    (first,) = broker.h.wait(broker.h.store.first_positions(lmq_name("will/#")))
    (got,) = broker.h.wait(broker.h.store.read_queue(first, 10)).messages
    assert int(got.record.properties[rec.EXPIRES_AT]) >= broker.h.now_ms() + 59_000


def test_a_keeper_restarted_on_becoming_master_gives_each_holder_a_lease_from_then(broker):
    """An absence counted while the broker was a slave (its keeper stopped, proxies dialling the master) is no
    loss: restarted as master, the keeper waits a lease from the restart before it takes a session over."""
    broker.connect("c1", holder="proxy-1")
    broker.keeper.member_up("proxy-1")
    broker.keeper.member_down("proxy-1")  # gone from this broker: it became a slave, the proxy went to the master
    broker.keeper.stop()
    broker.advance(2 * LEASE)
    broker.keeper.restart()
    broker.advance(2 * TICK)
    assert broker.wills() == [] and broker.keeper.takeovers == 0
    broker.keeper.member_up("proxy-1")  # the proxy dials the new master within the lease
    broker.advance(LEASE)
    assert broker.wills() == [] and broker.h.wait(broker.h.store.get_session("c1")).holder == "proxy-1"
