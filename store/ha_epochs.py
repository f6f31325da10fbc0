"""The epoch file: which master epoch wrote which range of the commit log, and the handshake's walk over it.

A broker group changes master by epochs (RocketMQ's master epoch, Raft's term):
each new master starts an epoch at the log offset where its writes begin, and
every broker keeps the list ``epoch -> start offset`` in ``DATA_DIR/epochs``.
An epoch ends where the next one starts (the last one at the log's end), so a
(epoch, start offset) pair names one stretch of the log that one master wrote:
two brokers that hold the same pair hold the same bytes up to the smaller of
their two ends. That is the handshake's truncation rule (``truncation_point``).

File layout (text, one line per epoch, ascending)::

    twistmq-epochs 1
    EPOCH START_OFFSET
    ...

It is rewritten whole (temp file, fsync, rename, fsync of the directory) on
every change: it holds a handful of lines and changes once per failover.
Corrections: on recovery the epochs starting past the log's end go
(``truncate_suffix``); when retention deletes old segments the epochs that end
below the log's first byte go and the first one left starts there
(``truncate_prefix``).
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple, Sequence

from store.files import fsync_dir

log = logging.getLogger("twistmq.store.ha")

EPOCH_FILE = "epochs"
_MAGIC = "twistmq-epochs 1"


class EpochError(ValueError):
    """An epoch change that would break the file's order (the caller's mistake or a peer's bad input)."""


class EpochEntry(NamedTuple):
    """One epoch: the master epoch number and the commit-log offset where its first record is."""

    epoch: int
    start_offset: int


def check_entries(entries: Sequence[EpochEntry]) -> None:
    """Raise EpochError unless epochs strictly increase and start offsets never decrease."""
    for prev, cur in zip(entries, entries[1:]):
        if cur.epoch <= prev.epoch:
            raise EpochError(f"epoch {cur.epoch} follows epoch {prev.epoch}")
        if cur.start_offset < prev.start_offset:
            raise EpochError(f"epoch {cur.epoch} starts at {cur.start_offset}, before epoch {prev.epoch} "
                             f"({prev.start_offset})")
    for e in entries:
        if e.epoch < 0 or e.start_offset < 0:
            raise EpochError(f"negative epoch or offset in {e}")


def end_offset(entries: Sequence[EpochEntry], index: int, log_end: int) -> int:
    """Where epoch ``entries[index]`` ends: the next epoch's start, or ``log_end`` for the last one."""
    return entries[index + 1].start_offset if index + 1 < len(entries) else log_end


def epoch_at(entries: Sequence[EpochEntry], offset: int, log_end: int) -> tuple[EpochEntry, int] | None:
    """The epoch holding the record at ``offset`` and its end offset; None if no epoch covers it.

    Epochs of no length (a master that wrote nothing) are stepped over: the last
    epoch starting at or before ``offset`` holds it.
    """
    for i in range(len(entries) - 1, -1, -1):
        if entries[i].start_offset <= offset:
            end = end_offset(entries, i, log_end)
            return (entries[i], end) if offset < end or (offset == end == log_end) else None
    return None


def truncation_point(local: Sequence[EpochEntry], local_end: int,
                     master: Sequence[EpochEntry], master_end: int) -> tuple[int, int] | None:
    """The handshake's walk: (offset to truncate the local log to, last common epoch), or None.

    Walks the local epochs newest first to the last one the master holds with
    the same start offset; the logs agree up to the smaller of the two ends of
    that epoch. The oldest epoch of either list may start later than it did
    (retention moved it: ``EpochFile.truncate_prefix``): there the starts may
    differ, as long as the point is not below either. None when no epoch is
    common (the master's log no longer reaches back that far, or the logs never
    shared a master): nothing can be proven equal, so nothing may be replicated
    without an operator.
    """
    by_epoch = {e.epoch: i for i, e in enumerate(master)}
    for i in range(len(local) - 1, -1, -1):
        j = by_epoch.get(local[i].epoch)
        if j is None:
            continue
        point = min(end_offset(local, i, local_end), end_offset(master, j, master_end))
        if master[j].start_offset == local[i].start_offset:
            return point, local[i].epoch
        if (i == 0 or j == 0) and point >= max(master[j].start_offset, local[i].start_offset):
            return point, local[i].epoch
        # The same epoch with another start: not a shared history; an older epoch may be (RocketMQ walks on).
    return None


class EpochFile:
    """The epoch list of one data directory, kept on disk as it changes."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, EPOCH_FILE)
        self.directory = directory
        self.entries: list[EpochEntry] = []

    # -- reading ----------------------------------------------------------------------------

    def load(self) -> list[EpochEntry]:
        """Read the file (none yet: no epochs); raise EpochError if it is damaged."""
        try:
            with open(self.path, encoding="ascii") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            self.entries = []
            return []
        except (OSError, UnicodeDecodeError) as exc:
            raise EpochError(f"cannot read {self.path}: {exc}") from None
        if not lines or lines[0] != _MAGIC:
            raise EpochError(f"{self.path} is not an epoch file (first line {lines[:1]!r})")
        entries = []
        for n, line in enumerate(lines[1:], 2):
            parts = line.split()
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise EpochError(f"{self.path} line {n}: expected 'EPOCH START_OFFSET', got {line!r}")
            entries.append(EpochEntry(int(parts[0]), int(parts[1])))
        check_entries(entries)
        self.entries = entries
        return list(entries)

    @property
    def last(self) -> EpochEntry | None:
        """The newest epoch, if any."""
        return self.entries[-1] if self.entries else None

    @property
    def exists(self) -> bool:
        """Whether the file is on disk (a broker that never ran in a group has none)."""
        return os.path.exists(self.path)

    # -- changing -----------------------------------------------------------------------------

    def append(self, epoch: int, start_offset: int) -> None:
        """Record a new epoch that starts at ``start_offset``."""
        last = self.last
        if last is not None and epoch == last.epoch and start_offset == last.start_offset:
            return
        entries = self.entries + [EpochEntry(epoch, start_offset)]
        check_entries(entries)
        self._save(entries)

    def begin_epoch(self, epoch: int, log_min: int, log_max: int) -> EpochEntry:
        """This broker becomes master of ``epoch``: its writes start at the log's end.

        The very first epoch starts at the log's first byte instead: whatever the
        log holds then was written by nobody else (a node upgraded into a group).
        """
        start = log_max if self.entries else log_min
        self.append(epoch, start)
        return self.entries[-1]

    def replace(self, entries: Sequence[EpochEntry]) -> None:
        """Set the whole list (what a handshake or a correction computed)."""
        entries = list(entries)
        check_entries(entries)
        if entries != self.entries:
            self._save(entries)

    def keep_through(self, epoch: int) -> None:
        """Drop every epoch after ``epoch`` (the handshake's correction after truncating)."""
        self.replace([e for e in self.entries if e.epoch <= epoch])

    def truncate_suffix(self, log_end: int) -> list[EpochEntry]:
        """Drop the epochs that start past ``log_end`` (recovery cut the log); return what went."""
        gone = [e for e in self.entries if e.start_offset > log_end]
        if gone:
            self.replace([e for e in self.entries if e.start_offset <= log_end])
            log.warning("epochs_truncated log_end=%d dropped=%s", log_end, gone)
        return gone

    def truncate_prefix(self, log_min: int) -> list[EpochEntry]:
        """Retention deleted the log below ``log_min``: drop the epochs that end there, start the first at it."""
        entries = list(self.entries)
        gone = []
        while len(entries) > 1 and entries[1].start_offset <= log_min:
            gone.append(entries.pop(0))
        if entries and entries[0].start_offset < log_min:
            entries[0] = EpochEntry(entries[0].epoch, log_min)
        if entries != self.entries:
            self.replace(entries)
            log.info("epochs_trimmed log_min=%d dropped=%s", log_min, gone)
        return gone

    def _save(self, entries: list[EpochEntry]) -> None:
        os.makedirs(self.directory, exist_ok=True)
        tmp = self.path + ".tmp"
        body = "\n".join([_MAGIC] + [f"{e.epoch} {e.start_offset}" for e in entries]) + "\n"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.directory)
        self.entries = entries
