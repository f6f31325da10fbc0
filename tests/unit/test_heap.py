"""Unit test of the collector settings a serving process applies after start-up."""

import gc

from cluster import heap


def test_settle_freezes_the_start_up_heap_and_collects_less_often():
    """settle() moves what is alive into the permanent generation and sets the fan-in thresholds."""
    before = gc.get_threshold()
    try:
        heap.settle()
        assert gc.get_threshold() == heap.GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
        assert heap.GC_THRESHOLDS[0] > before[0] or before == heap.GC_THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
