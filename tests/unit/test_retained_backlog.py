"""subscribe.RetainedBacklog: retained messages that did not fit wait, bounded, and go out as the client reads."""

from __future__ import annotations

from mqtt_proxy.session import Subscription
from mqtt_proxy.session_state import SubOptions
from mqtt_proxy.stats import BrokerStats
from mqtt_proxy.subscribe import ENTRY_OVERHEAD, RetainedBacklog
from store.record import Message


class _Conn:
    paused = False


class _Delivery:
    def __init__(self) -> None:
        self.stats = BrokerStats()


class _Session:
    """The part of a Session the backlog uses: its connection, subscriptions, window and send_retained."""

    def __init__(self, conn, sub: Subscription, window: int = 10) -> None:
        self.conn = conn
        self.subs = {sub.key: sub}
        self.window = window
        self.delivery = _Delivery()
        self.sent: list[str] = []
        self.retained_backlog = None

    def send_retained(self, record, sub) -> None:
        self.sent.append(record.topic)
        if min(sub.options.qos, record.qos):
            self.window -= 1


def _record(topic: str, size: int = 100, qos: int = 0) -> Message:
    return Message(topic=topic, body=b"x" * size, qos=qos, retain=True)


def test_offer_is_bounded_by_bytes():
    """The backlog takes messages up to its byte limit (topic + payload + overhead each), then refuses."""
    sub = Subscription("r/#", "r/#", "%LMQ%r/#", SubOptions(0))
    backlog = RetainedBacklog(_Conn(), limit=3 * (100 + 3 + ENTRY_OVERHEAD))
    assert all(backlog.offer(_record(f"r/{i}"), sub) for i in range(3))
    assert not backlog.offer(_record("r/3"), sub)
    assert len(backlog.items) == 3


def test_drain_sends_while_the_connection_takes_them_and_resumes_later():
    """Drain stops when the socket pauses or the window closes, and goes on at the next pump."""
    conn = _Conn()
    sub = Subscription("r/#", "r/#", "%LMQ%r/#", SubOptions(1))
    session = _Session(conn, sub, window=2)
    backlog = session.retained_backlog = RetainedBacklog(conn, 1 << 20)
    for i in range(4):
        backlog.offer(_record(f"r/{i}", qos=1), sub)
    backlog.drain(session)
    assert session.sent == ["r/0", "r/1"] and session.retained_backlog is backlog  # window full
    session.window = 5
    conn.paused = True
    backlog.drain(session)
    assert session.sent == ["r/0", "r/1"]
    conn.paused = False
    backlog.drain(session)
    assert session.sent == ["r/0", "r/1", "r/2", "r/3"]
    assert session.retained_backlog is None and backlog.size == 0


def test_a_new_connection_drops_the_backlog_and_counts_it():
    """Messages found for a connection that is gone are dropped and counted, not sent on the next one."""
    sub = Subscription("r/#", "r/#", "%LMQ%r/#", SubOptions(0))
    session = _Session(_Conn(), sub)
    backlog = session.retained_backlog = RetainedBacklog(_Conn(), 1 << 20)
    backlog.offer(_record("r/0"), sub)
    backlog.offer(_record("r/1"), sub)
    backlog.drain(session)
    assert session.sent == [] and session.retained_backlog is None
    assert session.delivery.stats.retained_dropped == 2


def test_messages_of_a_dropped_subscription_are_skipped():
    """An unsubscribed filter's waiting retained messages are not sent."""
    conn = _Conn()
    sub = Subscription("r/#", "r/#", "%LMQ%r/#", SubOptions(0))
    session = _Session(conn, sub)
    backlog = session.retained_backlog = RetainedBacklog(conn, 1 << 20)
    backlog.offer(_record("r/0"), sub)
    session.subs.clear()
    backlog.drain(session)
    assert session.sent == [] and session.retained_backlog is None
