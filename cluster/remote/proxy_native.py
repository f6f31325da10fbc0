"""The native protocol on a proxy: the same TCP and UDP adapters, each request forwarded whole to its group.

A request goes to the broker group of its queue (by name) or topic (by first
level), as the ``native.request`` RPC (``cluster.remote.server``), and its reply
comes back as the engine there wrote it. Requests naming no queue
(``queue_list``, ``node_monitor``, ...) are answered by every group and the
lists merged. A group that cannot be reached answers ``{"code": -1, "reason":
"broker group ... unavailable ..."}``: nothing is acknowledged that its broker
did not store.
"""

from __future__ import annotations

import logging

from twisted.internet import defer, protocol

from cluster.routing import SlotTable
from mqtt_proxy.native.codec import TopicLimits, error_reply, request_object
from mqtt_proxy.native.protocol import NativeTCPFactory, NativeUDPProtocol
from store import api
from store.config import NativeConfig

log = logging.getLogger("twistmq.proxy.native")


class ForwardingEngine:
    """What the native adapters call (``serve``/``handle``), forwarding to ``remotes[group]``."""

    def __init__(self, table: SlotTable, remotes: dict) -> None:
        self.table = table
        self.remotes = remotes
        self.forwarded = 0
        self.unavailable = 0

    def serve(self, req, done) -> None:
        self.handle(req).addCallback(done)

    def handle(self, req, max_data_bytes: int | None = None) -> defer.Deferred:
        obj = request_object(req)
        if req.queue is not None:
            groups = (self.table.group_of_queue(req.queue),)
        elif req.topic is not None:
            groups = (self.table.group_of_topic(req.topic),)
        else:
            groups = self.table.groups
        ds = [self._forward(g, obj, req, max_data_bytes) for g in groups]
        if len(ds) == 1:
            return ds[0]
        return defer.gatherResults(ds).addCallback(_merged)

    def _forward(self, group: str, obj: dict, req, max_data_bytes) -> defer.Deferred:
        self.forwarded += 1
        d = self.remotes[group].native_request(obj, max_data_bytes)

        def failed(failure):
            failure.trap(api.StoreError)
            self.unavailable += 1
            log.warning("native_forward_failed group=%s reason=%s", group, failure.getErrorMessage())
            return error_reply(f"broker group {group} unavailable: {failure.getErrorMessage()}", req.echo)

        return d.addErrback(failed)

    def stats(self) -> dict[str, float]:
        return {"native_forwarded_requests": float(self.forwarded),
                "native_forward_failures": float(self.unavailable)}


def _merged(replies: list[dict]) -> dict:
    """One reply from each group's: the first error, else the first reply with list fields concatenated."""
    for reply in replies:
        if reply.get("code", 0) != 0:
            return reply
    out = dict(replies[0])
    for reply in replies[1:]:
        for key, value in reply.items():
            if isinstance(value, list) and isinstance(out.get(key), list):
                out[key] = out[key] + value
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("code", "seq", "action") \
                    and isinstance(out.get(key), (int, float)):
                out[key] = out[key] + value
    return out


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
