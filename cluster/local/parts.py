"""The store half of a node: the parts that hold durable state, shared by the ``node`` and ``broker`` roles.

Commit log (``MessageStore``, which locks the data dir), the light-queue index,
the retained index, the timer service and the session log (dispatchers, so
made before the store opens), the session KV it derives, the notifier fed by
the store's listener, the native service (engine + its KV), and the executor
their blocking work runs on. Built and wired, not opened: the role's service tree opens them in
``tree_parts()`` order and closes them in reverse.
"""

from __future__ import annotations

import os

from cluster.local.native_service import NativeService, topic_limits
from cluster.local.store import LocalStore
from cluster.runtime.heap import TickCollector
from cluster.runtime.histogram import Histogram
from cluster.runtime.services import Part
from lightqueue import attach as attach_lightqueue
from lightqueue.names import lmq_name
from lightqueue.retained_index import RetainedIndex
from push.notifier import Notifier
from store.api import Owed
from store.config import NativeConfig, from_mapping
from store.executor import ThreadPoolExecutor
from store.kv import DurableKV
from store.dispatch import StoreObserver
from store.message_store import MessageStore
from store.session_log import SessionLog
from store.session_store import SessionStore
from store.timer_service import TimerService


class StoreParts(StoreObserver):
    """``StoreParts(reactor, cfg)``: every stateful part of one broker group on ``cfg.node.data_dir``.

    It is its store's observer (``StoreObserver``): the parts that care about
    appends (the notifier's and native readers' watches, the collector, the
    append-latency histogram) are its own, so the store is handed them whole at
    construction instead of hooks set on it afterwards.
    """

    def __init__(self, reactor, cfg) -> None:
        data_dir = cfg.node.data_dir
        # fsyncs and RocksDB flushes run here: the commit log, both KVs' WAL syncs, the index flush and the
        # timer checkpoint can each have one in flight, so none waits for a thread behind another.
        self.executor = ThreadPoolExecutor(reactor, max_threads=6)
        self.append_latency = Histogram()  # from the start of a commit-log batch write to its acknowledgement
        self.store = MessageStore(data_dir, cfg.store, reactor, self.executor, observer=self)  # locks the data dir
        self.index = attach_lightqueue(self.store)
        self.retained = RetainedIndex(os.path.join(data_dir, "retained"), cfg.limits.max_retained_messages,
                                      cfg.limits.max_retained_bytes)
        self.store.register_dispatcher(self.retained)
        self.timers = TimerService(self.store, os.path.join(data_dir, "timer"), reactor,
                                   executor=self.executor)  # a dispatcher: made before open
        self.kv = DurableKV(os.path.join(data_dir, "sessions"), reactor, sync=cfg.store.kv_sync,
                             executor=self.executor)
        # Session state is written through the commit log (so it replicates) and indexed into the KV.
        self.session_log = SessionLog(self.store, self.kv, reactor, cfg.store.session_position_log_s)
        self.notifier = Notifier(reactor)
        self.store.add_listener(self.notifier.notify_now)  # the store's news comes merged per batch
        self.native_config = from_mapping(NativeConfig, "native", cfg.native)
        self.native = NativeService(self.store, data_dir, self.native_config, reactor, self.timers,
                                    executor=self.executor, retained_quota=self.retained.would_exceed,
                                    topic_limits=topic_limits(cfg.limits),
                                    position_log_s=cfg.store.session_position_log_s)
        self.store.retention.add_holder(self.native.engine.owed)
        self.store.retention.add_carrier(self.retained.records_to_carry)
        # The collector's passes come after each drain (cluster/runtime/heap.py); the role starts it once recovery is done.
        self.collector = TickCollector(reactor)

    # -- the store's observer --------------------------------------------------------------------

    def read_soon(self, queues: tuple[str, ...], excluding=None) -> bool:
        """Appends stay in memory for MQTT watchers (but those ``excluding`` names) and for native consumers near
        the tail alike."""
        return self.notifier.watched(queues, excluding) or self.native.engine.reads_soon(queues)

    def appended(self, seconds: float) -> None:
        self.append_latency.observe(seconds)

    def drained(self) -> None:
        self.collector.collect_due()

    def hold_stored_sessions(self) -> None:
        """Make retention keep what the sessions in the session KV owe (a broker: its proxies' sessions live
        there, not in memory; the node's front end holds its live sessions itself)."""
        self.store.retention.add_holder(lambda: stored_sessions_owed(SessionStore(self.session_log)))

    def local_store(self, group: str, own_holder: str = "") -> LocalStore:
        """The store interface over these parts, as broker group ``group``; ``own_holder``: the holder of the
        front end in this process, if any (its claims wait for its sessions' writes: ``LocalSessions``)."""
        return LocalStore(self.store, self.notifier, self.retained, self.timers, SessionStore(self.session_log),
                          self.native.engine, group=group, native_topic_limits=self.native.topic_limits,
                          own_holder=own_holder)

    def tree_parts(self) -> list[Part]:
        """The parts as service-tree children, in start order (the tree stops them in reverse)."""
        return [
            Part("executor", start=self.executor.start, stop=self.executor.stop),
            Part("sessions-kv", stop=self.kv.close),  # opened when built; closed after the store
            Part("store", start=self.store.open, stop=self.store.close),
            Part("session-log", start=self.session_log.open, stop=self.session_log.stop),  # upgrades an old KV
            Part("timers", start=self.timers.start, stop=self.timers.stop),
            Part("native", start=self.native.open, stop=self.native.stop),
        ]


def stored_sessions_owed(sessions: SessionStore):
    """Retention holder over stored sessions: each subscription owes from its oldest outbound message in
    flight, else its next offset (shared groups' committed positions are not counted yet)."""
    for cid, session in sessions.load_all().items():
        inflight: dict[str, int] = {}
        for key, offset, _qos in session.outbound.values():
            inflight[key] = min(offset, inflight.get(key, offset))
        for key, sub in session.subscriptions.items():
            if sub.share_group is None:
                yield Owed("session " + cid, lmq_name(sub.topic_filter),
                           min(sub.next_offset, inflight.get(key, sub.next_offset)))
