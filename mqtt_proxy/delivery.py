"""The delivery pump's collaborators: reads from queue positions, news of queues, the fan-out encode cache.

Sessions and shared groups pull messages from light-queue positions through the
read cache, hear of new messages through the proxy's queue watches, and encode
each PUBLISH once for all its subscribers. ``DeliveryPump`` is that one seam,
handed to them in a ``SessionContext`` with the store's session operations and
the in-flight cap, so neither reaches into a service locator for them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from mqtt_proxy.codec.encoder import encode_publish
from mqtt_proxy.stats import BrokerStats
from store.api import QueuePosition, Sessions

log = logging.getLogger("twistmq.mqtt.session")  # delivery_gap lines keep the logger they always had

ENCODE_CACHE = 4096  # encoded PUBLISHes kept for fan-out (one encode serves every subscriber)
ENCODE_CACHE_BYTES = 4 << 20  # ... in at most this many bytes
ENCODE_CACHE_MAX_PACKET = 16384  # bigger PUBLISHes are encoded per subscriber rather than held


class DeliveryPump:
    """Reads through the read cache, watches queues through the proxy's watches, encodes once per message."""

    def __init__(self, read_cache, watches, clock, stats: BrokerStats, deliver_latency=None) -> None:
        self.read_cache = read_cache
        self.watches = watches
        self.clock = clock
        self.stats = stats
        self.deliver_latency = deliver_latency  # an object with observe(seconds) (metrics), or None
        self._encoded: OrderedDict[tuple, bytes] = OrderedDict()
        self._encoded_bytes = 0

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    def read(self, position: QueuePosition, count: int, enough: int | None = None):
        """A Deferred ``ReadResult`` of up to ``count`` messages from ``position`` (see ``ReadCache.read``).

        Only queues with several readers here go through the read cache: for a
        single reader (a fan-in subscriber) filling and evicting it is pure cost,
        and it reads no more than ``enough`` (what its window takes) instead.
        """
        if self.shared(position.queue):
            return self.read_cache.read(position, count, enough)
        return self.read_cache.read_through(position, count if enough is None else enough)

    def shared(self, queue: str) -> bool:
        """Whether several sessions here read ``queue`` (then each PUBLISH is worth encoding once for all)."""
        return self.watches.watchers(queue) > 1

    def watch(self, queue: str, key, callback) -> None:
        self.watches.watch(queue, key, callback)

    def unwatch(self, queue: str, key) -> None:
        self.watches.unwatch(queue, key)

    def call_soon(self, fn) -> None:
        """Run ``fn`` at the end of this reactor tick (bursts of acknowledgements share one pump)."""
        self.clock.callLater(0, fn)

    def gap(self, owner: str, queue: str, lost: int) -> None:
        """Owed messages are gone (a disk limit deleted them before they were read): count and log them."""
        self.stats.messages_gap += lost
        log.warning("delivery_gap %s queue=%s messages=%d", owner, queue, lost)

    def encoded_publish(self, record, qos: int, retain: bool, level: int) -> bytes:
        """The PUBLISH for ``record`` without v5 properties, encoded once for all its subscribers."""
        # A commit-log offset names a record within one broker group only; two groups never store the same
        # topic (a topic's group is its first level's), so offset and topic together name one record.
        key = (record.offset, record.topic, qos, retain, level)
        data = self._encoded.get(key)
        if data is None:
            data = encode_publish(record.topic, record.body, qos, retain, False, 1 if qos else None, None, level)
            if len(data) > ENCODE_CACHE_MAX_PACKET:
                return data
            self._encoded[key] = data
            self._encoded_bytes += len(data)
            while len(self._encoded) > ENCODE_CACHE or self._encoded_bytes > ENCODE_CACHE_BYTES:
                self._encoded_bytes -= len(self._encoded.popitem(last=False)[1])
        return data


@dataclass(frozen=True)
class SessionContext:
    """Exactly what a Session and a SharedGroup use: delivery, the store's session state, the in-flight cap."""

    delivery: DeliveryPump
    """Reads, queue news, the encode cache, the clock and the counters."""
    sessions: Sessions
    """Where subscriptions, outbound packet ids and share positions are made durable (``store.api.Sessions``)."""
    max_inflight: int
    """The server's cap on QoS 1/2 messages in flight per session (the client's Receive Maximum may lower it)."""
