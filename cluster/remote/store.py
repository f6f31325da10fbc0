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

A broker that is not its group's master (a slave, on a route the metadata has not moved yet) answers a
write with its not-master reason (``NOT_MASTER``, naming its master): the call is made once more after the
proxy moved this store to the master's address (``moved``), or after ``wait_connected`` at the latest, so
native and MQTT clients never see that answer.

``watch_queue``'s callback stays here: the broker sends an event frame naming
the queue (and carrying the news' entries, kept in ``own`` for the reads it
wakes), and every local callback watching that queue is called. After a
reconnect the watches are registered again (the broker dropped them with the
old connection) and each callback is called once, since news may have been
missed in between; the ``Watch`` a caller holds stays valid.
"""

from __future__ import annotations

import itertools
import logging
from operator import attrgetter, countOf
from typing import Callable

from twisted.internet import defer
from twisted.python.failure import Failure as failure_type

from cluster.remote import codec as store_codec
from cluster.remote.own_appends import OwnAppends
from cluster.remote.server import QUEUE_EVENT, request_type
from cluster.rpc.peer import PeerClient
from cluster.rpc.protocol import CallTimeout, RemoteError
from store import api

log = logging.getLogger("twistmq.cluster.remote.store")


NOT_MASTER = "is a slave of"
"""What a slave's answer to a write says (``store.message_store``: "this broker is a slave of MASTER: ...")."""


def not_master(result) -> bool:
    """Whether an answer (a result, a tuple of results, a native reply or a failure) is a slave's refusal."""
    if isinstance(result, failure_type):
        return NOT_MASTER in result.getErrorMessage()
    if isinstance(result, api.AppendResult):
        return not result.ok and NOT_MASTER in result.reason
    if isinstance(result, tuple) and result and isinstance(result[0], api.AppendResult):
        # A batch's answer is nearly always all stored: counted by identity at C speed (an Enum hashes in Python).
        if countOf(map(_status_of, result), api.AppendStatus.PUT_OK) == len(result):
            return False
        return any(not_master(r) for r in result)
    if isinstance(result, dict):
        return result.get("code") == -1 and NOT_MASTER in str(result.get("reason", ""))
    return False


_status_of = attrgetter("status")


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
        self._watching: dict[str, int] = {}  # queue -> local watches of it (what ``own`` may keep entries of)
        self._filters: dict[str, int] = {}  # topic filter -> add_filter references held
        self.moves = 0
        """Times the proxy pointed this store at another broker of its group (``moved``)."""
        self.redirects = 0
        """Calls made again after a slave's not-master answer (for metrics and tests)."""
        self._move_waiters: list[defer.Deferred] = []
        self.own = OwnAppends()
        """The entries this proxy's appends made in the queues it watches, and those its news carried: reads of
        them need no call."""
        peer.on_event(self._event)
        peer.on_connected(self._reconnected)

    def _call(self, name: str, args: tuple, kwargs: dict, unpack: Callable[[bytes], object] | None = None
              ) -> defer.Deferred:
        try:
            frame = store_codec.pack_call(name, args, kwargs)
        except store_codec.CodecError as exc:
            return defer.fail(api.InvalidArgument(str(exc)))
        if unpack is None:
            unpack = lambda body: store_codec.unpack_result(name, body)  # noqa: E731
        if self.wait_connected > 0 and not self.peer.connected:
            d = self._when_connected().addCallback(lambda _: self.peer.call(request_type(name), frame))
        else:
            d = self.peer.call(request_type(name), frame)
        d.addCallbacks(unpack, _as_store_error)
        return d.addBoth(self._redirect, name, frame, self.moves, unpack)

    def _redirect(self, result, name: str, frame: bytes, moves: int, unpack: Callable[[bytes], object]):
        """A slave answered (a stale route): once this store points at the master, make the call there."""
        if not not_master(result):
            return result
        self.redirects += 1
        log.info("remote_store_not_master call=%s broker=%s reason=%s", name, self.peer.peer_id,
                 result.getErrorMessage() if isinstance(result, failure_type) else "slave's answer")

        def again(_=None):
            d = self.peer.call(request_type(name), frame) if self.peer.connected or self.wait_connected <= 0 else \
                self._when_connected().addCallback(lambda _: self.peer.call(request_type(name), frame))
            return d.addCallbacks(unpack, _as_store_error)

        if self.moves != moves:  # already moved while the answer was on its way
            return again()
        waiter = defer.Deferred()
        self._move_waiters.append(waiter)
        timer = self.peer.clock.callLater(max(self.wait_connected, 1.0), self._moved_or_late, waiter)
        waiter.addBoth(lambda r: (timer.cancel() if timer.active() else None, r)[1])
        return waiter.addCallback(again)

    def _moved_or_late(self, waiter: defer.Deferred) -> None:
        if waiter in self._move_waiters:
            self._move_waiters.remove(waiter)
            waiter.callback(None)

    def moved(self) -> None:
        """The proxy pointed this store at its group's new master: calls a slave refused are made there."""
        self.moves += 1
        self.own.clear()
        waiters, self._move_waiters = self._move_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _when_connected(self) -> defer.Deferred:
        def late(failure):
            failure.trap(defer.TimeoutError)
            refused = self.peer.last_refusal
            why = f" (its handshake was refused: {refused})" if refused else ""
            raise api.Unavailable(f"broker {self.peer.peer_id} unreachable for {self.wait_connected:g} s{why}")
        d = self.peer.when_connected()
        d.addTimeout(self.wait_connected, self.peer.clock)
        return d.addErrback(late)

    # -- interest -------------------------------------------------------------------------------------

    def add_filter(self, topic_filter: str, restoring: bool = False) -> defer.Deferred:
        """As ``Queues.add_filter``; the reference is remembered, to be taken again after a reconnect."""
        def added(queue: str) -> str:
            self._filters[topic_filter] = self._filters.get(topic_filter, 0) + 1
            return queue

        return self._call("add_filter", (topic_filter, restoring), {}).addCallback(added)

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
        self.own.clear()  # another broker, perhaps, and news missed meanwhile
        for topic_filter, count in list(self._filters.items()):
            for _ in range(count):
                # taken again after a reconnect: accepted before, never refused for the shape bound
                self._call("add_filter", (topic_filter, True), {}).addErrback(self._again_failed, topic_filter)
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
            self._watching[queue] = self._watching.get(queue, 0) + 1
            return local

        return self._call("watch_queue", (queue, callback), {}).addCallback(registered)

    def unwatch_queue(self, watch: api.Watch) -> defer.Deferred:
        """As ``Queues.unwatch_queue``."""
        held = self._watches.get(watch.watch_id) if isinstance(watch, api.Watch) else None
        if held is None or held[0] != watch.queue:
            return defer.fail(api.NotFound(f"no watch {getattr(watch, 'watch_id', watch)!r}"))
        del self._watches[watch.watch_id]
        left = self._watching.get(watch.queue, 0) - 1
        if left > 0:
            self._watching[watch.queue] = left
        else:  # no news of it comes any more: what own knows of it would go stale
            self._watching.pop(watch.queue, None)
            self.own.forget(watch.queue)
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
            queue, end, entries = store_codec.unpack_queue_news(body)
        except store_codec.CodecError:
            log.warning("remote_store_bad_event peer=%s", self.peer.peer_id)
            return
        if queue not in self._watching:  # unwatched since it was sent: nothing of it is kept
            return
        if entries is not None and entries.next.queue == queue:  # the news' own entries: read without a call
            self.own.add_read(entries)
        self.own.news(queue, end)  # before the watchers read
        self._tell(queue)

    def _tell(self, queue: str) -> None:
        """Call the local watchers of ``queue`` (one failing is logged: the others and the caller go on)."""
        for watched, callback, _remote in list(self._watches.values()):
            if watched == queue:
                try:
                    callback(queue)
                except Exception:  # noqa: BLE001 - a watcher's bug must not fail the append that told the news
                    log.exception("remote_store_watcher_failed queue=%s", queue)

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

    # -- the interface's other operations: each one call to the broker (``_call``) -------------------

    def append(self, message: api.Message) -> defer.Deferred[api.AppendResult]:
        return self._call("append", (message,), {})

    def append_batch(self, messages: tuple[api.Message, ...]) -> defer.Deferred[tuple[api.AppendResult, ...]]:
        d = self._call("append_batch", (messages,), {}, lambda body: self._appended(messages, body))
        return d.addErrback(self._answer_lost)

    def _appended(self, messages: tuple[api.Message, ...], body: bytes) -> tuple[api.AppendResult, ...]:
        results, indexed = store_codec.unpack_append_answer(body)
        if indexed is not None and len(results) == len(messages):
            # The answer is the news of our entries: the broker sends no event of them to this connection.
            for queue, end in self.own.add(messages, results, indexed).items():
                if queue in self._watching:
                    self.own.news(queue, end)
                    self._tell(queue)
                else:  # unwatched while the append was on its way
                    self.own.forget(queue)
        return results

    def _answer_lost(self, failure):
        """An append that timed out may have been stored, and its answer was the news of it: watchers hear of
        every queue (a read too many, never a message missed)."""
        if failure.check(CallTimeout):
            for queue in {queue for queue, _cb, _w in self._watches.values()}:
                self._tell(queue)
        return failure

    def first_positions(self, queue: str) -> defer.Deferred[tuple[api.QueuePosition, ...]]:
        return self._call("first_positions", (queue,), {})

    def end_positions(self, queue: str) -> defer.Deferred[tuple[api.QueuePosition, ...]]:
        return self._call("end_positions", (queue,), {})

    def read_queue(self, position: api.QueuePosition, max_count: int) -> defer.Deferred[api.ReadResult]:
        if type(position) is api.QueuePosition and type(max_count) is int:
            kept = self.own.read(position, max_count)  # what this proxy appended itself, if all the answer
            if kept is not None:
                return defer.succeed(kept)
        return self._call("read_queue", (position, max_count), {})

    def claim_session(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred[int]:
        return self._call("claim_session", (client_id, holder, owner), {})

    def claim_and_get(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred[api.ClaimedSession]:
        return self._call("claim_and_get", (client_id, holder, owner), {})

    def release_session(self, client_id: str, epoch: int) -> defer.Deferred[None]:
        return self._call("release_session", (client_id, epoch), {})

    def get_session(self, client_id: str) -> defer.Deferred[api.SessionState | None]:
        return self._call("get_session", (client_id,), {})

    def list_sessions(self) -> defer.Deferred[tuple[api.SessionState, ...]]:
        return self._call("list_sessions", (), {})

    def list_wills(self) -> defer.Deferred[tuple[api.HeldWill, ...]]:
        return self._call("list_wills", (), {})

    def put_session(self, meta: api.SessionMeta, epoch: int) -> defer.Deferred[None]:
        return self._call("put_session", (meta, epoch), {})

    def delete_session(self, client_id: str, epoch: int) -> defer.Deferred[None]:
        return self._call("delete_session", (client_id, epoch), {})

    def put_subscription(self, client_id: str, subscription: api.SubscriptionState,
                         epoch: int) -> defer.Deferred[None]:
        return self._call("put_subscription", (client_id, subscription, epoch), {})

    def delete_subscription(self, client_id: str, key: str, epoch: int) -> defer.Deferred[None]:
        return self._call("delete_subscription", (client_id, key, epoch), {})

    def put_outbound(self, client_id: str, outbound: api.OutboundState, epoch: int) -> defer.Deferred[None]:
        return self._call("put_outbound", (client_id, outbound, epoch), {})

    def delete_outbound(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        return self._call("delete_outbound", (client_id, packet_id, epoch), {})

    def put_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        return self._call("put_released", (client_id, packet_id, epoch), {})

    def delete_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        return self._call("delete_released", (client_id, packet_id, epoch), {})

    def put_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        return self._call("put_inbound_qos2", (client_id, packet_id, epoch), {})

    def delete_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred[None]:
        return self._call("delete_inbound_qos2", (client_id, packet_id, epoch), {})

    def put_will(self, client_id: str, will: api.WillState, epoch: int) -> defer.Deferred[None]:
        return self._call("put_will", (client_id, will, epoch), {})

    def delete_will(self, client_id: str, epoch: int) -> defer.Deferred[None]:
        return self._call("delete_will", (client_id, epoch), {})

    def get_share_positions(self, share_group: str,
                            topic_filter: str) -> defer.Deferred[tuple[api.QueuePosition, ...]]:
        return self._call("get_share_positions", (share_group, topic_filter), {})

    def put_share_position(self, share_group: str, topic_filter: str,
                           position: api.QueuePosition) -> defer.Deferred[None]:
        return self._call("put_share_position", (share_group, topic_filter, position), {})

    def get_retained(self, topic_filter: str) -> defer.Deferred[tuple[api.RetainedMessage, ...]]:
        return self._call("get_retained", (topic_filter,), {})

    def put_retained(self, message: api.Message) -> defer.Deferred[api.AppendResult]:
        return self._call("put_retained", (message,), {})

    def delete_retained(self, topic: str) -> defer.Deferred[api.AppendResult]:
        return self._call("delete_retained", (topic,), {})

    def schedule_timer(self, message: api.Message, deliver_at_ms: int) -> defer.Deferred[api.AppendResult]:
        return self._call("schedule_timer", (message, deliver_at_ms), {})

    def cancel_timer(self, timer_id: int) -> defer.Deferred[bool]:
        return self._call("cancel_timer", (timer_id,), {})

    def native_request(self, request: api.NativeObject,
                       max_data_bytes: int | None = None) -> defer.Deferred[api.NativeObject]:
        return self._call("native_request", (request, max_data_bytes), {})
