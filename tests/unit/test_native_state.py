"""Unit tests of the retry / invisible-time rules (pure state machine, times in ms)."""

from lightqueue.native_state import NO_EXPIRY, Cursor, decode_inflight, encode_inflight


def test_at_most_once_only_moves_the_offset():
    """invisible 0: nothing is kept in flight."""
    c = Cursor("q", "")
    assert c.take(0, 100, 100, 50, NO_EXPIRY, 0, now_ms=0) is None
    assert c.offset == 1 and not c.inflight


def test_invisible_then_due_then_redelivered():
    """An un-acked message is not due before visible_at, is due at it, and hides again when redelivered."""
    c = Cursor("q", "")
    c.take(0, 7, 7, 10, NO_EXPIRY, 5000, now_ms=1000)
    assert c.due(5999) is None
    e = c.due(6000)
    assert e.msg_id == 7
    c.redeliver(e, 6000)
    assert e.visible_at == 11000 and e.attempts == 2 and c.due(10999) is None


def test_ack_removes_and_stale_heap_is_skipped():
    """An acked message never comes due."""
    c = Cursor("q", "")
    c.take(0, 1, 1, 10, NO_EXPIRY, 100, now_ms=0)
    assert c.ack(1).msg_id == 1 and c.ack(1) is None
    assert c.due(10 ** 9) is None and c.next_visible_at() is None


def test_expired_in_flight_is_dropped_when_due():
    """A message whose expiry passed while in flight is reported expired, not handed out."""
    c = Cursor("q", "")
    c.take(0, 1, 1, 10, 3000, 1000, now_ms=0)
    c.take(1, 2, 2, 10, NO_EXPIRY, 1000, now_ms=0)
    expired = []
    assert c.due(3000, expired).msg_id == 2
    assert [e.msg_id for e in expired] == [1] and 1 not in c.inflight


def test_change_invisible_moves_visibility():
    """change_invisible makes a message visible at the new time only."""
    c = Cursor("q", "g")
    c.take(0, 1, 1, 10, NO_EXPIRY, 60_000, now_ms=0)
    c.change_invisible(1, 1000, 500)
    assert c.due(1499) is None and c.due(1500).msg_id == 1
    assert c.change_invisible(99, 0, 1) is None


def test_oldest_due_first():
    """Several due messages come back in visible_at order."""
    c = Cursor("q", "")
    c.take(0, 1, 1, 1, NO_EXPIRY, 300, 0)
    c.take(1, 2, 2, 1, NO_EXPIRY, 100, 0)
    c.take(2, 3, 3, 1, NO_EXPIRY, 200, 0)
    order = []
    while (e := c.due(1000)) is not None:
        order.append(e.msg_id)
        c.ack(e.msg_id)
    assert order == [2, 3, 1]


def test_inflight_round_trip():
    """The durable encoding of an in-flight entry decodes to the same entry."""
    c = Cursor("q", "")
    e = c.take(4, 9, 123, 77, 5555, 1000, 10)
    assert decode_inflight(9, encode_inflight(e)) == e
