"""Unit tests of the timer wheel: slots, wrap-around, snapshots."""

import os

import pytest

from store.timer_wheel import PREVIOUS_SUFFIX, WHEEL_FILE, TimerWheel, WheelFileError, write_snapshot


def test_empty_slot_and_put_get():
    """An untouched slot is empty; a put slot reads back with its time normalised to the precision."""
    w = TimerWheel(8, 100)
    assert w.get_slot(1234).num == 0 and w.get_slot(1234).last_pos == -1
    w.put_slot(1200, 60, 180, 3)
    s = w.get_slot(1299)
    assert (s.time_ms, s.first_pos, s.last_pos, s.num) == (1200, 60, 180, 3)


def test_wrapped_slot_counts_as_empty():
    """A slot that holds time t reads as empty for t + window, which shares its index."""
    w = TimerWheel(8, 100)
    w.put_slot(1200, 0, 0, 1)
    assert w.get_slot(1200 + w.window_ms).num == 0
    w.put_slot(1200 + w.window_ms, 60, 60, 1)
    assert w.get_slot(1200).num == 0


def test_reset_only_clears_the_time_it_holds():
    """reset_slot() empties a consumed slot but leaves a newer time sharing the index alone."""
    w = TimerWheel(8, 100)
    w.put_slot(1200 + w.window_ms, 60, 60, 1)
    w.reset_slot(1200)
    assert w.get_slot(1200 + w.window_ms).num == 1
    w.reset_slot(1200 + w.window_ms)
    assert w.get_slot(1200 + w.window_ms).num == 0


def test_save_load_round_trip_keeps_previous(tmp_path):
    """save() writes a snapshot with its log position and read time and keeps the previous one."""
    w = TimerWheel(8, 100)
    w.put_slot(300, 0, 120, 3)
    w.save(str(tmp_path), log_pos=180, read_time_ms=200, tail_crc=7)
    w.put_slot(400, 180, 180, 1)
    w.save(str(tmp_path), log_pos=240, read_time_ms=300, tail_crc=8)
    snap = TimerWheel.load(os.path.join(tmp_path, WHEEL_FILE), 8, 100)
    assert (snap.log_pos, snap.read_time_ms, snap.tail_crc) == (240, 300, 8)
    assert snap.wheel.get_slot(400).num == 1
    prev = TimerWheel.load(os.path.join(tmp_path, WHEEL_FILE + PREVIOUS_SUFFIX), 8, 100)
    assert (prev.log_pos, prev.read_time_ms) == (180, 200) and prev.wheel.get_slot(400).num == 0


def test_bad_snapshots_are_refused(tmp_path):
    """A missing, corrupt, truncated or differently shaped snapshot raises WheelFileError."""
    path = os.path.join(tmp_path, WHEEL_FILE)
    with pytest.raises(WheelFileError, match="missing"):
        TimerWheel.load(path, 8, 100)
    TimerWheel(8, 100).save(str(tmp_path), 0, None)
    with pytest.raises(WheelFileError, match="geometry"):
        TimerWheel.load(path, 16, 100)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 1
    open(path, "wb").write(data)
    with pytest.raises(WheelFileError, match="CRC32C"):
        TimerWheel.load(path, 8, 100)
    open(path, "wb").write(data[:-3])
    with pytest.raises(WheelFileError):
        TimerWheel.load(path, 8, 100)


def test_snapshot_written_later_is_the_wheel_as_it_was_when_taken(tmp_path):
    """A snapshot taken, then the wheel changed, then written (as on a worker): the file holds the old wheel."""
    w = TimerWheel(8, 100)
    w.put_slot(300, 60, 120, 2)
    image = w.snapshot(log_pos=180, read_time_ms=200, tail_crc=7)
    w.put_slot(300, 60, 180, 3)
    w.put_slot(500, 240, 240, 1)
    write_snapshot(str(tmp_path), image)
    with open(tmp_path / WHEEL_FILE, "rb") as f:
        assert f.read() == image.encode()
    snap = TimerWheel.load(str(tmp_path / WHEEL_FILE), 8, 100)
    assert (snap.log_pos, snap.read_time_ms, snap.tail_crc) == (180, 200, 7)
    assert snap.wheel.get_chain(300) == (60, 120, 2)
    assert snap.wheel.get_chain(500) == (-1, -1, 0)
