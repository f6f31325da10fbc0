"""The broker side of the remote store: a ``store.api.Store`` served over RPC.

Request types (``Dispatcher`` rows): ``store.<operation>`` for every operation
of the interface: the body is the store codec's call frame
(``cluster.remote.codec``), the answer its result frame, a failure the
``StoreError``'s code and message. Native requests are one of them
(``native_request``: the JSON object a native client sent, whole, so a
proxy's native listener forwards requests without understanding them).

Filter interest (``add_filter``/``remove_filter``) and watches belong to the
connection that took them, and go with it: a proxy that dies stops costing
indexing for its sessions (the broker itself holds interest for the stored
persistent sessions, ``cluster.local.session_interest``, so they miss nothing), and
a proxy that reconnects registers its interest and watches again
(``RemoteStore`` does). A connection cannot drop interest it does not hold
(``NotFound``).

``watch_queue`` becomes an event stream on the caller's connection: the news of
a watched queue is sent as an ``EVENT`` frame (topic ``queue``, body
``codec.pack_queue_news``: ``[queue name, its end offset]``, -1 when the store
cannot say) to the connections that watch it and no other, as the store tells
it: the store names each queue once per drained batch (or confirm offset
passed), so the news is merged already and waiting a tick only delayed it. The
frame carries the news' own entries (up to ``MAX_NEWS_ENTRIES``, from where the
connection's last news or append answer ended, as a ``read_queue`` of the store
would answer them, so nothing a reader could not see): a proxy whose session is
at the tail delivers them without reading them back, which was a second round
trip on every message from a publisher on another proxy. A watch belongs to the
connection that made it (another one cannot unwatch it) and is dropped when that
connection goes.

``append_batch`` from a connection that watches queues is answered with where
the batch's records went in those queues, when the store can say and readers
may see them (``store.api.IndexedAppend``, ``codec.pack_append_answer``): the
proxy then answers its own sessions' reads of them (``own_appends``) instead
of reading back the messages it has just sent. That answer is also its news of
those queues up to where its entries end: no event frame is sent to it for
news that goes no further.
"""

from __future__ import annotations

import logging

import msgpack
from twisted.internet import defer

from cluster.remote import codec as store_codec
from cluster.rpc.dispatch import Dispatcher
from store import api

log = logging.getLogger("twistmq.cluster.remote.server")

QUEUE_EVENT = "queue"
"""Topic of the event frame that carries a watched queue's news: ``[queue, end offset]``."""
MAX_NEWS_ENTRIES = 256
"""Entries one news frame carries at most (a reader at the tail takes a drained batch's; more are read)."""
SESSION_EVENT = "session"
"""Topic of the event frame telling a session's old holder that another took it over: ``[client id, epoch]``."""
STORE_PREFIX = "store."


def request_type(operation: str) -> str:
    """The RPC request type of a store operation."""
    return STORE_PREFIX + operation


class _ConnectionWatches:
    """The watches and filter interest one connection holds, and how far its news has told it of each queue."""

    def __init__(self) -> None:
        self.watches: dict[int, api.Watch] = {}
        self.watched: dict[str, int] = {}  # queue -> watches of it this connection holds
        # queue -> the end up to which it holds the entries (its append answers', its news'): news up to there is known
        self.told: dict[str, int] = {}
        self.sent: dict[str, int] = {}  # queue -> where the entries of the last news sent to it ended
        self.filters: dict[str, int] = {}  # topic filter -> references this connection took


class StoreServer:
    """``StoreServer(store, clock)``; ``register(dispatcher)`` adds its rows
    (and counts the event frames it sends in the dispatcher's ``RpcMetrics``)."""

    def __init__(self, store: api.Store, clock) -> None:
        self.store = store
        self.clock = clock
        self._connections: dict[object, _ConnectionWatches] = {}
        self._members: dict[str, set] = {}  # peer node id -> its open connections that have called us
        self.metrics = None

    def register(self, dispatcher: Dispatcher) -> None:
        self.metrics = dispatcher.metrics
        for name in store_codec.OPERATIONS:
            dispatcher.register(request_type(name), self._operation(name))

    # -- store operations -------------------------------------------------------------------------------

    def _operation(self, name: str):
        special = {"watch_queue": self._watch, "unwatch_queue": self._unwatch, "add_filter": self._add_filter,
                   "remove_filter": self._remove_filter}.get(name)
        if name == "append_batch":
            return self._append_batch

        def serve(protocol, body: bytes) -> defer.Deferred:
            self._seen(protocol)
            try:
                called, args = store_codec.unpack_call(body)
            except store_codec.CodecError as exc:
                raise api.InvalidArgument(str(exc)) from None
            if called != name:
                raise api.InvalidArgument(f"request type {request_type(name)} carries a call of {called}")
            d = special(protocol, *args) if special else getattr(self.store, name)(*args)
            return d.addCallback(self._pack, name)

        return serve

    def _append_batch(self, protocol, body: bytes) -> defer.Deferred:
        """``append_batch``, answered with where the records went in the queues the caller watches (when the
        store can say): the proxy then answers its sessions' reads of them without reading them back."""
        self._seen(protocol)
        try:
            called, (messages,) = store_codec.unpack_call(body)
        except (store_codec.CodecError, ValueError) as exc:
            raise api.InvalidArgument(str(exc)) from None
        if called != "append_batch":
            raise api.InvalidArgument(f"request type {request_type('append_batch')} carries a call of {called}")
        held = self._connections.get(protocol)
        indexed = getattr(self.store, "append_batch_indexed", None)
        if held is None or not held.watched or indexed is None:
            return self.store.append_batch(messages).addCallback(self._pack, "append_batch")
        return indexed(messages, held.watched).addCallback(self._pack_indexed, held)

    @staticmethod
    def _pack_indexed(answer, held: _ConnectionWatches) -> bytes:
        results, where = answer
        try:
            body = store_codec.pack_append_answer(results, where)
        except store_codec.CodecError as exc:  # the store broke the interface: a bug, reported as one
            raise api.InternalError(str(exc)) from None
        if where is not None:  # the answer is its news of these queues up to there (RemoteStore._appended)
            told = held.told
            for queue, end in where.ends.items():
                if end > told.get(queue, -1):
                    told[queue] = end
        return body

    @staticmethod
    def _pack(value, name: str) -> bytes:
        try:
            return store_codec.pack_result(name, value)
        except store_codec.CodecError as exc:  # the store broke the interface: a bug, reported as one
            raise api.InternalError(str(exc)) from None

    def _held(self, protocol) -> _ConnectionWatches:
        held = self._connections.get(protocol)
        if held is None:
            held = self._connections[protocol] = _ConnectionWatches()
            protocol.when_lost().addCallback(lambda _reason: self.connection_lost(protocol))
        return held

    def _add_filter(self, protocol, topic_filter: str, restoring: bool = False) -> defer.Deferred:
        def added(queue: str) -> str:
            if protocol.gone:  # it went while the interest was being taken
                self.store.remove_filter(topic_filter)
            else:
                held = self._held(protocol)
                held.filters[topic_filter] = held.filters.get(topic_filter, 0) + 1
            return queue

        return self.store.add_filter(topic_filter, restoring).addCallback(added)

    def _remove_filter(self, protocol, topic_filter: str) -> defer.Deferred:
        held = self._connections.get(protocol)
        if held is None or not held.filters.get(topic_filter):
            raise api.NotFound(f"no interest in topic filter {topic_filter!r} from this connection")
        held.filters[topic_filter] -= 1
        if not held.filters[topic_filter]:
            del held.filters[topic_filter]
        return self.store.remove_filter(topic_filter)

    def _watch(self, protocol, queue: str) -> defer.Deferred:
        held = self._held(protocol)
        d = self.store.watch_queue(queue, lambda name: self._news(protocol, name))

        def registered(watch: api.Watch) -> api.Watch:
            if protocol.gone:  # it went while the watch was being made
                self.store.unwatch_queue(watch)
            else:
                held.watches[watch.watch_id] = watch
                held.watched[watch.queue] = held.watched.get(watch.queue, 0) + 1
                if watch.queue not in held.sent:  # its news carries the entries from here on
                    self.store.end_positions(watch.queue).addCallbacks(self._end_position, lambda _f: None) \
                        .addCallback(self._news_from, held, watch.queue)
            return watch

        return d.addCallback(registered)

    def _unwatch(self, protocol, watch: api.Watch) -> defer.Deferred:
        held = self._connections.get(protocol)
        if held is None or held.watches.get(watch.watch_id) != watch:
            raise api.NotFound(f"no watch {watch.watch_id} on {watch.queue!r} from this connection")
        del held.watches[watch.watch_id]
        left = held.watched.get(watch.queue, 0) - 1
        if left > 0:
            held.watched[watch.queue] = left
        else:
            held.watched.pop(watch.queue, None)
            held.told.pop(watch.queue, None)
            held.sent.pop(watch.queue, None)
        return self.store.unwatch_queue(watch)

    def _news(self, protocol, queue: str) -> None:
        held = self._connections.get(protocol)
        if held is None:
            return
        self.store.end_positions(queue).addCallbacks(self._end_position, lambda _f: None).addCallback(
            self._send_news, protocol, held, queue)

    def _send_news(self, end: api.QueuePosition | None, protocol, held: _ConnectionWatches, queue: str) -> None:
        if end is None:  # the store cannot say: bare news, the proxy reads
            self._send_event(protocol, queue, -1, None)
            return
        told = held.told.get(queue, -1)
        if end.offset <= told:
            return  # its own append's answer (or an earlier news) gave it all of this news already
        start = max(told, held.sent.get(queue, -1))
        # Bare, and the proxy reads: nothing new it may see yet (a confirm offset passed), or its connection's
        # write buffer is full (a proxy that does not keep up is not sent every entry it may never read).
        if start < 0 or start >= end.offset or protocol.write_paused:
            held.sent[queue] = end.offset
            self._send_event(protocol, queue, end.offset, None)
            return
        count = min(end.offset - start, MAX_NEWS_ENTRIES)
        read = self.store.read_queue(api.QueuePosition(queue, end.group, start), count)
        read.addCallbacks(self._run_from, lambda _f: None, callbackArgs=(start,)).addCallback(
            self._send_entries, protocol, held, queue, end.offset)

    @staticmethod
    def _news_from(end: api.QueuePosition | None, held: _ConnectionWatches, queue: str) -> None:
        if end is not None and queue in held.watched:
            held.sent.setdefault(queue, end.offset)

    @staticmethod
    def _run_from(result: api.ReadResult, start: int) -> api.ReadResult | None:
        """``result`` if its entries follow one another from ``start`` (the proxy indexes them so; none at all is
        such a run too), else None."""
        messages = result.messages
        if result.lost or (messages and messages[0].position.offset != start) \
                or result.next.offset != start + len(messages):
            return None
        return result

    def _send_entries(self, entries: api.ReadResult | None, protocol, held: _ConnectionWatches, queue: str,
                      end: int) -> None:
        if protocol.gone or self._connections.get(protocol) is not held:
            return
        if entries is not None and entries.messages and self._send_event(protocol, queue, end, entries):
            # Only entries a read showed: past a master's confirm offset the end counts entries nobody may see yet,
            # and their news, once it passes, must not be taken for known.
            reached = entries.next.offset
            held.sent[queue] = reached
            if reached > held.told.get(queue, -1):
                held.told[queue] = reached
            return
        if entries is None:  # the read failed, or was not one run: the next news' entries start at this end
            held.sent[queue] = end
        # (an empty read: none it may see yet, past a confirm offset; the next news' entries start here again)
        self._send_event(protocol, queue, end, None)

    def _send_event(self, protocol, queue: str, end: int, entries: api.ReadResult | None) -> bool:
        """Send the news; whether it carried ``entries`` (False if there were none or they could not be packed)."""
        try:
            body = store_codec.pack_queue_news(queue, end, entries)
        except store_codec.CodecError as exc:  # the store broke the interface: told bare, the proxy reads
            log.error("queue_news_unpackable queue=%s reason=%s", queue, exc)
            return False
        protocol.send_event(QUEUE_EVENT, body)
        if self.metrics is not None:
            self.metrics.events += 1
        return entries is not None

    @staticmethod
    def _end_position(positions) -> api.QueuePosition | None:
        """The queue's end in this group (an upper bound of what readers may see: entries past a confirm offset
        count), or None when unknown."""
        return positions[0] if len(positions) == 1 else None

    def connection_lost(self, protocol) -> None:
        """Drop every watch and every filter interest the connection held."""
        held = self._connections.pop(protocol, None)
        if held is None:
            return
        for watch in held.watches.values():
            self.store.unwatch_queue(watch).addErrback(
                lambda f, w=watch: log.warning("unwatch_failed queue=%s reason=%s", w.queue, f.getErrorMessage()))
        for topic_filter, count in held.filters.items():
            for _ in range(count):
                self.store.remove_filter(topic_filter).addErrback(
                    lambda f, t=topic_filter: log.warning("remove_filter_failed filter=%s reason=%s", t,
                                                          f.getErrorMessage()))

    @property
    def watches(self) -> int:
        """Watches held by connections now."""
        return sum(len(h.watches) for h in self._connections.values())

    @property
    def filters(self) -> int:
        """Filter interest references held by connections now."""
        return sum(sum(h.filters.values()) for h in self._connections.values())

    # -- takeover news ---------------------------------------------------------------------------------

    def _seen(self, protocol) -> None:
        peer = getattr(protocol, "peer", None)
        if peer is None:
            return
        held = self._members.setdefault(peer.node_id, set())
        if protocol not in held:
            held.add(protocol)
            protocol.when_lost().addCallback(lambda _reason: held.discard(protocol))

    def session_claimed(self, client_id: str, old_holder: str, epoch: int) -> None:
        """A claim took ``client_id``'s session from ``old_holder``: tell that member, if it is connected,
        so it disconnects its client now (MQTT-3.1.4-3); if it is not, its writes are fenced anyway."""
        for protocol in list(self._members.get(old_holder, ())):
            protocol.send_event(SESSION_EVENT, msgpack.packb([client_id, epoch], use_bin_type=True))
            if self.metrics is not None:
                self.metrics.events += 1
