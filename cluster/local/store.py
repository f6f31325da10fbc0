"""``LocalStore``: the store interface served in-process, by the parts a node already builds.

It takes the parts rather than building them, so the node (and later the
broker role) hands it what it composed: the ``MessageStore`` with its light
queue index installed, the ``Notifier`` fed by the store's listener, the
``RetainedIndex`` and ``TimerService`` registered as dispatchers, the
``SessionStore`` and the ``NativeEngine``. Opening and closing them stays with
their owner. A local store is one broker group, named by ``group``: every
position it hands out carries it, and positions of other groups are refused.

Every failure reaches the caller as a ``store.api.StoreError`` subclass, as it
would through the RPC (``cluster.remote.codec``); anything unexpected is logged
here and reported as ``InternalError``.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable

from twisted.internet import defer
from twisted.python.failure import Failure

from cluster.local.sessions import LocalSessions, position_offset
from lightqueue.names import QueueNameError
from lightqueue.native_engine import NativeEngine
from lightqueue.retained_index import RetainedIndex
from lightqueue.topic import TopicError, validate_topic_filter, validate_topic_name
from lightqueue.topic_trie import FilterShapeLimit
from mqtt_proxy.native import codec as native_codec
from push.notifier import Notifier
from store import api
from store import record as rec
from store.message_store import MAX_GET_COUNT, MessageStore
from store.session_store import SessionStore
from store.timer_service import TimerNotFound, TimerService

log = logging.getLogger("twistmq.cluster.local.store")

DEFAULT_GROUP = "local"


def _typed(fn: Callable) -> Callable:
    """Run ``fn`` as a Deferred-returning call whose failures are all StoreErrors."""

    name = fn.__name__

    @functools.wraps(fn)
    def call(self, *args, **kwargs) -> defer.Deferred:
        try:
            result = fn(self, *args, **kwargs)
        except Exception:  # noqa: BLE001 - every failure reaches the caller, typed
            return defer.fail().addErrback(_as_store_error, name)
        if not isinstance(result, defer.Deferred):
            return defer.succeed(result)
        # Paused: waiting on another Deferred (its result is that one). Failure is a plain class: Deferred's
        # ABCMeta makes isinstance against it a slow call for anything else.
        if result.called and not result.paused and not isinstance(result.result, Failure):
            return result  # answered already, and well (a claim, a session read): nothing to type
        return result.addErrback(_as_store_error, name)

    return call


def _as_store_error(failure, operation: str):
    if failure.check(api.StoreError):
        return failure
    log.error("store_operation_failed operation=%s error=%s", operation, failure.getTraceback())
    raise api.InternalError(f"{operation}: {failure.type.__name__}: {failure.getErrorMessage()}")


# A frozen dataclass's __init__ sets each field through object.__setattr__; filling the slots directly
# makes the same object (equal, hashable, immutable afterwards) in about half the time, which counts on
# the per-message paths: a position and a queued message per read one.
_new = object.__new__
_QP, _QM = api.QueuePosition, api.QueuedMessage
_qp_queue, _qp_group, _qp_offset = (_QP.__dict__[f].__set__ for f in ("queue", "group", "offset"))
_qm_position, _qm_record = (_QM.__dict__[f].__set__ for f in ("position", "record"))


def _queued(queue: str, group: str, offset: int, record: rec.Record) -> api.QueuedMessage:
    p = _new(_QP)
    _qp_queue(p, queue)
    _qp_group(p, group)
    _qp_offset(p, offset)
    m = _new(_QM)
    _qm_position(m, p)
    _qm_record(m, record)
    return m


def _check_message(message: rec.Message) -> rec.Message:
    if not isinstance(message, rec.Message):
        raise api.InvalidArgument(f"expected a Message, got {type(message).__name__}")
    return message


class LocalStore:
    """``store.api.Store`` over the in-process parts (see the module doc)."""

    def __init__(self, store: MessageStore, notifier: Notifier, retained: RetainedIndex, timers: TimerService,
                 sessions: SessionStore, native: NativeEngine, group: str = DEFAULT_GROUP,
                 native_topic_limits: native_codec.TopicLimits | None = None, own_holder: str = "") -> None:
        self._store = store
        self._notifier = notifier
        self._retained = retained
        self._timers = timers
        self._sessions = LocalSessions(sessions, group, own_holder)  # own_holder: LocalSessions' doc
        self._engine = native
        self._topic_limits = native_topic_limits
        self.group = group
        self._watches: dict[int, tuple[str, Callable[[str], None]]] = {}

    # -- the message log ---------------------------------------------------------------------------

    @_typed
    def append(self, message: rec.Message) -> defer.Deferred:
        return self._store.put(_check_message(message))  # a PutResult is an AppendResult

    @_typed
    def append_batch(self, messages: tuple[rec.Message, ...]) -> defer.Deferred:
        batch = messages if all(type(m) is rec.Message for m in messages) else [_check_message(m) for m in messages]
        if not batch:
            return defer.succeed(())
        # One Deferred and one callback for the batch: a proxy sends every PUBLISH of a tick here,
        # and a Deferred (or a callback) per message was a measurable share of that path.
        done: defer.Deferred = defer.Deferred()
        self._store.submit_batch(batch, lambda results: done.callback(tuple(results)))
        return done

    @_typed
    def append_batch_indexed(self, messages: tuple[rec.Message, ...], wanted) -> defer.Deferred:
        """``append_batch``, firing with ``(results, indexed)``: ``indexed`` an ``api.IndexedAppend`` of where the
        records went in the ``wanted`` queues (queue -> watches of it the caller holds), or None (not readable
        yet, or none)."""
        batch = messages if all(type(m) is rec.Message for m in messages) else [_check_message(m) for m in messages]
        if not batch:
            return defer.succeed(((), None))
        done: defer.Deferred = defer.Deferred()

        def answered(results, indexed):
            done.callback((tuple(results), indexed._replace(group=self.group) if indexed is not None else None))

        self._store.submit_batch(batch, answered, wanted=wanted)
        return done

    # -- queues --------------------------------------------------------------------------------------

    def _position(self, queue: str, offset: int) -> api.QueuePosition:
        return api.QueuePosition(queue, self.group, offset)

    @_typed
    def first_positions(self, queue: str) -> defer.Deferred:
        return self._store.min_offset(queue).addCallback(lambda off: (self._position(queue, off),))

    @_typed
    def end_positions(self, queue: str) -> defer.Deferred:
        return self._store.max_offset(queue).addCallback(lambda off: (self._position(queue, off),))

    @_typed
    def read_queue(self, position: api.QueuePosition, max_count: int) -> defer.Deferred:
        offset = position_offset(position, self.group)
        if not isinstance(max_count, int) or max_count < 1:
            raise api.InvalidArgument(f"max_count must be at least 1, not {max_count!r}")
        queue = position.queue

        group = self.group

        def build(messages: list) -> defer.Deferred | api.ReadResult:
            out = tuple([_queued(queue, group, m.queue_offset, m.record) for m in messages])
            if out:
                last = messages[-1].queue_offset
                return api.ReadResult(out, self._position(queue, last + 1), last + 1 - offset - len(out))
            # Nothing at or after ``offset``: if retention took it, continue from the oldest entry left.
            return self._store.min_offset(queue).addCallback(
                lambda head: api.ReadResult((), self._position(queue, max(head, offset)), max(0, head - offset)))

        return self._store.get(queue, offset, min(max_count, MAX_GET_COUNT)).addCallback(build)

    @_typed
    def add_filter(self, topic_filter: str, restoring: bool = False) -> defer.Deferred:
        def failed(failure):
            failure.trap(TopicError, QueueNameError, UnicodeEncodeError)
            if failure.check(FilterShapeLimit):
                raise api.QuotaExceeded(f"topic filter {topic_filter!r}: {failure.getErrorMessage()}")
            raise api.InvalidArgument(f"topic filter {topic_filter!r}: {failure.getErrorMessage()}")

        return self._store.add_filter(topic_filter, not restoring).addErrback(failed)

    @_typed
    def remove_filter(self, topic_filter: str) -> defer.Deferred:
        def failed(failure):
            failure.trap(KeyError)
            raise api.NotFound(f"no interest in topic filter {topic_filter!r}")

        return self._store.remove_filter(topic_filter).addCallbacks(lambda _: None, failed)

    @_typed
    def watch_queue(self, queue: str, callback: Callable[[str], None]) -> defer.Deferred:
        def relay(name: str) -> None:
            callback(name)

        key = id(relay)  # unique while the watch lives; other watchers of the notifier key by id() too
        self._watches[key] = (queue, relay)
        self._notifier.watch(queue, key, relay)
        return api.Watch(queue, key)

    @_typed
    def unwatch_queue(self, watch: api.Watch) -> defer.Deferred:
        held = self._watches.get(watch.watch_id)
        if held is None or held[0] != watch.queue:
            raise api.NotFound(f"no watch {watch.watch_id} on queue {watch.queue!r}")
        del self._watches[watch.watch_id]
        self._notifier.unwatch(watch.queue, watch.watch_id)
        return None

    # -- session state ---------------------------------------------------------------------------------

    def add_claim_listener(self, listener: Callable[[str, str, int], None]) -> None:
        """Hear of claims that take a session from another holder: ``listener(client_id, old_holder, epoch)``.

        Not part of the interface: the broker role carries these events to the old holder over RPC.
        """
        self._sessions.add_claim_listener(listener)

    @property
    def session_claims(self) -> LocalSessions:
        """The claims and session state behind the interface (the group's session keeper takes over with it).
        Not part of the interface."""
        return self._sessions

    @property
    def claims(self) -> int:
        """Session claims on record (ids held by a proxy, or stored). Not part of the interface."""
        return len(self._sessions.claims)

    @_typed
    def claim_session(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred:
        return self._sessions.claim_session(client_id, holder, owner)

    @_typed
    def claim_and_get(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred:
        return self._sessions.claim_and_get(client_id, holder, owner)

    @_typed
    def release_session(self, client_id: str, epoch: int) -> defer.Deferred:
        return self._sessions.release_session(client_id, epoch)

    @_typed
    def get_session(self, client_id: str) -> defer.Deferred:
        return self._sessions.get_session(client_id)

    @_typed
    def list_sessions(self) -> defer.Deferred:
        return self._sessions.list_sessions()

    def list_wills(self) -> defer.Deferred:
        return self._sessions.list_wills()

    @_typed
    def put_session(self, meta: api.SessionMeta, epoch: int) -> defer.Deferred:
        return self._sessions.put_session(meta, epoch)

    @_typed
    def delete_session(self, client_id: str, epoch: int) -> defer.Deferred:
        return self._sessions.delete_session(client_id, epoch)

    @_typed
    def put_subscription(self, client_id: str, subscription: api.SubscriptionState, epoch: int) -> defer.Deferred:
        return self._sessions.put_subscription(client_id, subscription, epoch)

    @_typed
    def delete_subscription(self, client_id: str, key: str, epoch: int) -> defer.Deferred:
        return self._sessions.delete_subscription(client_id, key, epoch)

    @_typed
    def put_outbound(self, client_id: str, outbound: api.OutboundState, epoch: int) -> defer.Deferred:
        return self._sessions.put_outbound(client_id, outbound, epoch)

    @_typed
    def delete_outbound(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._sessions.delete_outbound(client_id, packet_id, epoch)

    @_typed
    def put_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._sessions.put_released(client_id, packet_id, epoch)

    @_typed
    def delete_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._sessions.delete_released(client_id, packet_id, epoch)

    @_typed
    def put_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._sessions.put_inbound_qos2(client_id, packet_id, epoch)

    @_typed
    def delete_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._sessions.delete_inbound_qos2(client_id, packet_id, epoch)

    @_typed
    def put_will(self, client_id: str, will: api.WillState, epoch: int) -> defer.Deferred:
        return self._sessions.put_will(client_id, will, epoch)

    @_typed
    def delete_will(self, client_id: str, epoch: int) -> defer.Deferred:
        return self._sessions.delete_will(client_id, epoch)

    @_typed
    def get_share_positions(self, share_group: str, topic_filter: str) -> defer.Deferred:
        return self._sessions.get_share_positions(share_group, topic_filter)

    @_typed
    def put_share_position(self, share_group: str, topic_filter: str,
                           position: api.QueuePosition) -> defer.Deferred:
        return self._sessions.put_share_position(share_group, topic_filter, position)

    # -- retained messages ---------------------------------------------------------------------------------

    @_typed
    def get_retained(self, topic_filter: str) -> defer.Deferred:
        try:
            validate_topic_filter(topic_filter)
        except (TopicError, UnicodeEncodeError) as exc:
            raise api.InvalidArgument(f"topic filter {topic_filter!r}: {exc}") from None
        found = sorted(self._retained.lookup(topic_filter))
        reads = [self._store.read(cl_offset, size) for _topic, cl_offset, size in found]
        # A record retention deleted under a disk limit is skipped: the index forgets it on its next pass.
        d = defer.DeferredList(reads, consumeErrors=True)
        return d.addCallback(lambda results: tuple(
            api.RetainedMessage(topic, record) for (topic, _o, _s), (ok, record) in zip(found, results) if ok))

    @_typed
    def put_retained(self, message: rec.Message) -> defer.Deferred:
        m = _check_message(message)
        if m.kind != rec.RecordKind.MQTT_PUBLISH or not m.retain or not m.body:
            raise api.InvalidArgument("put_retained takes an MQTT publish with the retain flag and a payload "
                                      "(delete_retained clears a topic)")
        self._check_topic(m.topic)
        self._check_retained_quota(m)
        return self.append(m)

    def _check_retained_quota(self, m: rec.Message) -> None:
        if self._retained.would_exceed(m.topic, len(m.body)):
            raise api.QuotaExceeded(f"retaining {len(m.body)} bytes on {m.topic!r} exceeds the retained limits "
                                    f"(max_messages {self._retained.max_messages}, "
                                    f"max_bytes {self._retained.max_bytes})")

    @_typed
    def delete_retained(self, topic: str) -> defer.Deferred:
        self._check_topic(topic)
        return self.append(rec.Message(topic, b"", rec.RecordKind.MQTT_PUBLISH, 0, True))

    @staticmethod
    def _check_topic(topic: str) -> None:
        try:
            validate_topic_name(topic)
        except (TopicError, UnicodeEncodeError) as exc:
            raise api.InvalidArgument(f"topic {topic!r}: {exc}") from None

    # -- timers -------------------------------------------------------------------------------------------------

    @_typed
    def schedule_timer(self, message: rec.Message, deliver_at_ms: int) -> defer.Deferred:
        m = _check_message(message)
        if m.retain and m.body and m.kind == rec.RecordKind.MQTT_PUBLISH:
            self._check_retained_quota(m)  # a delayed retained message meets the quota when it is accepted
        return self._timers.schedule(m, deliver_at_ms)

    @_typed
    def cancel_timer(self, timer_id: int) -> defer.Deferred:
        def failed(failure):
            if failure.check(TimerNotFound):
                raise api.NotFound(failure.getErrorMessage())
            raise api.Unavailable(failure.getErrorMessage())

        return self._timers.cancel(timer_id).addErrback(failed)

    # -- native queues --------------------------------------------------------------------------------------------

    def native_request(self, request: api.NativeObject, max_data_bytes: int | None = None) -> defer.Deferred:
        """Validate with the native codec (the wire's own rules) and let the engine answer; a bad request is
        answered ``code: -1``, never failed."""
        if not isinstance(request, dict):
            return defer.fail(api.InvalidArgument(f"a native request is a JSON object, not {type(request).__name__}"))
        if max_data_bytes is not None and (type(max_data_bytes) is not int or max_data_bytes <= 0):
            return defer.fail(api.InvalidArgument("max_data_bytes must be a positive integer or None"))
        try:
            parsed = native_codec.parse_request(request, self._engine.config, self._topic_limits)
        except native_codec.RequestError as exc:
            return defer.succeed(api.native_types.error_reply(exc.reason, exc.echo))
        return self._engine.handle(parsed, max_data_bytes=max_data_bytes)
