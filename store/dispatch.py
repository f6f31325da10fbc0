"""What the store tells those it feeds: dispatch requests, the dispatcher and queue-index protocols, the observer.

A ``MessageStore`` hands every appended record, live or replayed, to each
registered ``Dispatcher`` as a ``DispatchRequest`` (no body); the queue index
(``lightqueue``) is the dispatcher that also resolves target queues and serves
queue reads. ``StoreObserver`` is what the store tells the one who composed it.
"""

from __future__ import annotations

from typing import Container, Iterable, Iterator, Mapping, NamedTuple, Protocol, Sequence

from store import record as rec


class DispatchRequest(NamedTuple):
    """One appended record as dispatchers see it (no body)."""

    offset: int
    size: int
    store_ts: int
    kind: rec.RecordKind
    topic: str
    queues: tuple[str, ...]
    properties: dict
    retain: bool = False
    body_size: int = -1  # payload length (an empty retained payload clears the topic)


class QueueEntry(NamedTuple):
    """A light-queue entry: where its message sits in the commit log."""

    queue_offset: int
    cl_offset: int
    size: int
    store_ts: int


class QueueMessage(NamedTuple):
    """A message read from a queue: its offset in the queue and the record."""

    queue_offset: int
    record: rec.Record


class Dispatcher(Protocol):
    """Indexes appended records; the commit log never imports its dispatchers.

    The store calls ``flush`` every ``index_flush_s`` on the executor's thread,
    while ``dispatch`` goes on on the reactor's, so it must be safe against that
    (RocksDB is; a crash must find state it can replay from).
    """

    dispatched_offset: int  # commit-log offset up to which this dispatcher's state is durable

    def dispatch(self, requests: Sequence[DispatchRequest]) -> Iterable[str] | None:
        """Index the requests; return the names of the queues that gained entries."""

    def reset(self) -> None:
        """Forget everything (the log lost data the index refers to): a full rebuild follows."""

    def begin_replay(self, log_end: int) -> None:
        """Replay after a restart starts: records below ``log_end`` may already be indexed."""

    def log_truncated(self, min_cl_offset: int) -> None:
        """Retention deleted the log below ``min_cl_offset``."""

    def truncate_to(self, cl_offset: int) -> None:
        """The log was cut back to end at ``cl_offset`` (a replica's handshake): forget what was past it."""

    def flush(self) -> None:
        """Persist what was indexed (on the executor's thread)."""

    def close(self) -> None:
        """The store is closing."""


class DispatcherBase:
    """The optional steps of a Dispatcher as no-ops: a dispatcher overrides the ones it needs."""

    def begin_replay(self, log_end: int) -> None:
        return None

    def log_truncated(self, min_cl_offset: int) -> None:
        return None

    def truncate_to(self, cl_offset: int) -> None:
        """By default forget everything: the store replays the log that is left into it."""
        self.reset()

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


class QueueIndex(Dispatcher, Protocol):
    """The dispatcher that also names target queues and serves queue reads."""

    def resolve(self, message: rec.Message) -> tuple[str, ...]: ...

    def resolve_many(self, messages: Sequence[rec.Message]) -> list[tuple[str, ...]]: ...

    def entries(self, queue: str, offset: int, max_count: int) -> list[QueueEntry]: ...

    def tail_entries(self, queue: str, offset: int,
                     max_count: int) -> tuple[int, Iterator[tuple[int, int, int]]] | None:
        """``entries`` when they are all in memory, as (first queue offset, (cl_offset, size, store_ts) each)."""

    def min_offset(self, queue: str) -> int: ...

    def max_offset(self, queue: str) -> int: ...

    def add_filter(self, topic_filter: str, capped: bool = True) -> str: ...

    def remove_filter(self, topic_filter: str) -> None: ...

    def log_truncated(self, min_cl_offset: int) -> None: ...

    def collect_idle(self, older_than_ts: int, owed: Container[str] = ()) -> int: ...

    def flush(self) -> None:
        """Persist what is indexed; runs on the executor's thread while ``dispatch`` goes on."""

    def close(self) -> None: ...


class StoreObserver:
    """What a ``MessageStore`` tells the one who composed it, passed in at construction; the defaults do nothing."""

    def read_soon(self, queues: tuple[str, ...], excluding: Mapping[str, int] | None = None) -> bool:
        """Keep a new append to ``queues`` in memory, because a reader waits on one of them? (An offline
        subscriber's backlog then costs disk, not memory.) ``excluding``: queue -> watches that do not count
        (those of the submitter, which is told where its appends went and reads them from what it sent)."""
        return True

    def appended(self, seconds: float) -> None:
        """A batch was acknowledged ``seconds`` after the store took it (the append latency)."""

    def drained(self) -> None:
        """A tick's drain is done and its batch is dead: the collector's turn."""
