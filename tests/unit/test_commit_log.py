"""Unit tests of the commit log: segments, reads, recovery fixtures and retention."""

import logging
import os
import shutil

import pytest

from store import reader
from store import record as rec
from store.commit_log import CommitLog, CommitLogError

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "commitlog")
GOOD_PREFIX = 255  # bytes of the three good records in every fixture


def _msg(i, size=10):
    return rec.encode(rec.Message(topic=f"t/{i}", body=bytes(size)), store_ts=i)


def _open(path, segment_size=4096):
    log = CommitLog(str(path), segment_size)
    log.open()
    return log


def test_append_then_read_every_record(tmp_path):
    """Records read back by offset are the ones appended, in one batch write."""
    log = _open(tmp_path)
    offsets = log.append([_msg(i) for i in range(10)])
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert [log.read(o).topic for o in offsets] == [f"t/{i}" for i in range(10)]
    assert log.max_offset == offsets[-1] + len(_msg(9))


def test_segments_roll_with_dense_offsets(tmp_path):
    """A batch that overflows a segment continues in a new segment named by its base offset."""
    log = _open(tmp_path, segment_size=4096)
    offsets = log.append([_msg(i, size=300) for i in range(40)])
    segs = log.segments()
    assert len(segs) > 2
    for prev, nxt in zip(segs, segs[1:]):
        assert prev.base + prev.size == nxt.base
    assert [r.offset for r in log.iterate(0)] == offsets
    assert all(s.size <= 4096 for s in segs)


def test_reopen_continues_where_it_stopped(tmp_path):
    """A clean reopen appends after the last record and scans nothing it trusts."""
    log = _open(tmp_path)
    log.append([_msg(i) for i in range(5)])
    end = log.max_offset
    log.close()
    log = _open(tmp_path)
    assert log.max_offset == end
    assert log.recovery.truncated_bytes == 0
    assert log.append([_msg(99)]) == [end]


@pytest.mark.parametrize("fixture,reason", [
    ("truncated_header", "incomplete"),
    ("truncated_body", "incomplete"),
    ("bad_crc", "CRC32C"),
    ("unknown_version", "version 9"),
])
def test_recovery_truncates_damaged_tail(tmp_path, caplog, fixture, reason):
    """Each golden damaged tail is cut back to the last good record, logged, and start-up goes on."""
    shutil.copytree(os.path.join(FIXTURES, fixture), tmp_path / "cl")
    damaged = os.path.getsize(tmp_path / "cl" / "00000000000000000000")
    with caplog.at_level(logging.WARNING, logger="twistmq.store.commit_log"):
        log = _open(tmp_path / "cl")
    report = log.recovery
    assert report.end_offset == GOOD_PREFIX
    assert report.truncated_at == GOOD_PREFIX
    assert report.truncated_bytes == damaged - GOOD_PREFIX
    assert reason in report.reason
    assert "commitlog_truncated" in caplog.text
    assert [r.topic for r in log.iterate(0)] == ["dev/0/temp", "dev/1/temp", "dev/2/temp"]
    assert log.append([_msg(7)]) == [GOOD_PREFIX]


def test_corruption_in_middle_segment_drops_later_segments(tmp_path):
    """A corrupt record after the checkpoint cuts the log there, later segments included."""
    log = _open(tmp_path, segment_size=4096)
    log.append([_msg(i, size=300) for i in range(40)])
    log.close()
    os.remove(tmp_path / "checkpoint")  # force a full scan
    segs = reader.list_segments(str(tmp_path))
    with open(segs[1].path, "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff")
    log = _open(tmp_path)
    assert log.recovery.truncated_at == segs[1].base
    assert len(log.segments()) == 2 and log.max_offset == segs[1].base


def test_read_outside_log_is_a_clear_error(tmp_path):
    """Reading past the end or before the start names the valid range."""
    log = _open(tmp_path)
    log.append([_msg(1)])
    with pytest.raises(CommitLogError, match="outside the log"):
        log.read(10_000)


def test_sync_moves_checkpoint(tmp_path):
    """sync() fsyncs, returns the durable offset and records it for the next recovery."""
    log = _open(tmp_path)
    log.append([_msg(i) for i in range(3)])
    assert log.sync() == log.max_offset
    assert open(tmp_path / "checkpoint").read().strip() == str(log.max_offset)


def test_delete_oldest_keeps_active_segment(tmp_path):
    """Deleting segments removes the oldest files first and never the one being written."""
    log = _open(tmp_path, segment_size=4096)
    log.append([_msg(i, size=300) for i in range(60)])
    segments = log.segments()
    deleted = log.delete_oldest(2, "test")
    assert deleted == [s.path for s in segments[:2]]
    assert log.min_offset == segments[2].base == log.segments()[0].base
    assert [r.offset for r in log.iterate(0)][0] == log.min_offset
    log.delete_oldest(1000, "test")
    assert log.segments() == segments[-1:]
    log.append([_msg(1)])  # still writable


def test_read_run_equals_single_reads(tmp_path):
    """A contiguous run read at once decodes to the same records as reading them one by one, across a roll."""
    log = CommitLog(str(tmp_path), 4096)
    log.open()
    offsets = log.append([rec.encode(rec.Message(f"t/{i}", b"x" * 300), 1) for i in range(30)])
    sizes = [b - a for a, b in zip(offsets, offsets[1:] + [log.max_offset])]
    start = 5
    run = log.read_run(offsets[start], sizes[start:start + 20])
    assert run == [log.read(o, n) for o, n in zip(offsets[start:start + 20], sizes[start:start + 20])]
    log.close()


def test_roll_fsyncs_nothing_on_the_appending_thread(tmp_path, monkeypatch):
    """A segment roll owes its fsyncs (old segment, directory) to the next sync(): append itself never fsyncs."""
    log = _open(tmp_path, segment_size=4096)
    fsynced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsynced.append(fd), real_fsync(fd))[1])
    log.append([_msg(i, size=300) for i in range(40)])
    assert len(log.segments()) > 1 and fsynced == [], "rolling wrote no fsync on the appender's thread"
    assert log.sync() == log.max_offset
    rolled = len(log.segments()) - 1
    assert len(fsynced) == rolled + 2, "every rolled segment, the directory once, then the active segment"


def test_sync_after_a_failed_roll_fsync_retries_it(tmp_path, monkeypatch):
    """If fsyncing a rolled segment fails, sync() claims nothing new and the next sync fsyncs it again."""
    log = _open(tmp_path, segment_size=4096)
    log.append([_msg(i, size=300) for i in range(20)])
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(OSError):
        log.sync()
    assert log.synced_offset == 0
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert log.sync() == log.max_offset
