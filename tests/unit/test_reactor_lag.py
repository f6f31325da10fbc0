"""Unit tests of the reactor-lateness probe on a task.Clock: no sleeps, no reactor."""

import pytest
from twisted.internet import task

from mqtt_proxy.reactor_lag import ReactorLagProbe


def test_a_probe_on_time_records_no_lateness():
    """Probes that run exactly when asked record zero lateness."""
    clock = task.Clock()
    probe = ReactorLagProbe(clock, interval=0.01)
    probe.start()
    for _ in range(100):
        clock.advance(0.01)
    assert probe.samples == 100 and probe.stats() == {"0.5": 0.0, "0.99": 0.0, "1": 0.0}


def test_a_stall_shows_as_one_late_probe_and_sets_the_max():
    """A 250 ms stall of the clock's thread is one probe 240 ms late; the median stays small."""
    clock = task.Clock()
    probe = ReactorLagProbe(clock, interval=0.01)
    probe.start()
    for _ in range(200):
        clock.advance(0.011)  # every probe 1 ms late
    clock.advance(0.25)
    stats = probe.stats()
    assert stats["1"] == pytest.approx(0.24)
    assert 0.001 <= stats["0.5"] <= 0.0011, "quantiles are bucket upper bounds, at most 10 % high"
    assert stats["0.99"] <= 0.0011, "one stall in 201 probes is above the 99th percentile"


def test_quantiles_are_upper_bounds_never_above_the_max():
    """Recorded values come back within one bucket (10 %) above, and never above the maximum."""
    probe = ReactorLagProbe(task.Clock())
    for value in (0.002, 0.004, 0.030, 0.050):
        probe.record(value)
    assert 0.004 <= probe.quantile(0.5) <= 0.0044
    assert probe.quantile(1.0) == probe.stats()["1"] == 0.050


def test_stop_cancels_the_next_probe():
    """After stop() the probe leaves no call pending on the clock."""
    clock = task.Clock()
    probe = ReactorLagProbe(clock)
    probe.start()
    probe.stop()
    assert clock.getDelayedCalls() == []
