"""Snowflake ids: layout, uniqueness, a clock that steps back and a millisecond whose sequence runs out."""

from __future__ import annotations

import pytest
from twisted.internet import task

from cluster.discovery.ids import (
    EPOCH_MS,
    MAX_SEQUENCE,
    IdParts,
    IdsExhausted,
    SnowflakeIds,
    compose,
    compose_spread,
    decode,
    decode_spread,
    zone_number,
)

T0 = EPOCH_MS / 1000 + 86_400  # one day after the epoch, in seconds


def _clock(at: float = T0) -> task.Clock:
    clock = task.Clock()
    clock.advance(at)
    return clock


def test_layout_time_first():
    """A time-first id is 41 bits of ms, then 4 of zone, 8 of worker and 10 of sequence."""
    value = compose(5, 3, 200, 7)
    assert value == (5 << 22) | (3 << 18) | (200 << 10) | 7
    assert decode(value) == IdParts(5, 3, 200, 7)


def test_layout_sequence_first():
    """A sequence-first id puts the 10-bit sequence above the 41-bit ms, zone and worker."""
    value = compose_spread(5, 3, 200, 7)
    assert value == (7 << 53) | (5 << 12) | (3 << 8) | 200
    assert decode_spread(value) == IdParts(5, 3, 200, 7)


def test_largest_parts_fit_a_positive_signed_64_bit_integer():
    """Every field at its maximum still leaves the sign bit clear, in both layouts."""
    top = (1 << 41) - 1
    assert 0 < compose(top, 15, 255, 1023) < 1 << 63
    assert 0 < compose_spread(top, 15, 255, 1023) < 1 << 63


def test_ids_carry_the_clock_zone_and_worker():
    """The first id of a millisecond has sequence 0 and the clock's ms since the epoch."""
    ids = SnowflakeIds(zone=2, worker=9, clock=_clock())
    assert decode(ids.next_id()) == IdParts(86_400_000, 2, 9, 0)
    assert decode(ids.next_id()) == IdParts(86_400_000, 2, 9, 1)


def test_time_first_ids_increase():
    """Time-first ids made one after another increase, across milliseconds too."""
    clock = _clock()
    ids = SnowflakeIds(0, 1, clock)
    made = []
    for _ in range(50):
        made.extend(ids.next_id() for _ in range(30))
        clock.advance(0.0007)
    assert made == sorted(made) and len(set(made)) == len(made)


def test_sequence_overflow_borrows_the_next_millisecond():
    """The 1,025th id of one millisecond takes the next millisecond's first sequence number."""
    ids = SnowflakeIds(0, 1, _clock())
    made = [ids.next_id() for _ in range(MAX_SEQUENCE + 2)]
    assert len(set(made)) == len(made) and made == sorted(made)
    assert decode(made[-2]) == IdParts(86_400_000, 0, 1, MAX_SEQUENCE)
    assert decode(made[-1]) == IdParts(86_400_001, 0, 1, 0)
    assert ids.borrowed_ms == 1


def test_borrowing_stops_at_the_lead_limit():
    """With the clock stopped, ids run at most max_lead_ms ahead of it; then IdsExhausted, until time moves."""
    clock = _clock()
    ids = SnowflakeIds(0, 1, clock, max_lead_ms=2)
    made = [ids.next_id() for _ in range(3 * (MAX_SEQUENCE + 1))]
    assert len(set(made)) == len(made)
    with pytest.raises(IdsExhausted):
        ids.next_id()
    clock.advance(0.001)
    assert decode(ids.next_id()).ms == 86_400_003


def test_clock_stepping_back_repeats_no_id():
    """When the clock steps back, ids go on from the last millisecond used: still unique and increasing."""
    clock = _clock()
    ids = SnowflakeIds(1, 1, clock)
    before = [ids.next_id() for _ in range(5)]
    clock.rightNow -= 0.5  # an NTP step back of half a second
    after = [ids.next_id() for _ in range(5)]
    assert before + after == sorted(before + after) and len(set(before + after)) == 10
    assert decode(after[0]).ms == 86_400_000
    assert ids.clock_steps_back == 5


def test_clock_far_behind_exhausts_after_the_spent_millisecond():
    """A clock that fell back further than the lead limit: ids continue in the last ms, then refuse."""
    clock = _clock()
    ids = SnowflakeIds(1, 1, clock, max_lead_ms=10)
    ids.next_id()
    clock.rightNow -= 60
    for _ in range(MAX_SEQUENCE):
        ids.next_id()
    with pytest.raises(IdsExhausted):
        ids.next_id()


def test_spread_and_ordered_ids_share_the_sequence():
    """Both layouts draw from one counter: a spread id and an ordered id never share (ms, sequence)."""
    ids = SnowflakeIds(3, 4, _clock())
    pairs = [(p.ms, p.sequence) for p in (decode(ids.next_id()), decode_spread(ids.next_spread_id()),
                                          decode(ids.next_id()))]
    assert len(set(pairs)) == 3


def test_spread_ids_are_far_apart():
    """Consecutive sequence-first ids differ in their top bits (2**53 apart), so they land in different ranges."""
    ids = SnowflakeIds(0, 0, _clock())
    a, b = ids.next_spread_id(), ids.next_spread_id()
    assert b - a == 1 << 53


def test_two_workers_never_collide():
    """Two generators with the same clock and zone but different worker ids make disjoint ids."""
    clock = _clock()
    one, two = SnowflakeIds(0, 1, clock), SnowflakeIds(0, 2, clock)
    a = {one.next_id() for _ in range(3000)} | {one.next_spread_id() for _ in range(100)}
    b = {two.next_id() for _ in range(3000)} | {two.next_spread_id() for _ in range(100)}
    assert not a & b


def test_clock_before_the_epoch_is_refused():
    """A clock before 2026-01-01 cannot be put in 41 unsigned bits: IdsExhausted, not a negative id."""
    with pytest.raises(IdsExhausted):
        SnowflakeIds(0, 0, _clock(EPOCH_MS / 1000 - 1)).next_id()


@pytest.mark.parametrize("kwargs", [{"zone": 16, "worker": 0}, {"zone": 0, "worker": 256}, {"zone": -1, "worker": 0}])
def test_out_of_range_identity_is_refused(kwargs):
    """A zone over 4 bits or a worker over 8 bits is a ValueError naming it."""
    with pytest.raises(ValueError, match="zone|worker"):
        SnowflakeIds(clock=_clock(), **kwargs)


def test_zone_number_is_stable_and_in_range():
    """A zone name maps to the same 0-15 number in every process (not Python's salted hash)."""
    assert zone_number("") == 0
    assert zone_number("eu-west-1") == sum(b"eu-west-1") % 16
    assert all(0 <= zone_number(f"z{i}") <= 15 for i in range(100))
