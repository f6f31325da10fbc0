"""What a replica does to a ``MessageStore`` beside appending its own: take a master's records, cut its log back.

``ReplicaWrites`` is a part of ``MessageStore`` (its base class), kept apart because the replication path
is read on its own: ``append_replicated`` dispatches a master's records exactly as a local append is
dispatched, and ``truncate`` cuts the log and everything derived from it (a replica's handshake,
``store.ha_connection.Truncate``).
"""

from __future__ import annotations

import logging
from typing import Sequence

from twisted.internet import defer

from store import record as rec
from store.dispatch import DispatchRequest

log = logging.getLogger("twistmq.store")


class ReplicaWrites:
    """``truncate`` and ``append_replicated`` over the host store's log, dispatchers, gate and listeners."""

    def truncate(self, offset: int) -> int:
        """Cut the log back to end at ``offset`` and everything derived from it with it; return the bytes cut.

        A replica's handshake does this (``store.ha_connection.Truncate``): the
        light queues and topic queues drop their entries past ``offset``, the
        other dispatchers (retained index, timers) rebuild from the log that is
        left, and the epochs past it go.
        """
        self._drain()
        cut = self.commit_log.truncate_to(offset)
        if not cut:
            return 0
        self._forget_recent_from(offset)
        self.visible_offset = min(self.visible_offset, offset)
        self.gate.truncated(offset)
        # Offsets past the cut will hold other bytes: none of them is fsynced yet.
        self.flush_policy.truncated(offset)
        self._truncations += 1
        for disp in self._dispatchers:
            disp.truncate_to(offset)
        self.epochs.truncate_suffix(offset)
        self._replay()  # what a dispatcher that rebuilt needs again
        for listener in self._truncate_listeners:
            listener(offset)
        log.warning("store_truncated offset=%d bytes=%d", offset, cut)
        return cut

    def append_replicated(self, offset: int, data: bytes, records: Sequence[rec.Record]) -> defer.Deferred:
        """Append a master's records at ``offset`` (this log's end) and dispatch them as any append.

        ``records`` are ``data`` decoded (the replication connection checked
        each CRC). Fires with the new log end once written under the flush
        policy; readers and watchers see the records from then on.
        """
        self._drain()
        self.commit_log.append_at(offset, data, [r.size for r in records])
        requests = [DispatchRequest(r.offset, r.size, r.store_ts, r.kind, r.topic, r.queues, dict(r.properties),
                                    r.retain, len(r.body)) for r in records]
        touched: set[str] = set()
        for disp in self._dispatchers:
            gained = disp.dispatch(requests)
            if gained:
                touched.update(gained)
        self.puts += len(requests)
        self.bytes_in += len(data)
        log_end = self.commit_log.max_offset
        for appended in self._append_listeners:
            appended(log_end)
        cuts = self._truncations

        def visible(_):
            if log_end > self.visible_offset and cuts == self._truncations:
                self.visible_offset = log_end
            if touched:
                for listener in self._listeners:
                    listener(touched)
            return log_end

        return self.flush_policy.written(log_end).addCallback(visible)
