"""The leader's table of live brokers (RIP-44 BrokerHeartbeat / scanNotActiveBroker): pure, time passed in."""

from __future__ import annotations

from cluster.controller.broker_liveness import BrokerDied, BrokerLiveness


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
