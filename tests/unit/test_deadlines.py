"""The deadline wheel: one timer for every connection's CONNECT and keep-alive deadline, on task.Clock."""

from __future__ import annotations

import pytest
from twisted.internet import task

from mqtt_proxy.deadlines import DeadlineWheel


class Conn:
    """A connection as the wheel sees it: due at ``deadline`` unless traffic moved it (``later``)."""

    def __init__(self, name: str, later=None) -> None:
        self.name = name
        self.deadline_bucket = None
        self.later = later or []  # deadlines to name, one per check, before giving in
        self.expired_at = None

    def deadline_due(self, now: float):
        if self.later:
            return self.later.pop(0)
        self.expired_at = now
        return None


def wheel_at(start: float = 1_700_000_000.0, tick: float = 0.5):
    clock = task.Clock()
    clock.advance(start)
    return clock, DeadlineWheel(clock, tick)


def test_due_no_earlier_than_the_deadline_and_at_most_one_tick_late():
    """A deadline is acted on once it has passed, within one tick of it."""
    clock, wheel = wheel_at(1_700_000_000.2)
    c = Conn("c")
    deadline = clock.seconds() + 15.0
    wheel.schedule(c, deadline)
    clock.advance(14.99)
    assert c.expired_at is None
    clock.pump([0.05] * 12)
    assert c.expired_at is not None and 0 <= c.expired_at - deadline <= 0.5


def test_a_later_deadline_reschedules_instead_of_expiring():
    """Traffic since the deadline was set: the connection names a later one and the wheel waits for that."""
    clock, wheel = wheel_at()
    t0 = clock.seconds()
    c = Conn("c", later=[t0 + 20.0])
    wheel.schedule(c, t0 + 10.0)
    clock.pump([0.5] * 30)
    assert c.expired_at is None
    clock.pump([0.5] * 11)
    assert c.expired_at == pytest.approx(t0 + 20.0, abs=0.5)


def test_one_call_pending_at_the_earliest_bucket():
    """No periodic wake-ups: one call waits for the earliest deadline, an earlier deadline moves it."""
    clock, wheel = wheel_at()
    t0 = clock.seconds()
    wheel.schedule(Conn("late"), t0 + 60)
    assert [c.getTime() for c in clock.getDelayedCalls()] == [t0 + 60]
    wheel.schedule(Conn("early"), t0 + 10)
    assert [c.getTime() for c in clock.getDelayedCalls()] == [t0 + 10]


def test_cancel_forgets_and_the_timer_stops_when_nothing_is_held():
    """A cancelled connection is never checked; with no deadline held, no call is left on the clock."""
    clock, wheel = wheel_at()
    a, b = Conn("a"), Conn("b")
    wheel.schedule(a, clock.seconds() + 5)
    wheel.schedule(b, clock.seconds() + 5)
    assert clock.getDelayedCalls()
    wheel.cancel(a)
    assert len(wheel) == 1
    wheel.cancel(b)
    assert len(wheel) == 0 and not clock.getDelayedCalls()
    clock.advance(10)
    assert a.expired_at is None and b.expired_at is None


def test_timer_stops_after_the_last_deadline_and_restarts_for_a_new_one():
    """The timer runs only while deadlines are held."""
    clock, wheel = wheel_at()
    a = Conn("a")
    wheel.schedule(a, clock.seconds() + 1)
    clock.pump([0.5] * 3)
    assert a.expired_at is not None and not clock.getDelayedCalls()
    b = Conn("b")
    wheel.schedule(b, clock.seconds() + 1)
    clock.pump([0.5] * 3)
    assert b.expired_at is not None


def test_reschedule_moves_a_connection():
    """Scheduling again replaces the earlier deadline."""
    clock, wheel = wheel_at()
    c = Conn("c")
    wheel.schedule(c, clock.seconds() + 1)
    wheel.schedule(c, clock.seconds() + 30)
    clock.pump([0.5] * 10)
    assert c.expired_at is None and len(wheel) == 1


def test_many_connections_one_timer():
    """Ten thousand deadlines share one pending call; each expires once, in its own tick."""
    clock, wheel = wheel_at()
    t0 = clock.seconds()
    conns = [Conn(str(i)) for i in range(10_000)]
    for i, c in enumerate(conns):
        wheel.schedule(c, t0 + 1 + (i % 100) * 0.1)
    assert len(clock.getDelayedCalls()) == 1
    clock.pump([0.5] * 25)
    assert all(c.expired_at is not None for c in conns)
    assert all(0 <= c.expired_at - (t0 + 1 + (i % 100) * 0.1) <= 0.5 + 1e-6 for i, c in enumerate(conns))


def test_a_deadline_on_a_tick_edge_is_not_rescheduled_into_the_bucket_being_emptied():
    """A connection naming a deadline in the current tick waits for the next tick instead of looping."""
    clock, wheel = wheel_at()
    now = clock.seconds()
    c = Conn("c", later=[now + 1.0] * 3)  # always names the same instant: the wheel must move on each turn
    wheel.schedule(c, now + 1.0)
    clock.pump([0.5] * 2)
    assert c.expired_at is None and len(c.later) == 2
    clock.pump([0.5] * 3)
    assert c.expired_at is not None


def test_tick_must_be_positive():
    """A zero tick is refused."""
    with pytest.raises(ValueError, match="positive"):
        DeadlineWheel(task.Clock(), 0)
