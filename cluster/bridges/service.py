"""``Bridges``: the ``[[bridge.mongodb]]`` bridges of one broker group, started and stopped with its store.

Each bridge is a durable subscriber of its filter inside the broker, as a
persistent session is: it holds interest in the filter (``add_filter``, so
what is published meanwhile is indexed into the filter's light queue), owns a
position in that queue (``cluster.bridges.positions``), is a retention owner
(``owed``: the segments holding what it has not inserted stay, unless a disk
limit forces them out, which retention and the pump count and log), and is
woken by the queue's news (``watch_queue``). The pump (``cluster.bridges.pump``)
does the rest.

In a cluster every broker group runs the bridges of its config over its own
light queues: a topic is stored by one group, so a filter whose topics span
groups is read by one bridge per group, each with its own position, and the
``_id``'s group keeps their documents apart. Every broker of a replicated
group runs them, each over its own replica (a slave reads up to the confirm
offset, so nothing a failover could take back is inserted) with a position
file of its own: the ``_id`` makes their inserts one document, and a slave
promoted to master goes on from its own position, losing nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from twisted.internet import defer

from cluster.bridges.config import MongoBridgeConfig
from cluster.bridges.mongo_sink import MongoSink
from cluster.bridges.positions import PositionFile
from cluster.bridges.pump import BridgePump
from lightqueue.names import lmq_name
from store import api

log = logging.getLogger("twistmq.cluster.bridges")


class Bridges:
    """The bridges of one store (see the module doc)."""

    def __init__(self, configs: tuple[MongoBridgeConfig, ...], store: api.Store, end_offset: Callable[[str], int],
                 directory: str, executor, run_mongo: Callable[..., defer.Deferred], clock, group: str) -> None:
        self._store = store
        self._end_offset = end_offset
        self.group = group
        self.configs = {c.name: c for c in configs}
        self.pumps: list[BridgePump] = []
        self._files: dict[str, PositionFile] = {}
        self._watches: list[api.Watch] = []
        self._saved: dict[str, int | None] = {}
        for c in configs:
            queue = lmq_name(c.filter)
            end = (lambda q=queue: end_offset(q))
            files = PositionFile(directory, c.name, queue, group, executor)
            pump = BridgePump(c.name, queue, group, store.read_queue, MongoSink(run_mongo, c.collection, c.name),
                              files.save, end, clock, c.batch_size, c.payload, c.retry_max)
            self._files[c.name] = files
            # Known before the store opens, so retention keeps what a bridge owes from its first run on.
            self._saved[c.name] = pump.position = files.load() or 0
            self.pumps.append(pump)

    def owed(self) -> list[api.Owed]:
        """Retention holder: what each bridge has yet to insert."""
        return [p.owed() for p in self.pumps]

    @defer.inlineCallbacks
    def start(self):
        """Take interest in every filter, settle each position, then start the pumps (before any listener
        opens, so nothing published after a restart is missed)."""
        for pump in self.pumps:
            c = self.configs[pump.name]
            files = self._files[pump.name]
            yield self._store.add_filter(c.filter, restoring=True)
            saved = files.load()
            end = self._end_offset(pump.queue)
            if saved is None:
                saved = end  # a new bridge starts with what comes next, as a new subscription does
                yield files.save(saved)
                log.info("bridge_created name=%s filter=%s collection=%s position=%d", c.name, c.filter,
                         c.collection, saved)
            elif saved > end:
                # The queue is behind the saved position (its index was rebuilt from scratch): read it all again;
                # the _id keeps what is already in MongoDB once.
                first = yield self._store.first_positions(pump.queue)
                log.warning("bridge_position_ahead name=%s saved=%d queue_end=%d (reading from %d again)", c.name,
                            saved, end, first[0].offset)
                saved = first[0].offset
            watch = yield self._store.watch_queue(pump.queue, lambda _queue, p=pump: p.wake())
            self._watches.append(watch)
            pump.start(saved)

    @defer.inlineCallbacks
    def stop(self):
        """Stop every pump (each finishes the insert or save in flight) and drop the watches."""
        yield defer.gatherResults([p.stop() for p in self.pumps], consumeErrors=True)
        for watch in self._watches:
            yield self._store.unwatch_queue(watch).addErrback(lambda _: None)
        self._watches = []

    def rows(self) -> list[dict]:
        """One row per bridge (``GET bridges``, ``/metrics``)."""
        out = []
        for p in self.pumps:
            c = self.configs[p.name]
            s = p.stats
            out.append({"name": p.name, "type": "mongodb", "filter": c.filter, "collection": c.collection,
                        "group": self.group, "state": p.state.value, "position": p.position, "lag": p.lag,
                        "inserted": s.inserted, "duplicates": s.duplicates, "refused": s.refused, "failed": s.failed,
                        "lost": s.lost, "outages": s.outages, "last_error": p.last_error})
        return out


def bridges_directory(data_dir: str) -> str:
    """Where the bridges' positions live."""
    return os.path.join(data_dir, "bridges")
