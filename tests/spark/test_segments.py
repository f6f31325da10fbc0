"""Unit tests of header hops and partition planning over segment files (no Spark)."""

import os
import random

import numpy as np
import pytest

from store import reader
from store import record as rec

from spark import segments
from store.ha_sync import ConfirmOffsetFile
from tests.spark.dataset import publish_dataset


def _items(n, start_ts=1_000, size=20):
    return [(rec.Message(topic=f"t/{i % 3}", body=bytes([65 + i % 26]) * size, client_id="c"), start_ts + i)
            for i in range(n)]


def _commitlog(tmp_path):
    return os.path.join(str(tmp_path), "commitlog")


def test_latest_boundary_stops_before_a_torn_tail(tmp_path):
    """A record still being written is not counted: the boundary stays before it."""
    pub = publish_dataset(str(tmp_path), _items(5))
    seg = reader.list_segments(_commitlog(tmp_path))[0]
    end_of_five = seg.size
    partial = rec.encode(rec.Message(topic="t/x", body=b"z" * 50), 9_999)
    with open(seg.path, "ab") as f:
        f.write(partial[:30])
    assert segments.latest_boundary(_commitlog(tmp_path), 0) == (end_of_five, 5)
    with open(seg.path, "ab") as f:
        f.write(partial[30:])
    assert segments.latest_boundary(_commitlog(tmp_path), pub[2].offset) == (end_of_five + len(partial), 4)


def test_latest_boundary_walks_dense_segments_and_honours_limits(tmp_path):
    """Hops cross segment rolls; max_records and stop_at cut the hop at a record boundary."""
    pub = publish_dataset(str(tmp_path), _items(30), segment_bytes=300)
    directory = _commitlog(tmp_path)
    segs = reader.list_segments(directory)
    assert len(segs) > 3
    assert [s.base for s in segs[1:]] == [s.base + s.size for s in segs[:-1]]  # dense offsets
    end = segs[-1].base + segs[-1].size
    assert segments.latest_boundary(directory, 0) == (end, 30)
    assert segments.latest_boundary(directory, pub[4].offset, max_records=7) == (pub[11].offset, 7)
    # stop_at in the middle of record 20: records starting before it are included
    assert segments.latest_boundary(directory, 0, stop_at=pub[20].offset + 3)[0] == pub[21].offset


def test_hop_steps_over_a_corrupt_header(tmp_path):
    """A garbled header is skipped by resynchronising on the next record with a good CRC."""
    pub = publish_dataset(str(tmp_path), _items(6))
    seg = reader.list_segments(_commitlog(tmp_path))[0]
    with open(seg.path, "r+b") as f:
        f.seek(pub[2].offset + 1)
        f.write(b"\x00\x00\x00\x00")  # destroy record 2's magic
    end, n, _ = segments.hop_segment(seg, 0)
    assert end == seg.size and n == 5


def test_plan_ranges_splits_big_segments_at_record_boundaries(tmp_path):
    """Every range starts on a record boundary and the ranges tile the log with no gap or overlap."""
    pub = publish_dataset(str(tmp_path), _items(60), segment_bytes=1500)
    directory = _commitlog(tmp_path)
    ranges = segments.plan_ranges(directory, max_bytes=400)
    starts = {p.offset for p in pub}
    assert len(ranges) > len(reader.list_segments(directory))
    assert all(r.start in starts for r in ranges)
    assert ranges[0].start == 0 and all(a.end == b.start for a, b in zip(ranges, ranges[1:]))
    seen = [r.offset for part in ranges
            for r in reader.scan_segment(reader.Segment(part.base, part.path), part.start, part.end)]
    assert seen == [p.offset for p in pub]


def test_plan_ranges_between_offsets(tmp_path):
    """A [start, end) plan (a streaming micro-batch) covers exactly the records in it."""
    pub = publish_dataset(str(tmp_path), _items(40), segment_bytes=500)
    directory = _commitlog(tmp_path)
    ranges = segments.plan_ranges(directory, pub[7].offset, pub[33].offset, max_bytes=10_000)
    seen = [r.offset for part in ranges
            for r in reader.scan_segment(reader.Segment(part.base, part.path), part.start, part.end)]
    assert seen == [p.offset for p in pub[7:33]]
    assert segments.plan_ranges(directory, pub[5].offset, pub[5].offset) == []


def test_empty_log_plans_nothing(tmp_path):
    """A data dir with an empty commitlog/ yields no ranges and offset 0."""
    os.makedirs(_commitlog(tmp_path))
    assert segments.plan_ranges(_commitlog(tmp_path)) == []
    assert segments.latest_boundary(_commitlog(tmp_path), 0) == (0, 0)


def _header_hop(segment, start, max_records=None, split_bytes=None, stop_at=None):
    """hop_segment's answer from the header hop alone (no numpy chain): the reference it must equal."""
    with open(segment.path, "rb") as f:
        buf = f.read()
    limit = None if stop_at is None else stop_at - segment.base
    return segments._hop(buf, segment.base, start - segment.base, np.zeros(0, np.int64), start - segment.base,
                         max_records, split_bytes, limit)


MARKER_BODY = b"x" + segments.MARKER + b"\x00\x00\x00\x40" + b"y" * 30  # a look-alike header inside a payload


@pytest.mark.parametrize("damage", ["clean", "marker payloads", "torn tail", "corrupt header", "junk tail"])
def test_numpy_chain_hops_exactly_like_the_header_hop(tmp_path, damage):
    """Ends, counts and split points equal the header hop's, for every start, limit and split size tried."""
    rng = random.Random(damage)
    items = [(rec.Message(topic=f"t/{i % 3}", body=MARKER_BODY if damage == "marker payloads" and i % 4 == 1
                          else bytes([65 + i % 26]) * rng.randrange(0, 60), client_id="c"), 1_000 + i)
             for i in range(80)]
    pub = publish_dataset(str(tmp_path), items)
    seg = reader.list_segments(_commitlog(tmp_path))[0]
    with open(seg.path, "r+b") as f:
        if damage == "torn tail":
            f.seek(0, 2)
            f.write(rec.encode(rec.Message(topic="t/x", body=b"z" * 50), 9_999)[:40])
        if damage == "corrupt header":
            f.seek(pub[30].offset + 2)
            f.write(b"\xff\xff")
        if damage == "junk tail":
            f.seek(0, 2)
            f.write(segments.MARKER + b"\xff" * 30)
    offsets = [p.offset for p in pub]
    for start in (0, offsets[1], offsets[29], offsets[-1]):
        for kw in ({}, {"max_records": 7}, {"max_records": 500}, {"split_bytes": 300}, {"split_bytes": 1},
                   {"stop_at": offsets[50] + 2}, {"stop_at": offsets[70], "split_bytes": 150, "max_records": 60}):
            assert segments.hop_segment(seg, start, **kw) == _header_hop(seg, start, **kw), (start, kw)


def test_plan_ranges_cuts_a_segment_into_about_equal_parts(tmp_path):
    """A segment a bit over maxPartitionBytes becomes two halves, not a full part and a small rest."""
    publish_dataset(str(tmp_path), _items(100, size=60))
    directory = _commitlog(tmp_path)
    (seg,) = reader.list_segments(directory)
    record = seg.size // 100
    ranges = segments.plan_ranges(directory, max_bytes=int(seg.size * 0.6))
    assert len(ranges) == 2
    assert abs((ranges[0].end - ranges[0].start) - (ranges[1].end - ranges[1].start)) <= 2 * record


def test_the_reader_stops_at_the_brokers_confirm_offset(tmp_path):
    """With DATA_DIR/confirm_offset, plans, boundaries and the stream's end stop there; without it, the whole log."""
    pub = publish_dataset(str(tmp_path), _items(10), segment_bytes=300)
    directory = _commitlog(tmp_path)
    whole = segments.latest_boundary(directory, 0)
    assert whole[1] == 10
    ConfirmOffsetFile(str(tmp_path)).write(pub[6].offset)
    assert segments.latest_boundary(directory, 0) == (pub[6].offset, 6)
    assert segments.physical_end(directory) == pub[6].offset
    planned = segments.plan_ranges(directory)
    assert planned[-1].end == pub[6].offset
    assert segments.plan_ranges(directory, pub[2].offset, whole[0])[-1].end == pub[6].offset
    os.remove(os.path.join(str(tmp_path), "confirm_offset"))
    assert segments.latest_boundary(directory, 0) == whole
    assert segments.plan_ranges(directory)[-1].end == whole[0]
