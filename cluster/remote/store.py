"""``RemoteStore``: ``store.api.Store`` over one broker's RPC connection (a ``cluster.rpc.peer.PeerClient``).

Every operation is a ``store.<operation>`` call carrying the store codec's
call frame; its answer is unpacked from the result frame, and an error frame
comes back as the ``StoreError`` subclass of its code. Transport failures are
``Unavailable`` (``NotConnected`` when no connection is open: the call was not
sent; ``CallTimeout`` when the broker did not answer in time: it may have
been served).

Filter interest and watches live with the connection on the broker's side
(``cluster.remote.server``), so this store remembers what it holds and, after a
reconnect, takes the interest again first, then the watches.

``watch_queue``'s callback stays here: the broker sends an event frame naming
the queue, and every local callback watching that queue is called. After a
reconnect the watches are registered again (the broker dropped them with the
old connection) and each callback is called once, since news may have been
missed in between; the ``Watch`` a caller holds stays valid.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

import msgpack
from twisted.internet import defer

from cluster.remote import codec as store_codec
from cluster.remote.server import NATIVE_REQUEST, QUEUE_EVENT, request_type
from cluster.rpc.peer import PeerClient
from cluster.rpc.protocol import RemoteError
from store import api

log = logging.getLogger("twistmq.cluster.remote.store")


def _as_store_error(failure):
    if failure.check(RemoteError):
        raise store_codec.store_error(failure.value.code, str(failure.value))
    return failure


class RemoteStore:
    """``store.api.Store`` served by the broker at the other end of ``peer``."""

    def __init__(self, peer: PeerClient, wait_connected: float = 0.0) -> None:
        self.peer = peer
        # > 0: a call made while disconnected waits this long for the connection (a broker restarting)
        # before it fails with Unavailable; 0: it fails at once.
        self.wait_connected = wait_connected
        self.events_received = 0  # queue news frames from the broker (a proxy watching nothing gets none)
        self._ids = itertools.count(1)
        self._watches: dict[int, tuple[str, Callable[[str], None], api.Watch]] = {}  # local id -> (queue, cb, remote)
        self._filters: dict[str, int] = {}  # topic filter -> add_filter references held
        peer.on_event(self._event)
        peer.on_connected(self._reconnected)

    def _call(self, name: str, args: tuple, kwargs: dict) -> defer.Deferred:
        try:
            frame = store_codec.pack_call(name, args, kwargs)
        except store_codec.CodecError as exc:
            return defer.fail(api.InvalidArgument(str(exc)))
        if self.wait_connected > 0 and not self.peer.connected:
            d = self._when_connected().addCallback(lambda _: self.peer.call(request_type(name), frame))
        else:
            d = self.peer.call(request_type(name), frame)
        d.addCallbacks(lambda body: store_codec.unpack_result(name, body), _as_store_error)
        return d

    def _when_connected(self) -> defer.Deferred:
        def late(failure):
            failure.trap(defer.TimeoutError)
            raise api.Unavailable(f"broker {self.peer.peer_id} unreachable for {self.wait_connected:g} s")
        d = self.peer.when_connected()
        d.addTimeout(self.wait_connected, self.peer.clock)
        return d.addErrback(late)

    # -- interest -------------------------------------------------------------------------------------

    def add_filter(self, topic_filter: str) -> defer.Deferred:
        """As ``Queues.add_filter``; the reference is remembered, to be taken again after a reconnect."""
        def added(queue: str) -> str:
            self._filters[topic_filter] = self._filters.get(topic_filter, 0) + 1
            return queue

        return self._call("add_filter", (topic_filter,), {}).addCallback(added)

    def remove_filter(self, topic_filter: str) -> defer.Deferred:
        """As ``Queues.remove_filter``."""
        def removed(result):
            count = self._filters.get(topic_filter, 0) - 1
            if count > 0:
                self._filters[topic_filter] = count
            else:
                self._filters.pop(topic_filter, None)
            return result

        return self._call("remove_filter", (topic_filter,), {}).addCallback(removed)

    def _reconnected(self) -> None:
        for topic_filter, count in list(self._filters.items()):
            for _ in range(count):
                self._call("add_filter", (topic_filter,), {}).addErrback(self._again_failed, topic_filter)
        self._rewatch()

    @staticmethod
    def _again_failed(failure, what: str) -> None:
        log.warning("remote_store_reregister_failed what=%s reason=%s", what, failure.getErrorMessage())

    # -- notify ---------------------------------------------------------------------------------------

    def watch_queue(self, queue: str, callback: Callable[[str], None]) -> defer.Deferred:
        """As ``Queues.watch_queue``: the broker's event frames call ``callback``."""
        def registered(remote: api.Watch) -> api.Watch:
            local = api.Watch(queue, next(self._ids))
            self._watches[local.watch_id] = (queue, callback, remote)
            return local

        return self._call("watch_queue", (queue, callback), {}).addCallback(registered)

    def unwatch_queue(self, watch: api.Watch) -> defer.Deferred:
        """As ``Queues.unwatch_queue``."""
        held = self._watches.get(watch.watch_id) if isinstance(watch, api.Watch) else None
        if held is None or held[0] != watch.queue:
            return defer.fail(api.NotFound(f"no watch {getattr(watch, 'watch_id', watch)!r}"))
        del self._watches[watch.watch_id]
        return self._call("unwatch_queue", (held[2],), {}).addErrback(self._gone_with_connection)

    @staticmethod
    def _gone_with_connection(failure):
        failure.trap(api.NotFound, api.Unavailable)  # the broker dropped it already (a reconnect, or it is down)
        return None

    def _event(self, topic: str, body: bytes) -> None:
        if topic != QUEUE_EVENT:
            return
        self.events_received += 1
        try:
            queue = store_codec.unpack(body, str)
        except store_codec.CodecError:
            log.warning("remote_store_bad_event peer=%s", self.peer.peer_id)
            return
        for watched, callback, _remote in list(self._watches.values()):
            if watched == queue:
                callback(queue)

    def _rewatch(self) -> None:
        for local_id, (queue, callback, _old) in list(self._watches.items()):
            d = self._call("watch_queue", (queue, callback), {})
            d.addCallbacks(self._rewatched, self._again_failed, callbackArgs=(local_id,), errbackArgs=(queue,))

    def _rewatched(self, remote: api.Watch, local_id: int) -> None:
        held = self._watches.get(local_id)
        if held is None:  # unwatched meanwhile
            self._call("unwatch_queue", (remote,), {}).addErrback(lambda _f: None)
            return
        queue, callback, _old = held
        self._watches[local_id] = (queue, callback, remote)
        callback(queue)  # news may have come while disconnected

    # -- native forwarding ------------------------------------------------------------------------------

    def native_request(self, request: dict, max_data_bytes: int | None = None) -> defer.Deferred:
        """Forward one native protocol request (the client's JSON object) whole; fires with the reply dict.

        ``max_data_bytes`` bounds the reply's data (a UDP listener's budget), as ``NativeEngine.handle``'s.
        """
        body = msgpack.packb([request, max_data_bytes], use_bin_type=True)
        if self.wait_connected > 0 and not self.peer.connected:
            d = self._when_connected().addCallback(lambda _: self.peer.call(NATIVE_REQUEST, body))
        else:
            d = self.peer.call(NATIVE_REQUEST, body)
        return d.addCallbacks(lambda body: msgpack.unpackb(body, raw=False), _as_store_error)


def _forwarder(name: str) -> Callable:
    op = store_codec.OPERATIONS[name]

    def call(self: RemoteStore, *args: Any, **kwargs: Any) -> defer.Deferred:
        return self._call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"As ``store.api.Store.{name}{op.signature}``, on the broker."
    return call


# One forwarder per interface operation, from the codec's table; only the watch pair is written out above.
for _name in store_codec.OPERATIONS:
    if _name not in RemoteStore.__dict__:
        setattr(RemoteStore, _name, _forwarder(_name))
del _name
