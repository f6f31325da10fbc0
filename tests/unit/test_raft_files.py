"""The controller's check of its Raft files: pysyncobj's journal, meta and snapshot formats, each broken one named."""

from __future__ import annotations

import gzip
import pickle
import struct

import pytest

from cluster.controller.metadata import Metadata
from cluster.controller.raft_files import UnreadableRaftFile, check_raft_files


def _journal(records, end=None) -> bytes:
    body = b"".join(struct.pack("<I", 16 + len(c)) + struct.pack("<QQ", i, t) + c + struct.pack("<I", 16 + len(c))
                    for c, i, t in records)
    header = b"PYSYNCOBJ".ljust(24, b"\0") + b"0.3.14".ljust(8, b"\0")
    end = 40 + len(body) if end is None else end
    return header + struct.pack("<II", 1, end) + body + b"\0" * 64  # mmap'd files are longer than their records


def _snapshot(state) -> bytes:
    return gzip.compress(pickle.dumps(([{}, state], (b"c", 5, 1), (b"c", 4, 1), set())))


@pytest.fixture
def files(tmp_path):
    journal, snapshot = tmp_path / "raft.journal", tmp_path / "raft.snapshot"
    journal.write_bytes(_journal([(b"a", 1, 1), (b"bb", 2, 1), (b"c", 3, 2)]))
    (tmp_path / "raft.journal.meta").write_bytes(pickle.dumps({"term": 2, "votedForNodeId": None}))
    snapshot.write_bytes(_snapshot(Metadata().to_dict()))
    return journal, snapshot


def test_sound_files_and_missing_files_pass(files, tmp_path):
    """Well-formed files pass; a data dir without them (a first start) passes too."""
    check_raft_files(str(files[0]), str(files[1]))
    check_raft_files(str(tmp_path / "none.journal"), str(tmp_path / "none.snapshot"))


@pytest.mark.parametrize("records, end, why", [
    ([(b"a", 1, 1), (b"b", 3, 1)], None, "does not follow"),
    ([(b"a", 2, 2), (b"b", 3, 1)], None, "does not follow"),
    ([(b"a", 1, 1)], 40 + 100_000, "outside the file"),
    ([(b"a", 1, 1)], 40 + 10, "bad size"),
])
def test_a_journal_that_does_not_add_up_is_named(files, records, end, why):
    """Records out of order, an end past the file, a record cut by the end: UnreadableRaftFile naming it."""
    files[0].write_bytes(_journal(records, end))
    with pytest.raises(UnreadableRaftFile, match=why) as info:
        check_raft_files(str(files[0]), str(files[1]))
    assert info.value.path == str(files[0]) and str(files[0]) in str(info.value)


@pytest.mark.parametrize("content, why", [
    (b"not gzip", "gzipped"),
    (gzip.compress(b"\x80\x04garbage"), "pickle does not load"),
    (gzip.compress(pickle.dumps(([{}, {"schema": 99}], (b"c", 5, 1), (b"c", 4, 1), set()))), "schema"),
    (gzip.compress(pickle.dumps("a string")), "not a controller's snapshot"),
])
def test_a_snapshot_that_does_not_load_is_named(files, content, why):
    """A snapshot that is not gzip, not a pickle, another schema or another shape: UnreadableRaftFile naming it."""
    files[1].write_bytes(content)
    with pytest.raises(UnreadableRaftFile, match=why) as info:
        check_raft_files(str(files[0]), str(files[1]))
    assert info.value.path == str(files[1])


def test_a_meta_file_that_is_not_a_map_is_named(files):
    """The journal's meta file (term and vote) must unpickle to a map."""
    meta = files[0].with_name("raft.journal.meta")
    meta.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(UnreadableRaftFile, match="not a map"):
        check_raft_files(str(files[0]), str(files[1]))
