"""The leader's table of live brokers (RIP-44 BrokerHeartbeat / scanNotActiveBroker): pure, time passed in."""

from __future__ import annotations

from cluster.controller.broker_liveness import BrokerDied, BrokerLiveness, ScanPaused


def test_a_broker_silent_for_the_timeout_dies_once():
    """A broker not heard for 1.5 s is reported dead by the next scan, and only once."""
    table = BrokerLiveness(1.5)
    table.heartbeat("g1", "b1", 0.0)
    table.heartbeat("g1", "b2", 0.0)
    table.heartbeat("g1", "b2", 1.0)
    assert table.scan(1.4) == [] and table.alive("g1", 1.4) == ["b1", "b2"]
    assert table.scan(1.5) == [BrokerDied("g1", "b1")]
    assert table.scan(2.0) == [] and table.alive("g1", 2.0) == ["b2"]


def test_a_dead_broker_that_heartbeats_is_alive_again():
    """A heartbeat after death says so (the caller may re-register it) and makes it alive."""
    table = BrokerLiveness(1.5)
    assert table.heartbeat("g1", "b1", 0.0, max_offset=10)
    assert not table.heartbeat("g1", "b1", 0.5)
    table.scan(3.0)
    assert table.heartbeat("g1", "b1", 3.1, max_offset=42)
    assert table.alive("g1", 3.2) == ["b1"] and table.offsets[("g1", "b1")] == 42


def test_a_new_leader_gives_every_known_broker_one_lease():
    """A new leader has heard nobody: each broker it knows of counts as alive until a lease from now."""
    table = BrokerLiveness(1.5)
    table.grace([("g1", "b1"), ("g1", "b2")], now=100.0, grace=3.0)
    assert table.scan(102.9) == [] and table.alive("g1", 102.9) == ["b1", "b2"]
    table.heartbeat("g1", "b2", 102.0)
    assert table.scan(103.0) == [BrokerDied("g1", "b1")]
    assert table.alive("g1", 103.0) == ["b2"]


def test_a_scan_long_after_the_previous_one_gives_a_grace_instead_of_deaths():
    """A scan two intervals or more after the last (the controller was paused) reports ScanPaused, kills nobody and
    gives every live broker one lease; a broker still silent after that lease dies."""
    table = BrokerLiveness(1.5, scan_interval=0.5, pause_grace=3.0)
    for now in (0.0, 0.5, 1.0):
        table.heartbeat("g1", "b1", now)
        table.heartbeat("g1", "b2", now)
        assert table.scan(now) == []
    assert table.scan(11.0) == [ScanPaused(10.0, 3.0)]
    assert table.alive("g1", 11.0) == ["b1", "b2"]
    table.heartbeat("g1", "b2", 11.2)
    for now in (11.5, 12.0, 12.5, 13.0, 13.5):
        table.heartbeat("g1", "b2", now)
        assert table.scan(now) == [], now
    assert table.scan(14.0) == [BrokerDied("g1", "b1")] and table.alive("g1", 14.0) == ["b2"]


def test_a_broker_dead_before_the_pause_stays_dead():
    """The pause's grace is for brokers it could not hear: one already declared dead is not revived by it."""
    table = BrokerLiveness(1.5, scan_interval=0.5, pause_grace=3.0)
    table.heartbeat("g1", "b1", 0.0)
    table.heartbeat("g1", "b2", 0.0)
    for now in (0.5, 1.0, 1.5):
        table.heartbeat("g1", "b2", now)
        table.scan(now)
    assert table.alive("g1", 1.5) == ["b2"]
    assert table.scan(5.0) == [ScanPaused(3.5, 3.0)] and table.alive("g1", 5.0) == ["b2"]


def test_a_scan_late_by_less_than_an_interval_is_not_a_pause():
    """A scan 0.9 s after the last (a loaded reactor) scans as usual: a broker silent for the timeout dies."""
    table = BrokerLiveness(1.5, scan_interval=0.5, pause_grace=3.0)
    table.heartbeat("g1", "b1", 0.0)
    assert table.scan(0.5) == [] and table.scan(1.0) == []
    assert table.scan(1.9) == [BrokerDied("g1", "b1")]
