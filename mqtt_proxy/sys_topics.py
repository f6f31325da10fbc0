"""$SYS/broker/... topics: the broker describes itself as retained messages, with Mosquitto's names.

Published through the store like any message, so subscribers get them the
usual way; ``#`` and ``+/...`` never match them (MQTT-4.7.2-1, in the trie).

Besides Mosquitto's counters (``version``, ``uptime``, ``clients/...``,
``messages/...``, ``publish/...``, ``bytes/...``, ``subscriptions/count``,
``retained messages/count``), ``load/<figure>/{1min,5min,15min}`` are
Mosquitto's load figures: an exponentially decaying average of the figure's
rate per minute, ``rate + exp(-elapsed/window) * (previous - rate)``, updated
at each publish. The counters count PUBLISH packets and their bytes only
(``messages/*`` and ``publish/messages/*`` are the same numbers here).
``store/bytes`` and ``sessions`` are twistmq's own. Figures only the broker side
knows (``retained messages/count``, ``store/bytes``) come from ``broker_figures``,
a callable the composition root passes in; the rest are the front end's own.
"""

from __future__ import annotations

import math

from typing import Callable

from twisted.internet import task

from store import record as rec
from store.api import MessageLog

LOAD_WINDOWS = (("1min", 60.0), ("5min", 300.0), ("15min", 900.0))

LOAD_FIGURES = {
    "messages/received": lambda s: s.messages_received,
    "messages/sent": lambda s: s.messages_sent,
    "bytes/received": lambda s: s.bytes_received,
    "bytes/sent": lambda s: s.bytes_sent,
    "publish/received": lambda s: s.messages_received,
    "publish/sent": lambda s: s.messages_sent,
    "publish/dropped": lambda s: s.messages_dropped,
    "connections": lambda s: s.connections_total,
}
"""``load/<name>/...`` -> the BrokerStats counter it averages."""


def no_broker_figures() -> dict[str, str]:
    """What a front end without broker figures publishes for them: nothing."""
    return {}


def sys_values(front, version: str, broker_figures: Callable[[], dict[str, str]] = no_broker_figures
               ) -> dict[str, str]:
    """Topic suffix -> value, as text; *version* is twistmq's, as the composition root read it."""
    s = front.stats
    sessions = front.sessions
    return {
        "version": f"twistmq version {version}",
        "uptime": f"{int(front.clock.seconds() - front.started_at)} seconds",
        "clients/connected": str(s.clients_connected),
        "clients/disconnected": str(len(sessions) - s.clients_connected),
        "clients/total": str(len(sessions)),
        "messages/received": str(s.messages_received),
        "messages/sent": str(s.messages_sent),
        "publish/messages/received": str(s.messages_received),
        "publish/messages/sent": str(s.messages_sent),
        "publish/messages/dropped": str(s.messages_dropped),
        "publish/bytes/received": str(s.bytes_received),
        "publish/bytes/sent": str(s.bytes_sent),
        "bytes/received": str(s.bytes_received),
        "bytes/sent": str(s.bytes_sent),
        "subscriptions/count": str(sum(len(session.subs) for session in sessions.values())),
        "sessions": str(len(sessions)),
        **broker_figures(),
    }


class LoadAverage:
    """One counter's ``1min``/``5min``/``15min`` load, per minute, as Mosquitto computes it."""

    def __init__(self) -> None:
        self.values = {name: 0.0 for name, _ in LOAD_WINDOWS}
        self._last: tuple[float, int] | None = None  # (time, counter) at the previous update

    def update(self, now: float, count: int) -> dict[str, float]:
        """Fold in the counter's value at ``now``; return the averages by window name."""
        if self._last is not None and now > self._last[0]:
            elapsed = now - self._last[0]
            rate = (count - self._last[1]) * 60.0 / elapsed
            for name, window in LOAD_WINDOWS:
                self.values[name] = rate + math.exp(-elapsed / window) * (self.values[name] - rate)
        self._last = (now, count)
        return self.values


class SysPublisher:
    """Publishes the $SYS values every ``interval`` seconds, retained."""

    def __init__(self, front, store: MessageLog, clock, interval: float, version: str,
                 broker_figures: Callable[[], dict[str, str]] = no_broker_figures, extra=None) -> None:
        self.extra = extra  # () -> {suffix: text}: the composition root's own figures (process, latency, ...)
        self.front = front
        self.version = version
        self.broker_figures = broker_figures  # retained messages/count, store/bytes: the broker side's
        self.store = store
        self.clock = clock
        self.loop = task.LoopingCall(self.publish)
        self.loop.clock = clock
        self.interval = interval
        self.loads = {name: LoadAverage() for name in LOAD_FIGURES}

    def start(self) -> None:
        if self.interval > 0:
            self.loop.start(self.interval, now=True)

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()

    def values(self) -> dict[str, str]:
        """Every $SYS/broker/ suffix -> its text now, load figures included (and updated)."""
        values = sys_values(self.front, self.version, self.broker_figures)
        if self.extra is not None:
            values.update(self.extra())
        now = self.clock.seconds()
        for name, counter in LOAD_FIGURES.items():
            for window, value in self.loads[name].update(now, counter(self.front.stats)).items():
                values[f"load/{name}/{window}"] = f"{value:.2f}"
        return values

    def publish(self) -> None:
        now = self.front.now_ms()
        messages = [rec.Message("$SYS/broker/" + k, v.encode(), rec.RecordKind.MQTT_PUBLISH, 0, True, "", now)
                    for k, v in self.values().items()]
        self.store.append_batch(tuple(messages)).addErrback(lambda f: None)  # the next round publishes again
