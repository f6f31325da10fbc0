"""Unit tests of the timer log: unit layout, segments, torn tails."""

import os

import pytest

from store.timer_log import UNIT_SIZE, TimerLog, TimerLogError, TimerUnit, UnitFlag, decode_unit


def _unit(i, prev=-1, flags=UnitFlag.NORMAL):
    return TimerUnit(prev, flags, write_time=1000, slot_time=1100 + i, deliver_at=1050 + i,
                     cl_offset=10 * i, cl_size=7, topic_hash=0xABCD)


def _open(path, **kw):
    log = TimerLog(str(path), **kw)
    report = log.open()
    return log, report


def test_unit_round_trip_and_size():
    """A unit encodes to UNIT_SIZE bytes and decodes to the same fields."""
    u = _unit(3, prev=120, flags=UnitFlag.ROLL | UnitFlag.REQUEUE)
    data = u.encode()
    assert len(data) == UNIT_SIZE == 60
    assert decode_unit(data) == u


def test_flipped_bit_is_detected():
    """Any corrupted byte of a unit fails the CRC, magic or size check."""
    data = bytearray(_unit(1).encode())
    for i in (0, 5, 13, 30, 59):
        bad = bytearray(data)
        bad[i] ^= 0x10
        with pytest.raises(TimerLogError):
            decode_unit(bytes(bad))


def test_append_returns_dense_positions_and_read_back(tmp_path):
    """Positions are consecutive multiples of UNIT_SIZE, readable before and after write-out."""
    log, _ = _open(tmp_path)
    positions = [log.append(_unit(i)) for i in range(5)]
    assert positions == [i * UNIT_SIZE for i in range(5)]
    assert log.read(2 * UNIT_SIZE) == _unit(2)  # still in the write buffer
    log.write_out()
    assert log.read(4 * UNIT_SIZE) == _unit(4)
    with pytest.raises(TimerLogError):
        log.read(5 * UNIT_SIZE)


def test_segments_roll_and_survive_reopen(tmp_path):
    """Units spill into new segment files and are all there after a reopen."""
    log, _ = _open(tmp_path, segment_units=4)
    for i in range(10):
        log.append(_unit(i))
    log.close()
    log, report = _open(tmp_path, segment_units=4)
    assert log.segments() == [0, 4 * UNIT_SIZE, 8 * UNIT_SIZE]
    assert report.truncated_bytes == 0 and report.end == 10 * UNIT_SIZE
    assert [u for _, u in log.iter_units(0)] == [_unit(i) for i in range(10)]
    assert [p for p, _ in log.iter_units(3 * UNIT_SIZE, 6 * UNIT_SIZE)] == [3 * UNIT_SIZE, 4 * UNIT_SIZE, 5 * UNIT_SIZE]


def test_torn_tail_is_cut_and_reported(tmp_path):
    """A partial unit at the end of the last segment is truncated on open and its size reported."""
    log, _ = _open(tmp_path)
    for i in range(3):
        log.append(_unit(i))
    log.close()
    path = os.path.join(tmp_path, os.listdir(tmp_path)[0])
    with open(path, "ab") as f:
        f.write(_unit(3).encode()[:25])
    log, report = _open(tmp_path)
    assert report.truncated_bytes == 25 and "torn" in report.reason
    assert log.end == 3 * UNIT_SIZE and os.path.getsize(path) == 3 * UNIT_SIZE
    assert log.append(_unit(3)) == 3 * UNIT_SIZE


def test_corrupt_last_units_are_cut(tmp_path):
    """Complete but invalid units at the tail (e.g. zeros after a power cut) are cut too."""
    log, _ = _open(tmp_path)
    for i in range(3):
        log.append(_unit(i))
    log.close()
    path = os.path.join(tmp_path, os.listdir(tmp_path)[0])
    with open(path, "ab") as f:
        f.write(b"\0" * UNIT_SIZE * 2)
    log, report = _open(tmp_path)
    assert report.truncated_bytes == 2 * UNIT_SIZE and log.end == 3 * UNIT_SIZE


def test_truncate_across_segments_and_rewrite(tmp_path):
    """truncate() removes later segments; rewrite() replaces one unit in place."""
    log, _ = _open(tmp_path, segment_units=4)
    for i in range(10):
        log.append(_unit(i))
    log.write_out()
    assert log.truncate(5 * UNIT_SIZE) == 5 * UNIT_SIZE
    assert log.segments() == [0, 4 * UNIT_SIZE] and log.end == 5 * UNIT_SIZE
    log.rewrite(UNIT_SIZE, _unit(1, prev=0))
    assert log.read(UNIT_SIZE).prev_pos == 0
    assert log.append(_unit(5)) == 5 * UNIT_SIZE


def test_only_the_oldest_sealed_segment_can_be_deleted(tmp_path):
    """delete_segment() drops the oldest sealed segment and refuses the active one."""
    log, _ = _open(tmp_path, segment_units=2)
    for i in range(5):
        log.append(_unit(i))
    with pytest.raises(TimerLogError):
        log.delete_segment(2 * UNIT_SIZE)
    assert log.last_write_time(0) == 1000
    log.delete_segment(0)
    assert log.start == 2 * UNIT_SIZE
    with pytest.raises(TimerLogError):
        log.read(0)
