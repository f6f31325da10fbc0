"""The native protocol service the node composes: engine + durable state + TCP and UDP adapters."""

from __future__ import annotations

import os

from twisted.internet import defer, protocol

from lightqueue.native_engine import NativeEngine
from mqtt_proxy.native.codec import TopicLimits
from mqtt_proxy.native.protocol import NativeTCPFactory, NativeUDPProtocol
from store.config import NativeConfig
from store.kv import DurableKV
from store.session_log import SessionLog

STATE_DIR = "native"
LOG_NAMESPACE = "native"  # the native KV's records in the commit log (store.session_log)


class NativeService:
    """``NativeService(store, data_dir, config, clock, timers, executor)``; ``open()`` before listening,
    ``stop()`` before the store closes.

    ``executor`` runs the KV's WAL fsyncs (``kv_sync``) off the reactor thread; without one they run inline.
    The engine's state (cursors, messages in flight, POP checkpoints, queues) is in its KV at once and in
    the commit log every ``position_log_s`` (``store.session_log``, all of it positions), so a replica
    resumes from it at most that old: messages redelivered, none lost.
    ``topic_limits``: the MQTT side's topic bounds, which topics named in native requests obey too.
    """

    def __init__(self, store, data_dir: str, config: NativeConfig, clock, timers=None, executor=None,
                 retained_quota=None, topic_limits: TopicLimits | None = None, position_log_s: float = 1.0) -> None:
        self.store = store
        self.config = config
        self.topic_limits = topic_limits
        self.clock = clock
        self.timers = timers
        sync = bool(getattr(getattr(store, "config", None), "kv_sync", False))
        self.kv = DurableKV(os.path.join(data_dir, STATE_DIR), clock, sync=sync, executor=executor)
        self.state_log = SessionLog(store, self.kv, clock, position_log_s, namespace=LOG_NAMESPACE,
                                    positions_only=True)
        self.engine = NativeEngine(store, self.state_log, config, clock, timers, retained_quota)
        self.counters = self.engine.counters
        self.connections: set = set()
        self._udp: list[NativeUDPProtocol] = []
        self._opened = False
        self._stopped = False
        store.add_listener(self.engine.note_queues)
        store.add_truncate_listener(self.engine.log_truncated_to)

    def open(self) -> defer.Deferred:
        """Load consumer offsets and in-flight state (call after ``store.open()``); a native KV from before
        the commit log held it is appended to the log once (fires when that is durable)."""
        if self._opened:
            return defer.succeed(None)
        d = self.state_log.open()
        self.engine.open()
        self._opened = True
        return d

    def tcp_factory(self) -> protocol.Factory:
        """The factory to listen with on a TCP endpoint."""
        return NativeTCPFactory(self)

    def udp_protocol(self) -> protocol.DatagramProtocol:
        """A protocol to pass to ``reactor.listenUDP``."""
        p = NativeUDPProtocol(self)
        self._udp.append(p)
        return p

    def stop(self) -> defer.Deferred:
        """Drop client connections, make staged state durable and close the KV."""
        if self._stopped:
            return defer.succeed(None)
        self._stopped = True
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.close()
        return self.state_log.stop().addBoth(lambda _: self.kv.close())

    def stats(self) -> dict[str, float]:
        """Gauges and counters for Prometheus (names without the ``twistmq_`` prefix)."""
        out = self.engine.stats()
        out["native_tcp_connections"] = float(len(self.connections))
        return out


def topic_limits(limits) -> TopicLimits:
    """The ``[limits]`` topic bounds (``max_topic_length``, ``max_topic_levels``) for the native adapters."""
    return TopicLimits(limits.max_topic_length, limits.max_topic_levels)


__all__ = ["NativeService", "NativeConfig", "topic_limits"]
