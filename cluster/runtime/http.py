"""The node's HTTP listener: ``/health``, ``/metrics`` (Prometheus text), the admin API and the dashboard.

The admin API (``/api/v1/``, ``cluster.admin.api``) and the dashboard's static
files (``/dashboard/``) are mounted when given; /health and /metrics never need
the API's token. Every site is a ``BoundedSite`` (``cluster.runtime.http_bounds``):
a request must arrive whole within ``request_timeout`` seconds with a body of
at most ``max_body`` bytes, and one for the API is refused (401/403) from its
headers, before its body is read.
"""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from twisted.web import resource, static

from cluster.runtime.http_bounds import BoundedSite

MAX_BODY, REQUEST_TIMEOUT_S = 1 << 20, 30.0
"""Bounds of the sites without an [admin] section of their own (a broker's, a proxy's)."""


class _BrokerCollector:
    """Reads the live counters at scrape time (no copies to keep in sync)."""

    def __init__(self, front, store, extra, losses, lag=None, figures=None) -> None:
        self.figures = figures
        self.front = front
        self.store = store
        self.extra = extra
        self.losses = losses
        self.lag = lag

    def collect(self):
        s = self.front.stats
        counters = {
            "twistmq_messages_received": ("PUBLISH packets received", s.messages_received),
            "twistmq_messages_sent": ("PUBLISH packets sent", s.messages_sent),
            "twistmq_bytes_received": ("PUBLISH payload bytes received", s.bytes_received),
            "twistmq_bytes_sent": ("PUBLISH bytes sent", s.bytes_sent),
            "twistmq_connections": ("connections accepted", s.connections_total),
            "twistmq_connections_refused": ("CONNECTs refused", s.connections_refused),
            "twistmq_protocol_errors": ("connections closed for a protocol error", s.protocol_errors),
            "twistmq_messages_dropped": ("publishes refused by ACL or quota", s.messages_dropped),
            "twistmq_store_puts": ("records appended to the commit log", self.store.puts),
        }
        counters.update(self.losses())
        for name, (doc, value) in counters.items():
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        dropped = CounterMetricFamily("twistmq_retention_dropped_messages",
                                      "owed messages a disk limit deleted, by queue", labels=["queue"])
        for queue, n in sorted(self.store.retention.dropped.items()):
            dropped.add_metric([queue], n)
        yield dropped
        gauges = {
            "twistmq_clients_connected": ("clients connected now", s.clients_connected),
            "twistmq_sessions": ("sessions held, connected or not", len(self.front.sessions)),
            "twistmq_store_bytes": ("bytes of commit log on disk", self.store.size_bytes()),
        }
        for name, (doc, value) in gauges.items():
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        if self.lag is not None:
            yield _lag_gauge(self.lag)
        if self.figures is not None:
            yield from _figures(self.figures)
        yield from _extra_gauges(self.extra)


def _extra_gauges(extra):
    """``extra()`` yields (prefix, {name: value}) of other services: one gauge each."""
    for prefix, stats in extra():
        for key, value in stats.items():
            g = GaugeMetricFamily(f"twistmq_{prefix}_{key}", f"{prefix} {key}")
            g.add_metric([], float(value))
            yield g


def _lag_gauge(lag) -> GaugeMetricFamily:
    doc = (f"how late a timer asking to run every {lag.interval * 1000:g} ms ran, since start "
           "(quantile 1 is the maximum)")
    g = GaugeMetricFamily("twistmq_reactor_lag_seconds", doc, labels=["quantile"])
    for quantile, value in lag.stats().items():
        g.add_metric([quantile], value)
    return g


def _figures(figures):
    """The histograms, per-listener connections and light-queue lag of ``cluster.admin.metrics.NodeFigures``."""
    for name, doc, hist in (
            ("twistmq_deliver_latency_seconds", "from the store's stamp on a message to its PUBLISH written to a "
             "subscriber (the newest message of each batch a session sends)", figures.deliver),
            ("twistmq_store_append_latency_seconds", "from the start of a commit-log batch write to its "
             "acknowledgement (the fsync included under flush = sync)", figures.append)):
        h = HistogramMetricFamily(name, doc)
        h.add_metric([], hist.cumulative(), hist.sum)
        yield h
    g = GaugeMetricFamily("twistmq_listener_connections", "open connections per listener", labels=["listener"])
    for listener, n in sorted(figures.listener_connections().items()):
        g.add_metric([listener], n)
    yield g
    total, worst = figures.queue_lag()
    g = GaugeMetricFamily("twistmq_lightqueue_lag_messages", "light-queue entries session subscriptions have yet "
                          "to read, summed")
    g.add_metric([], total)
    yield g
    g = GaugeMetricFamily("twistmq_lightqueue_lag_max_messages", "the most entries one subscription has yet to read")
    g.add_metric([], worst)
    yield g


class Health(resource.Resource):
    isLeaf = True

    def __init__(self, store) -> None:
        super().__init__()
        self.store = store

    def render_GET(self, request):
        ok = self.store.is_open
        request.setResponseCode(200 if ok else 503)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"status": "ok" if ok else "starting"}).encode()


class Metrics(resource.Resource):
    isLeaf = True

    def __init__(self, registry) -> None:
        super().__init__()
        self.registry = registry

    def render_GET(self, request):
        request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
        return generate_latest(self.registry)


class DashboardFiles(static.File):
    """The dashboard's static files; a name no file can have (a NUL byte) is 404, not an error."""

    def getChild(self, path, request):
        if b"\x00" in path:
            return resource.NoResource("no such file")
        return super().getChild(path, request)


def _dashboard(directory: str) -> DashboardFiles:
    files = DashboardFiles(directory, defaultType="application/octet-stream")
    files.contentTypes.update({".js": "text/javascript", ".css": "text/css", ".html": "text/html"})
    files.directoryListing = lambda: resource.NoResource("no such file")
    return files


def _api_gate(api):
    """The check of a request with a body before it is read: the API's token, for paths under /api/."""
    def gate(path, request):
        if path is not None and path.startswith(b"/") and not path.startswith(b"/api/"):
            return None  # not the API (an unknown or absolute-form target is checked: fail closed)
        return api.refusal(request)
    return gate


def http_site(front, store, extra=lambda: (), losses=lambda: {}, lag=None, figures=None, api=None,
              dashboard_dir=None, max_body: int = MAX_BODY,
              request_timeout: float = REQUEST_TIMEOUT_S, reactor=None, collectors=()) -> BoundedSite:
    """A Site with /health and /metrics, and /api/ and /dashboard/ when given.

    ``extra()`` yields (prefix, {name: value}) for other services; ``losses()``
    gives {metric name: (help, count)} of messages that went away undelivered;
    ``lag`` is the node's ``ReactorLagProbe``; ``figures`` its ``NodeFigures``
    (latency histograms, per-listener connections, light-queue lag); ``api`` the
    ``AdminAPI`` resource; ``dashboard_dir`` the directory of the dashboard's files;
    ``max_body`` and ``request_timeout`` bound each request (``[admin]``), timed on ``reactor``;
    ``collectors`` are more Prometheus collectors for /metrics (the bridges').
    """
    registry = CollectorRegistry()
    registry.register(_BrokerCollector(front, store, extra, losses, lag, figures))
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
    root = resource.Resource()
    root.putChild(b"health", Health(store))
    root.putChild(b"metrics", Metrics(registry))
    if api is not None:
        root.putChild(b"api", api)
    if dashboard_dir is not None:
        root.putChild(b"dashboard", _dashboard(dashboard_dir))
    return BoundedSite(root, max_body=max_body, request_timeout=request_timeout,
                       gate=_api_gate(api) if api is not None else None, reactor=reactor)


class _StoreCollector:
    """The store's own counters for a role without an MQTT front end (the broker)."""

    def __init__(self, store, extra) -> None:
        self.store = store
        self.extra = extra

    def collect(self):
        c = CounterMetricFamily("twistmq_store_puts", "records appended to the commit log")
        c.add_metric([], self.store.puts)
        yield c
        g = GaugeMetricFamily("twistmq_store_bytes", "bytes of commit log on disk")
        g.add_metric([], self.store.size_bytes())
        yield g
        yield from _extra_gauges(self.extra)


def store_site(store, collectors=(), extra=lambda: (), api=None) -> BoundedSite:
    """A Site with /health (the store is open) and /metrics: the store's counters plus ``collectors``; ``/api``
    when given (a broker's few admin routes)."""
    registry = CollectorRegistry()
    registry.register(_StoreCollector(store, extra))
    for collector in collectors:
        registry.register(collector)
    root = resource.Resource()
    root.putChild(b"health", Health(store))
    root.putChild(b"metrics", Metrics(registry))
    if api is not None:
        root.putChild(b"api", api)
    return BoundedSite(root, max_body=MAX_BODY, request_timeout=REQUEST_TIMEOUT_S)


class _ProxyCollector:
    """A proxy's figures: its MQTT front end's counters and its broker connections."""

    def __init__(self, front, remotes, extra, lag) -> None:
        self.front, self.remotes, self.extra, self.lag = front, remotes, extra, lag
        self.peers = [peer for peer, _ in remotes]

    def collect(self):
        s = self.front.stats
        for name, doc, value in (("twistmq_messages_received", "PUBLISH packets received", s.messages_received),
                                 ("twistmq_messages_sent", "PUBLISH packets sent", s.messages_sent),
                                 ("twistmq_connections", "connections accepted", s.connections_total),
                                 ("twistmq_messages_dropped", "publishes refused by ACL or quota",
                                  s.messages_dropped)):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c
        for name, doc, value in (("twistmq_clients_connected", "clients connected now", s.clients_connected),
                                 ("twistmq_sessions", "sessions held, connected or not", len(self.front.sessions))):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g
        g = GaugeMetricFamily("twistmq_rpc_peer_connected", "1 while the RPC connection to a broker is open",
                              labels=["peer"])
        for peer in self.peers:
            g.add_metric([peer.peer_id], 1.0 if peer.connected else 0.0)
        yield g
        c = CounterMetricFamily("twistmq_notify_events_received", "queue news events received from a broker",
                                labels=["peer"])
        for peer, remote in self.remotes:
            c.add_metric([peer.peer_id], remote.events_received)
        yield c
        if self.lag is not None:
            yield _lag_gauge(self.lag)
        yield from _extra_gauges(self.extra)


class _PeersHealth(resource.Resource):
    isLeaf = True

    def __init__(self, peers) -> None:
        super().__init__()
        self.peers = peers

    def render_GET(self, request):
        down = [p.peer_id for p in self.peers if not p.connected]
        request.setResponseCode(503 if down else 200)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"status": "degraded" if down else "ok", "brokers_unreachable": down}).encode()


def proxy_site(front, remotes, extra=lambda: (), lag=None) -> BoundedSite:
    """A proxy's Site: /health (200 while every broker connection is open, else 503 naming the unreachable)
    and /metrics. ``remotes``: (PeerClient, RemoteStore) per broker."""
    registry = CollectorRegistry()
    registry.register(_ProxyCollector(front, remotes, extra, lag))
    root = resource.Resource()
    root.putChild(b"health", _PeersHealth([peer for peer, _ in remotes]))
    root.putChild(b"metrics", Metrics(registry))
    return BoundedSite(root, max_body=MAX_BODY, request_timeout=REQUEST_TIMEOUT_S)


class _JsonHealth(resource.Resource):
    isLeaf = True

    def __init__(self, status) -> None:
        super().__init__()
        self.status = status

    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(self.status()).encode()


def admin_site(api, status, collectors=(), dashboard_dir=None, max_body: int = MAX_BODY,
               request_timeout: float = REQUEST_TIMEOUT_S, reactor=None) -> BoundedSite:
    """The admin role's Site: /health (200, ``status()``), /metrics (the process and ``collectors``), the
    admin API ``api`` and the dashboard's files when ``dashboard_dir`` is given."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)
    root = resource.Resource()
    root.putChild(b"health", _JsonHealth(status))
    root.putChild(b"metrics", Metrics(registry))
    root.putChild(b"api", api)
    if dashboard_dir is not None:
        root.putChild(b"dashboard", _dashboard(dashboard_dir))
    return BoundedSite(root, max_body=max_body, request_timeout=request_timeout, gate=_api_gate(api), reactor=reactor)
