"""A persistent session's QoS 1 in-flight entries: written only when they stay in flight, the stored position
held back until they are (so a restart still sends every unacknowledged message again)."""

from __future__ import annotations

from twisted.internet import defer, task

from mqtt_proxy.delivery import DeliveryPump, SessionContext
from mqtt_proxy.session import OUTBOUND_SAVE_DELAY, POSITION_SAVE_DELAY, Session, Subscription
from mqtt_proxy.session_state import SubOptions
from mqtt_proxy.stats import BrokerStats
from store.api import QueuedMessage, QueuePosition, ReadResult
from store.record import Record, RecordKind

QUEUE = "%LMQ%t/+"
GROUP = "local"


class _Sessions:
    """A ``store.api.Sessions`` that records the writes of the session under test and succeeds."""

    def __init__(self) -> None:
        self.writes: list[tuple] = []

    def _record(self, name, *args):
        self.writes.append((name,) + args[:-1])  # the epoch left out
        return defer.succeed(None)

    def put_outbound(self, *args):
        return self._record("put_outbound", *args)

    def delete_outbound(self, *args):
        return self._record("delete_outbound", *args)

    def put_subscription(self, *args):
        return self._record("put_subscription", *args)


class _Cache:
    """The read cache: ``count`` messages of queue QUEUE from any position (offsets as payloads)."""

    def read_through(self, position, count):
        msgs = tuple(QueuedMessage(QueuePosition(QUEUE, GROUP, o),
                                   Record(o, 0, RecordKind.MQTT_PUBLISH, 1, False, 0, 0, "t/a", "", {}, b"%d" % o))
                     for o in range(position.offset, position.offset + count))
        return defer.succeed(ReadResult(msgs, QueuePosition(QUEUE, GROUP, position.offset + count)))


class _Watches:
    def watch(self, queue, key, callback):
        pass

    def unwatch(self, queue, key):
        pass

    def watchers(self, queue):
        return 1


class _Conn:
    level = 5
    paused = False

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data):
        self.out.append(data)

    def cork(self):
        pass

    def uncork(self):
        pass


def _session(window: int = 4):
    clock = task.Clock()
    sessions = _Sessions()
    ctx = SessionContext(DeliveryPump(_Cache(), _Watches(), clock, BrokerStats()), sessions, window)
    session = Session(ctx, "c", 5, 3600)
    sub = Subscription("t/+", "t/+", QUEUE, SubOptions(1), positions={GROUP: QueuePosition(QUEUE, GROUP, 0)})
    session.add_subscription(sub)
    session.attach(_Conn())
    session.pump()  # as queue news would: the window's worth of messages goes out
    return clock, sessions, session


def _stored_offsets(sessions):
    return [w[2].positions[0].offset for w in sessions.writes if w[0] == "put_subscription"]


def test_acknowledged_within_the_delay_costs_no_in_flight_write():
    """QoS 1 messages acknowledged before OUTBOUND_SAVE_DELAY are neither written nor deleted as in flight."""
    clock, sessions, session = _session()
    assert sorted(session.outbound) == [1, 2, 3, 4]
    for pid in (1, 2, 3, 4):
        session.on_puback(pid)
    clock.advance(0)  # the pump the acknowledgements asked for sends the next window (ids 5..8)
    assert sorted(session.outbound) == [5, 6, 7, 8]
    assert [w for w in sessions.writes if w[0] in ("put_outbound", "delete_outbound")] == []


def test_stored_position_held_back_until_the_entries_are_written():
    """Until its in-flight entries are written, the stored position stays at the first of them; after, it moves."""
    clock, sessions, session = _session()
    clock.advance(POSITION_SAVE_DELAY)
    assert _stored_offsets(sessions) == [0]  # sent 0..3, none acknowledged: the position stays at 0
    assert not [w for w in sessions.writes if w[0] == "put_outbound"]
    session.on_puback(1)  # offset 0 acknowledged: the first unwritten one is offset 1
    clock.advance(0)
    clock.advance(POSITION_SAVE_DELAY)
    assert _stored_offsets(sessions)[-1] == 1
    clock.advance(OUTBOUND_SAVE_DELAY)  # still in flight: written, with their packet ids, and the mark moves on
    written = sorted((w[2].packet_id, w[2].position.offset) for w in sessions.writes if w[0] == "put_outbound")
    assert written[:3] == [(2, 1), (3, 2), (4, 3)]
    assert _stored_offsets(sessions)[-1] == session.subs["t/+"].positions[GROUP].offset


def test_detach_writes_what_is_in_flight():
    """A connection that goes writes its unwritten in-flight entries at once (another holder resends them)."""
    clock, sessions, session = _session()
    session.detach(False)
    assert sorted(w[2].packet_id for w in sessions.writes if w[0] == "put_outbound") == [1, 2, 3, 4]
    assert _stored_offsets(sessions)[-1] == 4


def test_positions_written_at_most_once_per_delay_while_in_flight():
    """While QoS 1 messages are in flight unwritten, windows acknowledged in a row cost one position write per
    POSITION_SAVE_DELAY, not one each, and that write holds the position back to the first still in flight."""
    clock, sessions, session = _session()
    for _ in range(20):  # 20 windows sent and acknowledged within the delay
        for pid in sorted(session.outbound):
            session.on_puback(pid)
        clock.advance(0)
    assert _stored_offsets(sessions) == []
    clock.advance(POSITION_SAVE_DELAY)
    first = min(o.position.offset for o in session.outbound.values())
    assert _stored_offsets(sessions) == [first] == [80]


def test_detach_writes_a_position_waiting_for_its_write():
    """A connection that goes writes the position its acknowledgements moved, even before the next pump."""
    clock, sessions, session = _session()
    for pid in (1, 2, 3, 4):
        session.on_puback(pid)
    session.detach(False)  # before the pump the acknowledgements asked for
    assert _stored_offsets(sessions)[-1] == 4
