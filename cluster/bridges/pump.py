"""``BridgePump``: one bridge's loop — read a batch from its light-queue position, insert it, then move on.

The pump owns the bridge's state and its timing; its collaborators are passed
in (how to read the queue, insert a batch, save the position, and the clock),
so every path — batching, an outage's back-off, catching up, a loss to a disk
limit — runs under ``task.Clock`` in the unit tests with no reactor or server.

The order that makes it lose nothing: the position moves (and is saved)
only after ``insert`` has fired for the batch read from it. A crash between the
insert and the save reads the batch again; its documents keep their ``_id``
(``cluster.bridges.documents``), so the second insert adds nothing. While the
sink fails, the pump keeps its position and retries after 0.5 s, 1 s, 2 s, ...
up to ``retry_max``; retention keeps what it owes (``owed``) meanwhile.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

from twisted.internet import defer

from cluster.bridges.documents import document
from store import api
from store import record as rec

log = logging.getLogger("twistmq.cluster.bridges")

RETRY_INITIAL = 0.5  # seconds before the first retry of an outage
POLL_INTERVAL = 1.0  # an idle pump reads again this often even without news (a missed notify costs a second)


class InsertResult(NamedTuple):
    """What one batch insert did: new documents, ones already there (a replay), ones the server refused."""

    inserted: int
    duplicates: int = 0
    refused: int = 0


class Sink(Protocol):
    """Where documents go: fires with an InsertResult, fails when the batch must be retried whole."""

    def insert(self, docs: list[dict], bodies: list[bytes]) -> defer.Deferred: ...


class State(enum.Enum):
    IDLE = "idle"  # caught up, waiting for news
    READING = "reading"
    INSERTING = "inserting"
    SAVING = "saving"
    RETRYING = "retrying"  # the sink failed: waiting out the back-off
    STOPPED = "stopped"


class Backoff:
    """Waits of an outage: ``initial``, doubled each time, at most ``maximum``; ``reset`` when it is over."""

    def __init__(self, initial: float = RETRY_INITIAL, maximum: float = 30.0) -> None:
        self.initial = initial
        self.maximum = max(initial, maximum)
        self._delay: float | None = None

    def next(self) -> float:
        self._delay = self.initial if self._delay is None else min(self._delay * 2, self.maximum)
        return self._delay

    def reset(self) -> None:
        self._delay = None


@dataclass
class BridgeStats:
    """One bridge's counters (``/metrics``, ``GET bridges``)."""

    inserted: int = 0  # documents the server took
    duplicates: int = 0  # documents already there (a batch read again after a crash or a failed save)
    refused: int = 0  # documents the server refused even with a binary payload (logged each)
    failed: int = 0  # batch inserts that failed (the server unreachable, ...): each retried
    lost: int = 0  # messages a disk limit deleted before the bridge inserted them
    outages: int = 0  # times the sink went from working to failing


class BridgePump:
    """One bridge's loop (see the module doc)."""

    def __init__(self, name: str, queue: str, group: str, read: Callable[[api.QueuePosition, int], defer.Deferred],
                 sink: Sink, save: Callable[[int], defer.Deferred], end: Callable[[], int], clock,
                 batch_size: int = 500, payload: str = "auto", retry_max: float = 30.0) -> None:
        self.name = name
        self.queue = queue
        self.group = group
        self._read = read
        self._sink = sink
        self._save = save
        self._end = end
        self._clock = clock
        self.batch_size = batch_size
        self.payload = payload
        self.backoff = Backoff(RETRY_INITIAL, retry_max)
        self.stats = BridgeStats()
        self.state = State.STOPPED
        self.position = 0  # queue offset of the first message not yet inserted (saved)
        self.last_error = ""
        self._down_since: float | None = None
        self._woken = False
        self._timer = None
        self._busy: defer.Deferred | None = None  # fires when the step in flight is done (for stop)

    # -- what callers see ---------------------------------------------------------------------------

    @property
    def lag(self) -> int:
        """Entries of the queue the bridge has yet to insert."""
        return max(0, self._end() - self.position)

    def owed(self) -> api.Owed:
        """What retention must keep for this bridge."""
        return api.Owed(f"bridge {self.name}", self.queue, self.position)

    def start(self, position: int) -> None:
        """Begin at queue offset ``position`` (the saved one)."""
        self.position = position
        self.state = State.IDLE
        log.info("bridge_started name=%s queue=%s group=%s position=%d lag=%d", self.name, self.queue, self.group,
                 position, self.lag)
        self._step()

    def wake(self) -> None:
        """The queue has news: read now if idle, else once more after the step in flight."""
        if self.state is State.IDLE:
            self._step()
        else:
            self._woken = True

    def stop(self) -> defer.Deferred:
        """Stop reading; fires once the step in flight (an insert, a save) is over."""
        self.state = State.STOPPED
        self._cancel_timer()
        busy = self._busy
        if busy is None:
            return defer.succeed(None)
        done: defer.Deferred = defer.Deferred()
        busy.addBoth(lambda r: (done.callback(None), r)[1])
        return done

    # -- the loop -------------------------------------------------------------------------------------

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _later(self, delay: float) -> None:
        self._cancel_timer()
        self._timer = self._clock.callLater(delay, self._step)

    def _step(self) -> None:
        if self.state is State.STOPPED:
            return
        self._cancel_timer()
        self._woken = False
        self.state = State.READING
        self._busy = defer.Deferred()
        start = self.position
        d = defer.maybeDeferred(self._read, api.QueuePosition(self.queue, self.group, start), self.batch_size)
        d.addCallbacks(self._got, self._failed, callbackArgs=(start,), errbackArgs=("read",))
        d.addErrback(self._failed, "bridge")  # a bug in a callback must not stop the loop silently

    def _done_step(self) -> None:
        busy, self._busy = self._busy, None
        if busy is not None:
            busy.callback(None)

    def _got(self, result: api.ReadResult, start: int):
        if self.state is State.STOPPED:
            return self._done_step()
        records = [m.record for m in result.messages if m.record.kind == rec.RecordKind.MQTT_PUBLISH]
        nxt = result.next.offset
        if not records:
            if nxt == start:
                return self._idle()
            return self._commit(start, nxt, result.lost)
        docs = [document(r, self.group, self.payload) for r in records]
        self.state = State.INSERTING
        d = defer.maybeDeferred(self._sink.insert, docs, [r.body for r in records])
        d.addCallbacks(self._inserted, self._failed, callbackArgs=(start, nxt, result.lost), errbackArgs=("insert",))
        return d

    def _inserted(self, result: InsertResult, start: int, nxt: int, lost: int):
        s = self.stats
        s.inserted += result.inserted
        s.duplicates += result.duplicates
        s.refused += result.refused
        if self._down_since is not None:
            log.info("bridge_sink_back name=%s down_seconds=%.1f failed_batches=%d lag=%d", self.name,
                     self._clock.seconds() - self._down_since, s.failed, self.lag)
            self._down_since = None
        self.backoff.reset()
        self.last_error = ""
        return self._commit(start, nxt, lost)

    def _commit(self, start: int, nxt: int, lost: int):
        if self.state is State.STOPPED:
            return self._done_step()
        self.state = State.SAVING
        d = defer.maybeDeferred(self._save, nxt)
        d.addCallbacks(self._saved, self._failed, callbackArgs=(start, nxt, lost), errbackArgs=("save",))
        return d

    def _saved(self, _, start: int, nxt: int, lost: int) -> None:
        if lost:  # counted once the position has moved past them: a retried read sees the same gap again
            self.stats.lost += lost
            log.warning("bridge_lost name=%s queue=%s queue_offsets=[%d,%d) messages=%d reason=disk_limit",
                        self.name, self.queue, start, start + lost, lost)
        self.position = nxt
        self._done_step()
        if self.state is not State.STOPPED:
            self._clock.callLater(0, self._step)  # the next batch in a later turn: a backlog never holds the reactor

    def _idle(self) -> None:
        self._done_step()
        if self.state is State.STOPPED:
            return
        if self._woken:
            self._clock.callLater(0, self._step)
            self.state = State.READING
            return
        self.state = State.IDLE
        self._later(POLL_INTERVAL)

    def _failed(self, failure, what: str) -> None:
        reason = f"{failure.type.__name__}: {failure.getErrorMessage()}"
        self.last_error = f"{what}: {reason}"
        if what == "insert":
            self.stats.failed += 1
        if self._down_since is None:  # once per outage; the back line says how long it lasted
            self._down_since = self._clock.seconds()
            self.stats.outages += 1
            log.warning("bridge_sink_down name=%s op=%s position=%d reason=%s (retrying, position kept)",
                        self.name, what, self.position, reason)
        self._done_step()
        if self.state is State.STOPPED:
            return
        self.state = State.RETRYING
        self._later(self.backoff.next())
