"""Unit tests of the collector settings and timing a serving process applies after start-up."""

import gc

import pytest
from twisted.internet import task

from cluster.runtime import heap


@pytest.fixture
def collector_state():
    """Restore CPython's own collection (enabled, thresholds, nothing frozen) after a test."""
    enabled, before = gc.isenabled(), gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)
    if enabled:
        gc.enable()


def test_settle_freezes_the_start_up_heap_and_collects_less_often(collector_state):
    """settle() moves what is alive into the permanent generation and sets the fan-in thresholds."""
    before = gc.get_threshold()
    heap.settle()
    assert gc.get_threshold() == heap.GC_THRESHOLDS
    assert gc.get_freeze_count() > 0
    assert heap.GC_THRESHOLDS[0] > before[0] or before == heap.GC_THRESHOLDS


def test_tick_collector_takes_collection_over_and_gives_it_back(collector_state):
    """start() freezes the start-up heap and turns automatic collection off; stop() turns it back on."""
    collector = heap.TickCollector(task.Clock())
    collector.start()
    assert not gc.isenabled()
    assert gc.get_freeze_count() > 0
    collector.stop()
    assert gc.isenabled()
    assert collector.collect_due() is None, "stopped: CPython collects by itself"


def test_collect_due_makes_the_pass_cpython_would_have_made(collector_state):
    """No pass below the young threshold; then young passes, a middle one after t_middle of them, a full one after."""
    collector = heap.TickCollector(task.Clock(), thresholds=(100, 2, 2))
    collector.start()
    try:
        gc.collect()  # counts from zero
        assert collector.collect_due() is None
        kept, made = [], []
        for _ in range(13):
            kept.append([[] for _ in range(150)])  # 150 tracked objects alive: past the young threshold
            made.append(collector.collect_due())
        # CPython's rule is "more than the threshold": three young passes, then a middle one; after three
        # middle ones, the next pass is a full one.
        assert made == [0, 0, 0, 1] * 3 + [2], made
        assert collector.passes == [9, 3, 1]
        assert not gc.isenabled(), "passes made here leave automatic collection off"
    finally:
        collector.stop()


def test_the_backstop_collects_when_no_drain_runs(collector_state):
    """With no store drain calling it, the backstop timer makes the pass that is due."""
    clock = task.Clock()
    collector = heap.TickCollector(clock, thresholds=(100, 10, 10), interval=1.0)
    collector.start()
    try:
        gc.collect()
        kept = [[] for _ in range(150)]
        clock.advance(0.5)
        assert collector.passes == [0, 0, 0]
        clock.advance(0.5)
        assert collector.passes == [1, 0, 0]
        assert kept
    finally:
        collector.stop()


def test_cyclic_garbage_is_freed_at_the_next_pass(collector_state):
    """Cycles dropped while automatic collection is off are freed by the next due pass, not kept forever."""
    collector = heap.TickCollector(task.Clock(), thresholds=(100, 10, 10))
    collector.start()
    try:
        gc.collect()
        probe = []

        class Node:
            def __del__(self):
                probe.append(1)

        for _ in range(200):
            a, b = Node(), Node()
            a.other, b.other = b, a  # a cycle: reference counting alone never frees it
        del a, b
        assert probe == []
        assert collector.collect_due() == 0
        assert len(probe) == 400
    finally:
        collector.stop()
