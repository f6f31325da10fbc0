"""RPC counters for ``/metrics``: calls served per request type, their latency, connections, refusals."""

from __future__ import annotations

import bisect
import collections

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Latency buckets (seconds) of ``twistmq_rpc_call_seconds``."""


class RpcMetrics:
    """Plain counters the RPC server updates; ``collect()`` is a prometheus_client collector."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self._buckets: dict[str, list[int]] = {}
        self._sums: collections.Counter[str] = collections.Counter()
        self.connections = 0
        self.connections_total = 0
        self.refused: collections.Counter[str] = collections.Counter()
        self.events = 0

    def observe(self, request_type: str, seconds: float, ok: bool) -> None:
        """One call served (``ok`` False: answered with an error frame)."""
        self.calls[request_type] += 1
        if not ok:
            self.errors[request_type] += 1
        counts = self._buckets.setdefault(request_type, [0] * (len(BUCKETS) + 1))
        counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self._sums[request_type] += seconds

    def refuse(self, why: str) -> None:
        """A connection refused (``why``: handshake, cluster, frame, ...)."""
        self.refused[why] += 1

    def collect(self):
        calls = CounterMetricFamily("twistmq_rpc_calls", "RPC calls served, by request type", labels=["type"])
        errors = CounterMetricFamily("twistmq_rpc_call_errors", "RPC calls answered with an error, by request type",
                                     labels=["type"])
        hist = HistogramMetricFamily("twistmq_rpc_call_seconds", "time to serve an RPC call, by request type",
                                     labels=["type"])
        for kind in sorted(self.calls):
            calls.add_metric([kind], self.calls[kind])
            errors.add_metric([kind], self.errors[kind])
            cumulative, buckets = 0, []
            for bound, n in zip(BUCKETS + (float("inf"),), self._buckets[kind]):
                cumulative += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            hist.add_metric([kind], buckets, self._sums[kind])
        yield calls
        yield errors
        yield hist
        gauge = GaugeMetricFamily("twistmq_rpc_connections", "RPC connections open now (handshake done)")
        gauge.add_metric([], self.connections)
        yield gauge
        total = CounterMetricFamily("twistmq_rpc_connections_accepted", "RPC connections whose handshake succeeded")
        total.add_metric([], self.connections_total)
        yield total
        refused = CounterMetricFamily("twistmq_rpc_refused", "RPC connections refused, by why", labels=["why"])
        for why in sorted(self.refused):
            refused.add_metric([why], self.refused[why])
        yield refused
        events = CounterMetricFamily("twistmq_rpc_events", "RPC event frames sent (notify)")
        events.add_metric([], self.events)
        yield events
