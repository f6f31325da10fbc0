"""The lease table and its hashed wheel: renew on heartbeat, evict a lease after it ends, refuse stale ones."""

from __future__ import annotations

import pytest
from twisted.internet import task

from cluster.discovery.leases import (
    LeaseRefused,
    LeaseTable,
    LeaseTimings,
    MemberChanged,
    MemberForgotten,
    MemberJoined,
    MemberLeft,
)
from cluster.discovery.members import BadMember, MemberRecord
from cluster.discovery.wheel import HashedWheel

TIMINGS = LeaseTimings(lease=3.0, tick=0.1, forget_after=10.0, slots=64)


def _record(node_id="p1", node_type="proxy", **kw) -> MemberRecord:
    return MemberRecord("twistmq", node_id, node_type, **kw)


class Driven:
    """A table ticked by a task.Clock every wheel tick, as the controller's LoopingCall does."""

    def __init__(self, timings=TIMINGS):
        self.clock = task.Clock()
        self.table = LeaseTable("twistmq", timings, self.clock.seconds())
        self.events = []

    def run(self, seconds: float, heartbeat: dict | None = None, every: float = 1.0) -> None:
        """Advance *seconds* tick by tick; members in *heartbeat* (node id -> generation) heartbeat every *every*."""
        steps = round(seconds / self.table.timings.tick)
        per = round(every / self.table.timings.tick)
        for i in range(1, steps + 1):
            self.clock.advance(self.table.timings.tick)
            now = self.clock.seconds()
            if heartbeat and i % per == 0:
                for node_id, generation in heartbeat.items():
                    self.events.extend(self.table.heartbeat("twistmq", node_id, generation, now))
            self.events.extend(self.table.tick(now))


def test_wheel_hands_keys_back_when_due_not_before():
    """A key scheduled 0.3 s ahead on a 0.1 s wheel comes back at 0.3 s, once."""
    wheel = HashedWheel(0.1, now=0.0, slots=8)
    wheel.schedule("a", 0.0, 0.3)
    assert wheel.advance(0.2) == []
    assert wheel.advance(0.3) == ["a"]
    assert wheel.advance(0.4) == [] and len(wheel) == 0


def test_wheel_keeps_keys_more_than_one_turn_ahead():
    """A deadline past one turn of the ring waits for its round, not the first pass of its bucket."""
    wheel = HashedWheel(0.1, now=0.0, slots=4)
    wheel.schedule("far", 0.0, 1.0)  # tick 10: bucket 2, passed at ticks 2 and 6 first
    wheel.schedule("near", 0.0, 0.2)
    assert wheel.advance(0.7) == ["near"]
    assert wheel.advance(1.0) == ["far"]


def test_wheel_jump_hands_back_everything_due_in_order():
    """Advancing many turns at once returns every due key, earliest first."""
    wheel = HashedWheel(0.1, now=5.0, slots=4)
    for i, delay in enumerate((2.0, 0.1, 0.9, 0.5)):
        wheel.schedule(i, 5.0, delay)
    assert wheel.advance(100.0) == [1, 3, 2, 0]


def test_wheel_rounds_up_never_early():
    """A deadline between ticks is rounded up to the next tick."""
    wheel = HashedWheel(0.1, now=0.0)
    wheel.schedule("k", 0.0, 0.25)
    assert wheel.advance(0.2) == []
    assert wheel.advance(0.3) == ["k"]


def test_register_gives_a_lease_with_a_generation():
    """Registering lists the member joined, with a new generation and the controller's time."""
    driven = Driven()
    listed, events = driven.table.register(_record(), 0.0)
    assert listed.joined and listed.generation == 1 and events == [MemberJoined(listed)]
    again, _ = driven.table.register(_record(), 0.5)
    assert again.generation == 2


def test_heartbeats_keep_the_lease():
    """A member heartbeating every second for 20 s is never evicted."""
    driven = Driven()
    listed, _ = driven.table.register(_record(), 0.0)
    driven.run(20.0, {"p1": listed.generation})
    assert driven.events == [] and driven.table.member("p1").joined
    assert driven.table.member("p1").last_heartbeat == pytest.approx(20.0)


def test_silent_member_is_evicted_after_one_lease():
    """No heartbeat: the member leaves (joined false, still listed) at its lease end, within a tick."""
    driven = Driven()
    driven.table.register(_record(), 0.0)
    driven.run(2.9)
    assert driven.events == []
    driven.run(0.2)
    [left] = driven.events
    assert isinstance(left, MemberLeft) and left.reason == "evicted" and not left.member.joined
    assert driven.clock.seconds() == pytest.approx(3.1, abs=0.11)
    assert [m.node_id for m in driven.table.members()] == ["p1"] and driven.table.joined() == []


def test_lease_counts_from_the_last_heartbeat():
    """A member that stops after heartbeating at 5 s is evicted at 8 s, not before."""
    driven = Driven()
    listed, _ = driven.table.register(_record(), 0.0)
    driven.run(5.0, {"p1": listed.generation})
    driven.run(2.9)
    assert driven.events == []
    driven.run(0.2)
    assert [type(e) for e in driven.events] == [MemberLeft]


def test_left_member_is_forgotten_unless_seed():
    """forget_after seconds after its lease ended a member is no longer listed; a seed stays, not joined."""
    driven = Driven()
    driven.table.register(_record("p1"), 0.0)
    driven.table.register(_record("b1", "broker", seed=True), 0.0)
    driven.run(3.1 + 10.1)
    assert MemberForgotten("p1") in driven.events
    assert [(m.node_id, m.joined) for m in driven.table.members()] == [("b1", False)]


def test_heartbeat_after_eviction_is_refused_and_register_brings_it_back():
    """An evicted member's heartbeat is STALE_LEASE; registering again lists it joined with a new generation."""
    driven = Driven()
    listed, _ = driven.table.register(_record(), 0.0)
    driven.run(3.2)
    with pytest.raises(LeaseRefused) as refused:
        driven.table.heartbeat("twistmq", "p1", listed.generation, driven.clock.seconds())
    assert refused.value.code == LeaseRefused.STALE_LEASE
    back, events = driven.table.register(_record(), driven.clock.seconds())
    assert back.joined and back.generation > listed.generation and events == [MemberJoined(back)]
    driven.run(2.0, {"p1": back.generation})
    assert driven.table.member("p1").joined


def test_stale_generation_is_refused_after_a_newer_registration():
    """A second process registering the same id makes the first one's heartbeats STALE_LEASE."""
    table = LeaseTable("twistmq", TIMINGS, 0.0)
    old, _ = table.register(_record(), 0.0)
    new, _ = table.register(_record(), 0.5)
    with pytest.raises(LeaseRefused, match="STALE_LEASE"):
        table.heartbeat("twistmq", "p1", old.generation, 1.0)
    assert table.heartbeat("twistmq", "p1", new.generation, 1.0) == []
    assert table.refused == 1


def test_wrong_cluster_is_refused_and_logged(caplog):
    """A register or heartbeat naming another cluster id is WRONG_CLUSTER, logged with the node id."""
    table = LeaseTable("twistmq", TIMINGS, 0.0)
    with pytest.raises(LeaseRefused, match="WRONG_CLUSTER"):
        table.register(MemberRecord("other", "p9", "proxy"), 0.0)
    listed, _ = table.register(_record(), 0.0)
    with pytest.raises(LeaseRefused, match="WRONG_CLUSTER"):
        table.heartbeat("other", "p1", listed.generation, 0.5)
    assert "lease_refused code=WRONG_CLUSTER node_id=p9" in caplog.text
    assert table.members() == [listed]


def test_unknown_member_heartbeat_asks_for_a_register():
    """A heartbeat from a member this table never saw is UNKNOWN_MEMBER (a new leader, or forgotten)."""
    table = LeaseTable("twistmq", TIMINGS, 0.0)
    with pytest.raises(LeaseRefused) as refused:
        table.heartbeat("twistmq", "ghost", 1, 0.0)
    assert refused.value.code == LeaseRefused.UNKNOWN_MEMBER


def test_health_flag_change_is_an_event():
    """A heartbeat that flips the member's health flag yields MemberChanged with healthy false."""
    table = LeaseTable("twistmq", TIMINGS, 0.0)
    listed, _ = table.register(_record(), 0.0)
    [changed] = table.heartbeat("twistmq", "p1", listed.generation, 1.0, healthy=False)
    assert isinstance(changed, MemberChanged) and not changed.member.healthy
    assert table.heartbeat("twistmq", "p1", listed.generation, 2.0, healthy=False) == []


def test_deregister_ends_the_lease_at_once():
    """A member saying goodbye leaves now (reason deregistered), and its old evict check does nothing more."""
    driven = Driven()
    listed, _ = driven.table.register(_record(), 0.0)
    [left] = driven.table.deregister("p1", listed.generation, 0.5)
    assert left.reason == "deregistered"
    driven.run(5.0)
    assert driven.events == [] and driven.table.evicted == 0


def test_grace_gives_every_member_one_more_lease():
    """After grace(now) (a new leader) nobody is evicted before now + lease, though heartbeats stopped."""
    driven = Driven()
    driven.table.register(_record(), 0.0)
    driven.run(2.5)
    driven.table.grace(driven.clock.seconds())
    driven.run(2.9)
    assert driven.events == []
    driven.run(0.3)
    assert [type(e) for e in driven.events] == [MemberLeft]


def test_active_flag_survives_reregistration():
    """An operator's drain (active false) is kept when the member registers again after a restart."""
    table = LeaseTable("twistmq", TIMINGS, 0.0)
    table.register(_record(), 0.0)
    [changed] = table.set_active("p1", False)
    assert not changed.member.active
    again, _ = table.register(_record(), 1.0)
    assert not again.active


def test_one_pending_check_per_member_whatever_the_heartbeat_rate():
    """Heartbeating every tick keeps one evict check per member on the wheel, not one per heartbeat."""
    driven = Driven()
    listed, _ = driven.table.register(_record(), 0.0)
    driven.run(10.0, {"p1": listed.generation}, every=0.1)
    assert driven.table.checks_pending == 1


def test_member_record_wire_form_round_trips_and_names_bad_fields():
    """as_dict/from_dict round-trip; an unknown, missing or mistyped field is BadMember naming it."""
    record = _record(addresses={"mqtt": "tcp:127.0.0.1:1883"}, priority=2, zone="z1")
    assert MemberRecord.from_dict(record.as_dict()) == record
    with pytest.raises(BadMember, match="'colour'"):
        MemberRecord.from_dict({**record.as_dict(), "colour": "red"})
    with pytest.raises(BadMember, match="'node_id'"):
        MemberRecord.from_dict({"cluster_id": "twistmq", "node_type": "proxy"})
    with pytest.raises(BadMember, match="'priority'"):
        MemberRecord.from_dict({**record.as_dict(), "priority": True})
    with pytest.raises(BadMember, match="node_type"):
        MemberRecord.from_dict({**record.as_dict(), "node_type": "toaster"})
    with pytest.raises(BadMember):
        MemberRecord.from_dict([1, 2])


def test_adopted_records_get_a_lease_from_the_takeover():
    """A new leader's table lists committed records as they are; joined ones keep their generation and
    heartbeat on, silent ones are evicted one lease after the takeover, left ones are forgotten later."""
    driven = Driven()
    table = LeaseTable("twistmq", TIMINGS, 0.0, generation=7 << 32)
    driven.table = table
    table.adopt(_record("p1", joined=True, generation=5), 0.0)
    table.adopt(_record("p2", joined=True, generation=6), 0.0)
    table.adopt(_record("p3", joined=False, generation=4), 0.0)
    driven.run(5.0, {"p1": 5})
    assert [(type(e), getattr(e, "member", None) and e.member.node_id) for e in driven.events] == [(MemberLeft, "p2")]
    assert table.member("p1").joined and table.member("p1").generation == 5
    driven.run(6.0, {"p1": 5})
    assert MemberForgotten("p3") in driven.events
    listed, _ = table.register(_record("p4"), driven.clock.seconds())
    assert listed.generation == (7 << 32) + 1


def test_a_member_evicted_then_back_is_evicted_one_lease_after_it_goes_silent_again():
    """Evicted, registered again well within forget_after, then silent: evicted one lease later, not when the
    forget check of its first eviction comes due."""
    driven = Driven()
    driven.table.register(_record(), 0.0)
    driven.run(3.2)
    assert not driven.table.member("p1").joined
    driven.run(1.0)
    back, _ = driven.table.register(_record(), driven.clock.seconds())
    driven.events.clear()
    driven.run(3.2)
    assert [type(e) for e in driven.events] == [MemberLeft] and not driven.table.member("p1").joined
    driven.run(10.0)
    assert driven.table.member("p1") is None  # forgotten forget_after after its second eviction
