"""$SYS/broker/... topics: the broker describes itself as retained messages.

Published through the store like any message, so subscribers get them the
usual way; ``#`` and ``+/...`` never match them (MQTT-4.7.2-1, in the trie).
"""

from __future__ import annotations

from twisted.internet import task

from store import record as rec


def sys_values(broker, store) -> dict[str, str]:
    """Topic suffix -> value, as text."""
    s = broker.stats
    return {
        "uptime": f"{int(broker.clock.seconds() - broker.started_at)} seconds",
        "clients/connected": str(s.clients_connected),
        "messages/received": str(s.messages_received),
        "messages/sent": str(s.messages_sent),
        "bytes/received": str(s.bytes_received),
        "bytes/sent": str(s.bytes_sent),
        "store/bytes": str(store.size_bytes()),
        "sessions": str(len(broker.sessions)),
    }


class SysPublisher:
    """Publishes the $SYS values every ``interval`` seconds, retained."""

    def __init__(self, broker, store, clock, interval: float) -> None:
        self.broker = broker
        self.store = store
        self.loop = task.LoopingCall(self.publish)
        self.loop.clock = clock
        self.interval = interval

    def start(self) -> None:
        if self.interval > 0:
            self.loop.start(self.interval, now=True)

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()

    def publish(self) -> None:
        now = self.broker.now_ms()
        messages = [rec.Message("$SYS/broker/" + k, v.encode(), rec.RecordKind.MQTT_PUBLISH, 0, True, "", now)
                    for k, v in sys_values(self.broker, self.store).items()]
        self.store.put_batch(messages)
