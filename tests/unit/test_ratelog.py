"""RateLimitedLog: one line per reason per interval, with the count of the lines it left out."""

from __future__ import annotations

import logging

from twisted.internet import task

from mqtt_proxy.ratelog import RateLimitedLog


def test_repeats_within_the_interval_are_counted_not_written(caplog):
    """1,000 refusals in one second write one line; the next second's line says how many were left out."""
    clock = task.Clock()
    rl = RateLimitedLog(logging.getLogger("test.ratelog"), clock, interval=1.0)
    with caplog.at_level(logging.INFO, logger="test.ratelog"):
        written = sum(rl.event("quota", "refused client=%s", f"c{i}") for i in range(1000))
        clock.advance(1.0)
        rl.event("quota", "refused client=%s", "late")
    assert written == 1
    assert [r.getMessage() for r in caplog.records] == ["refused client=c0", "refused client=late suppressed=999"]


def test_reasons_are_limited_apart(caplog):
    """One reason's flood does not hide another reason's first line."""
    clock = task.Clock()
    rl = RateLimitedLog(logging.getLogger("test.ratelog2"), clock)
    with caplog.at_level(logging.INFO, logger="test.ratelog2"):
        for _ in range(10):
            rl.event("a", "a")
        rl.event("b", "b")
    assert [r.getMessage() for r in caplog.records] == ["a", "b"]
