"""The check of a controller's Raft files before pysyncobj opens them: an unreadable one stops the start.

pysyncobj reads its files forgivingly: a snapshot it cannot load is logged and skipped (the
controller would start with empty metadata and forget members and worker ids), a journal whose
records do not add up is read as far as it goes or fails deep in its constructor, and a meta file
(the current term and vote) it cannot unpickle is taken as empty (a controller could vote twice in
one term). So before ``SyncObj`` is made, each file that exists is read the way pysyncobj will
read it and checked; the first that fails is ``UnreadableRaftFile`` naming it, which the role
reports in one line. A missing file is fine (a first start, or a journal cut by a snapshot).

Formats (pysyncobj 0.3): the journal is a header (``PYSYNCOBJ`` in 24 bytes, its version in 8,
format version and the end offset of the last record, 4 bytes each, little-endian), then records
``size | index (8) | term (8) | command | size``; the snapshot is a gzipped pickle of
``([state, consumer state...], last applied entry, the entry before, nodes)``; the meta file a
pickled dict.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct

from cluster.controller.metadata import Metadata

_NAME, _VERSION = 24, 8
_FIRST_RECORD = _NAME + _VERSION + 4 + 4
_MAGIC = b"PYSYNCOBJ"
_FORMAT = 1


class UnreadableRaftFile(Exception):
    """A Raft file in the data dir that pysyncobj would misread; the message names it and what to do."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"Raft file {path} is unreadable ({why}): this controller would start without the "
                         f"metadata it holds. Restore the file from a backup, or move it away to rejoin empty "
                         f"and catch up from the other controllers")
        self.path = path


def check_raft_files(journal: str, snapshot: str) -> None:
    """Raise ``UnreadableRaftFile`` for the first of the journal, its meta file and the snapshot that is unreadable."""
    if os.path.exists(journal):
        check_journal(journal)
    if os.path.exists(journal + ".meta"):
        check_meta(journal + ".meta")
    if os.path.exists(snapshot):
        check_snapshot(snapshot)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise UnreadableRaftFile(path, exc.strerror or str(exc)) from None


def check_journal(path: str) -> None:
    """The journal's header and every record up to its end offset, as pysyncobj's ``FileJournal`` walks them."""
    data = _read(path)
    if not data:
        return  # pysyncobj writes a fresh header into an empty file
    if len(data) < _FIRST_RECORD or data[:_NAME].rstrip(b"\0") != _MAGIC:
        raise UnreadableRaftFile(path, "not a pysyncobj journal: its header is missing")
    fmt, end = struct.unpack_from("<II", data, _NAME + _VERSION)
    if fmt != _FORMAT:
        raise UnreadableRaftFile(path, f"journal format {fmt}, this pysyncobj reads {_FORMAT}")
    if not _FIRST_RECORD <= end <= len(data):
        raise UnreadableRaftFile(path, f"its last record ends at {end}, outside the file ({len(data)} bytes)")
    offset, previous = _FIRST_RECORD, None
    while offset < end:
        if offset + 4 > end:
            raise UnreadableRaftFile(path, f"a record at byte {offset} is cut off")
        (size,) = struct.unpack_from("<I", data, offset)
        if size < 16 or offset + 8 + size > end:
            raise UnreadableRaftFile(path, f"the record at byte {offset} has a bad size ({size})")
        (trailer,) = struct.unpack_from("<I", data, offset + 4 + size)
        if trailer != size:
            raise UnreadableRaftFile(path, f"the record at byte {offset} does not end with its size")
        index, term = struct.unpack_from("<QQ", data, offset + 4)
        if previous is not None and (index != previous[0] + 1 or term < previous[1]):
            raise UnreadableRaftFile(path, f"the record at byte {offset} (index {index}, term {term}) does not "
                                     f"follow index {previous[0]}, term {previous[1]}")
        previous = (index, term)
        offset += size + 8


def check_meta(path: str) -> None:
    """The journal's meta file (term and vote): a pickled dict."""
    try:
        meta = pickle.loads(_read(path))
    except UnreadableRaftFile:
        raise
    except Exception as exc:  # noqa: BLE001 - any way it fails to load is an unreadable file
        raise UnreadableRaftFile(path, f"not a pickled map: {exc.__class__.__name__}") from None
    if not isinstance(meta, dict):
        raise UnreadableRaftFile(path, f"holds a {type(meta).__name__}, not a map")


def check_snapshot(path: str) -> None:
    """The snapshot loads as pysyncobj loads it, and its metadata as ``Metadata.from_dict`` reads it."""
    try:
        with open(path, "rb") as f, gzip.GzipFile(fileobj=f) as g:
            data = pickle.load(g)  # our own file, as pysyncobj itself loads it
    except OSError as exc:
        raise UnreadableRaftFile(path, f"not a gzipped snapshot: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a truncated or garbled pickle fails in many ways
        raise UnreadableRaftFile(path, f"its pickle does not load: {exc.__class__.__name__}: {exc}") from None
    try:
        state = data[0][1]
        data[1][1], data[2][1]  # the last applied entries: (command, index, term)
        Metadata.from_dict(state)
    except Exception as exc:  # noqa: BLE001 - a snapshot of another shape or schema
        raise UnreadableRaftFile(path, f"not a controller's snapshot: {exc.__class__.__name__}: {exc}") from None
