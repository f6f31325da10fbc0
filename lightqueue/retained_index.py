"""The retained-message index: the last retained publish per topic, derived from the commit log.

A store dispatcher (``store.register_dispatcher(index)``). For each MQTT
publish with the retain flag it records where that topic's retained message
sits in the commit log; a retained publish with an empty payload removes it
(MQTT-3.3.1-10/11). Nothing is copied: the MQTT layer reads the records back
through ``store.read(cl_offset, size)``.

Layout in RocksDB (one column family, raw mode, WAL disabled; integers big-endian)::

    b"t" | topic (utf-8)  ->  cl_offset (u64) | size (u32) | store_ts (u64) | body_size (u32)
    b"c"                  ->  dispatched commit-log offset (u64): the checkpoint

Each dispatch tick is one WriteBatch that carries the checkpoint too, and with
the WAL off and a single column family RocksDB keeps some prefix of those
batches after a crash: the checkpoint always matches the entries, so replaying
the log from it rebuilds the rest, and a request below it is ignored.

In memory, beside a dict topic -> entry (kept in commit-log order, so dropping
what retention deleted stops at the first survivor), a level tree of the
retained topics (one dict of children per level) serves ``lookup``: a filter
walks only the branches its literal levels name, so its cost does not grow with
the number of retained topics outside its prefix.

Not thread-safe: it belongs to the reactor thread, like the rest of the indexing.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from typing import NamedTuple, Sequence

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from store import record as rec
from store.dispatch import DispatcherBase, DispatchRequest
from store.retention import CARRIED

__all__ = ["RetainedEntry", "RetainedIndex"]

log = logging.getLogger("twistmq.lightqueue.retained")

_VALUE = struct.Struct(">QIQI")
_U64 = struct.Struct(">Q")
_TOPIC = b"t"
_CHECKPOINT = b"c"


class RetainedEntry(NamedTuple):
    """Where a topic's retained message sits in the commit log."""

    cl_offset: int
    size: int  # record size in the commit log
    store_ts: int  # ms; the MQTT layer applies message expiry with it
    body_size: int  # payload bytes: what ``total_bytes`` and ``max_bytes`` count


class _Node:
    """One level of the retained-topic tree."""

    __slots__ = ("children", "topic")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        """Next levels, by level text; None until the first is added."""
        self.topic: str | None = None
        """The retained topic that ends exactly at this node."""


class RetainedIndex(DispatcherBase):
    """Topic -> last retained message, persisted in RocksDB, matched by topic filter.

    ``max_messages`` and ``max_bytes`` (payload bytes; 0 = unlimited) are not
    enforced here, since a dispatcher sees records already stored: the MQTT
    layer asks ``would_exceed`` before storing a retained publish.
    """

    def __init__(self, path: str, max_messages: int = 0, max_bytes: int = 0) -> None:
        if max_messages < 0 or max_bytes < 0:
            raise ValueError(f"limits must be >= 0 (0 = unlimited): max_messages={max_messages} "
                             f"max_bytes={max_bytes}")
        self.path = path
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.dispatched_offset = 0
        self.total_bytes = 0
        self.dropped = 0  # retained messages lost to a disk limit since start
        self._entries: dict[str, RetainedEntry] = {}  # in commit-log order (see module doc)
        self._root = _Node()
        self._open_db()
        self._load()

    # -- persistence -----------------------------------------------------------------------

    def _open_db(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = Rdict(self.path, opts)
        self._wo = WriteOptions()
        self._wo.disable_wal = True  # derived data: the commit log is the source of truth

    def _load(self) -> None:
        raw = self._db.get(_CHECKPOINT)
        self.dispatched_offset = _U64.unpack(raw)[0] if raw else 0
        loaded = []
        for key, value in self._db.items(from_key=_TOPIC):
            if not key.startswith(_TOPIC):
                break
            loaded.append((key[1:].decode("utf-8"), RetainedEntry(*_VALUE.unpack(value))))
        loaded.sort(key=lambda item: item[1].cl_offset)
        for topic, entry in loaded:
            self._set(topic, entry)
        log.info("retained_loaded topics=%d bytes=%d checkpoint=%d",
                 len(self._entries), self.total_bytes, self.dispatched_offset)

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        """Apply the retained publishes among ``requests`` and move the checkpoint, in one WriteBatch.

        Requests below the checkpoint were applied before (replay) and are skipped.
        """
        checkpoint = self.dispatched_offset
        if requests and requests[0].offset < checkpoint:
            requests = [r for r in requests if r.offset >= checkpoint]
        if not requests:
            return None
        last = requests[-1]
        end = last.offset + last.size
        wb = WriteBatch(raw_mode=True)
        changed = 0
        for req in [r for r in requests if r.retain]:  # few are: one pass over the flags, not the loop below
            if req.kind != rec.RecordKind.MQTT_PUBLISH:
                if req.kind != rec.RecordKind.SYSTEM or not self._carry_applies(req):
                    continue
            key = _TOPIC + req.topic.encode("utf-8")
            if req.body_size == 0:  # MQTT-3.3.1-10: an empty retained payload clears the topic
                if self._remove(req.topic):
                    wb.delete(key)
                    changed += 1
                continue
            # An unknown payload size (-1) counts as the record size, an upper bound.
            body = req.body_size if req.body_size > 0 else req.size
            entry = RetainedEntry(req.offset, req.size, req.store_ts, body)
            self._set(req.topic, entry)
            wb.put(key, _VALUE.pack(*entry))
            changed += 1
        wb.put(_CHECKPOINT, _U64.pack(end))
        self._db.write(wb, self._wo)
        self.dispatched_offset = end
        if changed:
            log.debug("retained_dispatch changed=%d topics=%d checkpoint=%d", changed, len(self._entries), end)
        return None

    def _carry_applies(self, req: DispatchRequest) -> bool:
        """A retained message re-appended ahead of retention replaces the one it copies.

        Retention appends the copy while the index still points at the original,
        so in the log no retained publish of that topic stands between the two: the
        copy applies when the topic still points at the original, or at nothing
        (a replay that starts after the original's segment was deleted).
        """
        origin = req.properties.get(CARRIED)
        if origin is None:
            return False
        current = self._entries.get(req.topic)
        return current is None or str(current.cl_offset) == origin

    def records_to_carry(self, offset: int) -> list[tuple[int, int]]:
        """``(cl_offset, size)`` of every retained message stored below ``offset`` (a RetentionCarrier)."""
        out = []
        for entry in self._entries.values():  # in log order
            if entry.cl_offset >= offset:
                break
            out.append((entry.cl_offset, entry.size))
        return out

    def _set(self, topic: str, entry: RetainedEntry) -> None:
        old = self._entries.pop(topic, None)  # pop, then insert: the dict stays in log order
        if old is None:
            node = self._root
            for level in topic.split("/"):
                children = node.children
                if children is None:
                    children = node.children = {}
                child = children.get(level)
                if child is None:
                    child = children[level] = _Node()
                node = child
            node.topic = topic
        else:
            self.total_bytes -= old.body_size
        self._entries[topic] = entry
        self.total_bytes += entry.body_size

    def _remove(self, topic: str) -> bool:
        old = self._entries.pop(topic, None)
        if old is None:
            return False
        self.total_bytes -= old.body_size
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic.split("/"):
            path.append((node, level))
            node = node.children[level]  # type: ignore[index]
        node.topic = None
        while path and node.topic is None and not node.children:  # prune what no topic uses
            parent, level = path.pop()
            del parent.children[level]  # type: ignore[arg-type]
            if not parent.children:
                parent.children = None
            node = parent
        return True

    def reset(self) -> None:
        """Drop everything (the log no longer holds what the index points to): a full replay follows."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self._entries.clear()
        self._root = _Node()
        self.total_bytes = 0
        self.dispatched_offset = 0
        self._open_db()

    # -- reading -----------------------------------------------------------------------------

    def lookup(self, topic_filter: str) -> list[tuple[str, int, int]]:
        """Every retained message matching ``topic_filter``, as ``(topic, cl_offset, size)``, in no set order.

        ``+`` matches one level (an empty one too), ``#`` the parent level and
        everything below, and a filter whose first level is a wildcard does not
        match topics starting with ``$`` (MQTT-4.7.2-1). The filter is assumed
        valid (and not ``$share/...``: shared subscriptions get no retained messages).
        """
        entries = self._entries
        if "+" not in topic_filter and "#" not in topic_filter:
            e = entries.get(topic_filter)
            return [] if e is None else [(topic_filter, e.cl_offset, e.size)]
        levels = topic_filter.split("/")
        depth = len(levels)
        found: list[str] = []
        stack: list[tuple[_Node, int]] = [(self._root, 0)]  # explicit stack: topics may be deep
        while stack:
            node, i = stack.pop()
            if i == depth:
                if node.topic is not None:
                    found.append(node.topic)
                continue
            level = levels[i]
            children = node.children
            if level == "#":
                if node.topic is not None:  # "a/#" matches "a"
                    found.append(node.topic)
                if children:
                    self._collect(children, i == 0, found)
            elif level == "+":
                if children:
                    for key, child in children.items():
                        if i == 0 and key.startswith("$"):
                            continue
                        stack.append((child, i + 1))
            elif children:
                child = children.get(level)
                if child is not None:
                    stack.append((child, i + 1))
        out = []
        for topic in found:
            e = entries[topic]
            out.append((topic, e.cl_offset, e.size))
        return out

    @staticmethod
    def _collect(children: dict[str, _Node], at_root: bool, found: list[str]) -> None:
        """Append every topic in the subtrees under ``children`` (skipping ``$`` topics at the root)."""
        stack = [child for key, child in children.items() if not (at_root and key.startswith("$"))]
        while stack:
            node = stack.pop()
            if node.topic is not None:
                found.append(node.topic)
            if node.children:
                stack.extend(node.children.values())

    def get(self, topic: str) -> RetainedEntry | None:
        """The retained message of exactly ``topic``, or None."""
        return self._entries.get(topic)

    @property
    def count(self) -> int:
        """How many topics hold a retained message."""
        return len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def would_exceed(self, topic: str, size: int) -> bool:
        """Would retaining a ``size``-byte payload on ``topic`` break ``max_messages`` or ``max_bytes``?

        Replacing a topic's message does not add to the count; an empty payload
        (a clear) never exceeds. Puts still in flight are not counted, so
        concurrent publishes of one tick may overshoot by as many messages.
        """
        if size == 0:
            return False
        old = self._entries.get(topic)
        if self.max_messages and old is None and len(self._entries) + 1 > self.max_messages:
            return True
        if self.max_bytes:
            new_total = self.total_bytes + size - (old.body_size if old is not None else 0)
            if new_total > self.max_bytes:
                return True
        return False

    # -- housekeeping --------------------------------------------------------------------------

    def drop_below(self, min_cl_offset: int) -> int:
        """Forget retained messages whose records retention deleted (offset < ``min_cl_offset``).

        Costs the number dropped, not the number kept: entries are in log order.
        Returns how many were dropped.
        """
        stale = []
        for topic, entry in self._entries.items():
            if entry.cl_offset >= min_cl_offset:
                break
            stale.append(topic)
        if not stale:
            return 0
        wb = WriteBatch(raw_mode=True)
        for topic in stale:
            self._remove(topic)
            wb.delete(_TOPIC + topic.encode("utf-8"))
        self._db.write(wb, self._wo)
        self.dropped += len(stale)
        # Retention carries retained messages ahead of deletion: only a disk limit gets here.
        log.warning("retained_retention min_cl_offset=%d dropped=%d topics=%d",
                 min_cl_offset, len(stale), len(self._entries))
        return len(stale)

    def log_truncated(self, min_cl_offset: int) -> None:
        """Retention deleted segments below ``min_cl_offset`` (the store calls this on every dispatcher)."""
        self.drop_below(min_cl_offset)

    def flush(self) -> None:
        """Persist the memtable (entries and checkpoint together).

        The one call that may run on another thread (the store's executor) while
        the reactor dispatches: one column family, so what a crash leaves is
        still a prefix of the dispatch batches.
        """
        self._db.flush(True)

    def close(self) -> None:
        """Flush and close RocksDB."""
        try:
            self.flush()
        finally:
            self._db.close()
            del self._db
