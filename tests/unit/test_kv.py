"""Unit tests of the durable key-value store: per-tick batches, reads of pending writes."""

from twisted.internet import task

from store.kv import DurableKV


def test_writes_in_one_tick_are_one_batch(tmp_path):
    """Puts staged in one tick commit as one batch and fire their Deferreds together."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    fired = []
    for i in range(10):
        kv.put(b"k%d" % i, b"v").addCallback(fired.append)
    assert fired == [] and kv.get(b"k3") == b"v", "pending writes are readable at once"
    clock.advance(0)
    assert len(fired) == 10 and kv.batches == 1


def test_scan_merges_pending_and_deleted(tmp_path):
    """scan sees committed and pending keys under a prefix, minus pending deletions, in order."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    kv.put(b"s:a", b"1")
    kv.put(b"s:b", b"2")
    kv.put(b"t:x", b"3")
    clock.advance(0)
    kv.delete(b"s:a")
    kv.put(b"s:c", b"4")
    assert list(kv.scan(b"s:")) == [(b"s:b", b"2"), (b"s:c", b"4")]


def test_values_survive_reopen(tmp_path):
    """What was committed is there after closing and reopening."""
    clock = task.Clock()
    kv = DurableKV(str(tmp_path), clock)
    kv.put(b"offset", b"42")
    kv.close()
    kv = DurableKV(str(tmp_path), clock)
    assert kv.get(b"offset") == b"42"
