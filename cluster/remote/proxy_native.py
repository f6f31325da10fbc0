"""The native protocol on a proxy: the same TCP and UDP adapters, each request forwarded whole to its group.

A request goes through the store interface's one native door
(``native_request``) of the routed store: to the broker group of its queue (by
name) or topic (by first level), and its reply comes back as the engine there
wrote it. Requests naming no queue (``queue_list``, ``node_monitor``, ...) are
answered by every group and the lists merged. A group that cannot be reached
answers ``{"code": -1, "reason": "broker group ... unavailable ..."}``: nothing
is acknowledged that its broker did not store.
"""

from __future__ import annotations

import logging

from twisted.internet import defer, protocol

from cluster.remote.routed_store import RoutedStore
from mqtt_proxy.native.codec import TopicLimits, request_object
from mqtt_proxy.native.protocol import NativeTCPFactory, NativeUDPProtocol
from store.config import NativeConfig

log = logging.getLogger("twistmq.proxy.native")


class ForwardingEngine:
    """What the native adapters call (``serve``/``handle``): each request whole through the routed store
    (``RoutedStore.native_request``: the group of its queue or topic, or every group for lists)."""

    def __init__(self, store: RoutedStore) -> None:
        self.store = store
        self.forwarded = 0

    def serve(self, req, done) -> None:
        self.handle(req).addCallback(done)

    def handle(self, req, max_data_bytes: int | None = None) -> defer.Deferred:
        self.forwarded += 1
        return self.store.native_request(request_object(req), max_data_bytes)

    def stats(self) -> dict[str, float]:
        return {"native_forwarded_requests": float(self.forwarded),
                "native_forward_failures": float(self.store.native_unavailable)}


class ProxyNativeService:
    """The native listeners' service on a proxy: the shape ``NativeService`` gives the adapters."""

    def __init__(self, engine: ForwardingEngine, config: NativeConfig, topic_limits: TopicLimits | None = None) -> None:
        self.engine = engine
        self.config = config
        self.topic_limits = topic_limits
        self.connections: set = set()
        self.counters = {"errors": 0, "expired": 0, "gap": 0, "dead_lettered": 0, "udp_datagrams": 0}
        self._udp: list = []

    def tcp_factory(self) -> protocol.Factory:
        return NativeTCPFactory(self)

    def udp_protocol(self) -> protocol.DatagramProtocol:
        p = NativeUDPProtocol(self)
        self._udp.append(p)
        return p

    def stop(self) -> defer.Deferred:
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.close()
        return defer.succeed(None)

    def stats(self) -> dict[str, float]:
        out = self.engine.stats()
        out["native_tcp_connections"] = float(len(self.connections))
        return out
