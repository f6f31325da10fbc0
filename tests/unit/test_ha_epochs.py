"""Unit tests of the epoch file and the handshake's walk back to the last common epoch."""

import os

import pytest
from hypothesis import given, settings, strategies as st

from store.ha_epochs import EpochEntry, EpochError, EpochFile, epoch_at, truncation_point

E = EpochEntry


def test_epoch_file_survives_a_reload(tmp_path):
    """Appended epochs are on disk, in order, after a reload."""
    f = EpochFile(str(tmp_path))
    assert f.load() == [] and not f.exists
    f.append(1, 0)
    f.append(3, 500)
    again = EpochFile(str(tmp_path))
    assert again.load() == [E(1, 0), E(3, 500)]
    assert not os.path.exists(f.path + ".tmp")


def test_epoch_file_refuses_out_of_order_epochs(tmp_path):
    """An older epoch, or one starting before the newest, is refused and the file is unchanged."""
    f = EpochFile(str(tmp_path))
    f.append(2, 100)
    with pytest.raises(EpochError):
        f.append(1, 200)
    with pytest.raises(EpochError):
        f.append(3, 50)
    assert EpochFile(str(tmp_path)).load() == [E(2, 100)]


def test_a_damaged_epoch_file_is_an_error_naming_it(tmp_path):
    """A file that is not an epoch file is reported with its path, not read as no epochs."""
    (tmp_path / "epochs").write_text("garbage\n")
    with pytest.raises(EpochError, match="epochs"):
        EpochFile(str(tmp_path)).load()


def test_first_epoch_starts_at_the_log_start_later_ones_at_its_end(tmp_path):
    """A first master owns what its log already holds; a later one starts at the log's end."""
    f = EpochFile(str(tmp_path))
    assert f.begin_epoch(1, log_min=0, log_max=700) == E(1, 0)
    assert f.begin_epoch(2, log_min=0, log_max=900) == E(2, 900)


def test_recovery_drops_epochs_past_the_log_end(tmp_path):
    """Epochs that start past the recovered log's end go; one starting exactly at it stays."""
    f = EpochFile(str(tmp_path))
    for e in (E(1, 0), E(2, 100), E(3, 200), E(4, 300)):
        f.append(*e)
    assert f.truncate_suffix(200) == [E(4, 300)]
    assert EpochFile(str(tmp_path)).load() == [E(1, 0), E(2, 100), E(3, 200)]


def test_retention_drops_epochs_below_the_log_start(tmp_path):
    """Epochs wholly below the first byte left go and the first one left starts there."""
    f = EpochFile(str(tmp_path))
    for e in (E(1, 0), E(2, 100), E(3, 200)):
        f.append(*e)
    assert f.truncate_prefix(150) == [E(1, 0)]
    assert f.entries == [E(2, 150), E(3, 200)]
    assert f.truncate_prefix(200) == [E(2, 150)]
    assert EpochFile(str(tmp_path)).load() == [E(3, 200)]


def test_epoch_at_steps_over_empty_epochs():
    """The record at an offset belongs to the last epoch starting at or before it."""
    entries = [E(1, 0), E(2, 100), E(3, 100), E(4, 250)]
    assert epoch_at(entries, 50, 400) == (E(1, 0), 100)
    assert epoch_at(entries, 100, 400) == (E(3, 100), 250)
    assert epoch_at(entries, 399, 400) == (E(4, 250), 400)
    assert epoch_at([E(1, 10)], 5, 400) is None


def test_truncation_examples_from_rip44():
    """RIP-44's cases: the truncation point is the smaller end of the last common epoch."""
    # (1) both in epoch 0, the slave ends earlier: keep what it has.
    assert truncation_point([E(0, 0)], 900, [E(0, 0)], 1000) == (900, 0)
    # (2) A (old master) wrote 900-1000 in epoch 0 nobody got; B became master of epoch 1 at 900.
    assert truncation_point([E(0, 0)], 1000, [E(0, 0), E(1, 900)], 1200) == (900, 0)
    # (5) B and C both had epoch 1 from 800; the new master's epoch 2 starts at 800.
    assert truncation_point([E(0, 0), E(1, 800)], 950, [E(0, 0), E(1, 800), E(2, 800)], 1000) == (800, 1)
    # nothing in common: no point.
    assert truncation_point([E(5, 0)], 100, [E(6, 0)], 100) is None


def test_an_oldest_epoch_moved_by_retention_still_matches():
    """Retention moved one side's first epoch start: the same epoch still matches where both hold it."""
    assert truncation_point([E(1, 5000)], 6000, [E(1, 0)], 7000) == (6000, 1)
    assert truncation_point([E(1, 0), E(2, 100)], 900, [E(2, 400)], 700) == (700, 2)
    # the master's epoch 1 ended before the slave's (moved) start: they cannot share it
    assert truncation_point([E(1, 5000)], 6000, [E(1, 0), E(2, 3000)], 7000) is None
    # a later epoch with another start is not shared: the walk goes on to the older one
    assert truncation_point([E(1, 0), E(2, 100)], 900, [E(1, 0), E(2, 200)], 900) == (100, 1)


@st.composite
def _diverged(draw):
    """A shared history, then the slave and the master each going on alone (epoch numbers are never reused)."""
    n = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    shared, start, epoch = [], 0, 0
    for length in lengths[:-1]:
        epoch += draw(st.integers(1, 3))
        shared.append(E(epoch, start))
        start += length
    epoch += draw(st.integers(1, 3))
    shared.append(E(epoch, start))
    last_start = start
    a, b = draw(st.integers(0, 300)), draw(st.integers(0, 300))  # how far each got in the last shared epoch
    numbers = iter(range(epoch + 1, epoch + 40))

    def alone(start, count):
        out = []
        for _ in range(count):
            out.append(E(next(numbers), start))
            start += draw(st.integers(0, 200))
        return out, start

    slave_own, slave_end = alone(last_start + a, draw(st.integers(0, 3)))
    master_own, master_end = alone(last_start + b, draw(st.integers(0, 3)))
    if not slave_own:
        slave_end = last_start + a
    if not master_own:
        master_end = last_start + b
    return shared + slave_own, slave_end, shared + master_own, master_end, last_start + min(a, b), epoch


@settings(max_examples=300, deadline=None)
@given(_diverged())
def test_walk_finds_the_end_of_the_shared_history(case):
    """Whatever each side wrote alone, the walk truncates to exactly where their shared history ends."""
    local, local_end, master, master_end, expected, common = case
    assert truncation_point(local, local_end, master, master_end) == (expected, common)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 2**40)), max_size=8))
def test_file_round_trips_any_ordered_list(tmp_path_factory, pairs):
    """Any valid epoch list written is read back the same."""
    entries, epoch, start = [], -1, 0
    for de, ds in pairs:
        epoch, start = epoch + 1 + de, start + ds
        entries.append(E(epoch, start))
    d = tmp_path_factory.mktemp("epochs")
    f = EpochFile(str(d))
    f.replace(entries)
    assert EpochFile(str(d)).load() == entries
