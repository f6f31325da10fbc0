"""The node's own figures beyond the front end's counters: latency histograms (``cluster.runtime.histogram``,
fed by the store and the delivery pump), process CPU and RSS, per-listener connections, light-queue lag, and
the msg/s history the dashboard draws."""

from __future__ import annotations

import collections
import os
import resource

from twisted.internet import task

from cluster.runtime.histogram import LATENCY_BOUNDS, Histogram  # noqa: F401 (LATENCY_BOUNDS: re-exported)

HISTORY_POINTS = 300
"""Seconds of msg/s history kept for the dashboard's chart (one point a second: five minutes)."""


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_figures() -> dict[str, float]:
    """CPU seconds (user + system) and resident set size (bytes) of this process."""
    times = os.times()
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB: the peak, not now
    return {"cpu_seconds": times.user + times.system, "rss_bytes": float(rss)}


def listener_connections(listeners, connections) -> dict[str, int]:
    """Open connections per listener, as ``"KIND HOST:PORT"`` -> count.

    *listeners* are bound ``ListenerService``s; *connections* yields the protocol
    objects of open connections (each with a ``transport``). Counted when asked,
    from the connections' local addresses, so accepting a connection costs nothing.
    HTTP listeners are left out: the web site keeps no list of its connections.
    """
    names = {}
    for svc in listeners:
        port = getattr(svc, "port", None)
        if port is None or svc.listener.key == "http":
            continue
        host = port.getHost()
        names[host.port] = f"{svc.listener.key} {host.host}:{host.port}"
    counts = dict.fromkeys(names.values(), 0)
    for conn in connections:
        transport = getattr(conn, "transport", None)
        if transport is None:
            continue
        try:
            local = transport.getHost().port
        except Exception:  # noqa: BLE001 - a transport going away mid-count is not a metrics error
            continue
        name = names.get(local)
        if name is not None:
            counts[name] += 1
    return counts


class RateHistory:
    """The last ``HISTORY_POINTS`` seconds of msg/s in and out, sampled every second, and each topic
    queue's msg/s, sampled every ``TOPIC_EVERY`` seconds (listing queues costs more than two counters).

    *counters()* returns (messages received, messages sent) so far; *topic_offsets()*
    returns {topic queue: messages stored so far}.
    """

    TOPIC_EVERY = 10

    def __init__(self, clock, counters, topic_offsets=lambda: {}, interval: float = 1.0) -> None:
        self.clock = clock
        self.counters = counters
        self.topic_offsets = topic_offsets
        self.interval = interval
        self.points: collections.deque = collections.deque(maxlen=HISTORY_POINTS)  # (t, in/s, out/s)
        self.topic_rates: dict[str, float] = {}
        self._last = None  # (t, received, sent)
        self._last_topics = None  # (t, {topic: offset})
        self._ticks = 0
        self.loop = task.LoopingCall(self.sample)
        self.loop.clock = clock

    def start(self) -> None:
        self.loop.start(self.interval, now=True)

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()

    def sample(self) -> None:
        now = self.clock.seconds()
        received, sent = self.counters()
        if self._last is not None and now > self._last[0]:
            t0, r0, s0 = self._last
            self.points.append((now, (received - r0) / (now - t0), (sent - s0) / (now - t0)))
        self._last = (now, received, sent)
        if self._ticks % self.TOPIC_EVERY == 0:
            offsets = self.topic_offsets()
            if self._last_topics is not None and now > self._last_topics[0]:
                t0, o0 = self._last_topics
                self.topic_rates = {q: (n - o0.get(q, n)) / (now - t0) for q, n in offsets.items()}
            self._last_topics = (now, offsets)
        self._ticks += 1

    def series(self) -> dict:
        """{"t": [unix seconds], "in": [msg/s], "out": [msg/s]}, oldest first."""
        return {"t": [round(p[0], 3) for p in self.points], "in": [round(p[1], 2) for p in self.points],
                "out": [round(p[2], 2) for p in self.points]}


class NodeFigures:
    """The figures above for one process, read by /metrics, $SYS and the admin API's overview.

    *listeners()* yields the bound ``ListenerService``s, *connections()* the open
    connections' protocols, *queue_lag()* (sum, max) of light-queue entries the
    subscriptions have yet to read; *lag* is the ``ReactorLagProbe`` (or None).
    """

    def __init__(self, clock, lag=None, listeners=lambda: (), connections=lambda: (),
                 queue_lag=lambda: (0, 0), deliver: Histogram | None = None, append: Histogram | None = None) -> None:
        self.deliver = deliver or Histogram()  # publish-to-deliver: one observation per session batch (the pump's)
        self.append = append or Histogram()  # commit-log batch write to acknowledgement (the store's)
        self.lag = lag
        self._listeners = listeners
        self._connections = connections
        self.queue_lag = queue_lag

    def listener_connections(self) -> dict[str, int]:
        return listener_connections(self._listeners(), self._connections())

    def reactor_lag_max(self) -> float:
        """Seconds: the worst lateness of the reactor since start (0 without a probe)."""
        if self.lag is None:
            return 0.0
        return float(self.lag.stats().get("1", 0.0))

    def sys_values(self) -> dict[str, str]:
        """$SYS/broker/ suffix -> text, twistmq's own figures beside Mosquitto's."""
        proc = process_figures()
        total, worst = self.queue_lag()
        out = {
            "process/cpu_seconds": f"{proc['cpu_seconds']:.2f}",
            "process/rss_bytes": str(int(proc["rss_bytes"])),
            "reactor/lag_max_ms": f"{self.reactor_lag_max() * 1000:.1f}",
            "latency/deliver_p50_ms": f"{self.deliver.quantile(0.5) * 1000:g}",
            "latency/deliver_p99_ms": f"{self.deliver.quantile(0.99) * 1000:g}",
            "latency/append_p50_ms": f"{self.append.quantile(0.5) * 1000:g}",
            "latency/append_p99_ms": f"{self.append.quantile(0.99) * 1000:g}",
            "lightqueue/lag": str(total),
            "lightqueue/lag_max": str(worst),
        }
        for name, n in self.listener_connections().items():
            out[f"listeners/{name.replace(' ', '/')}/connections"] = str(n)
        return out
