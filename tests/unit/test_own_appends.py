"""OwnAppends: a proxy's own appends answer reads of the queues it watches only when the answer is whole."""

from __future__ import annotations

from cluster.remote.own_appends import OwnAppends
from store import api
from store.record import Message, RecordKind

OK = api.AppendStatus.PUT_OK
Q = "%LMQ%dev/+/temp"


def _batch(n: int, first_cl: int = 1000, queues=(Q,), status=OK):
    messages = tuple(Message(f"dev/{i}/temp", b"%d" % i, RecordKind.MQTT_PUBLISH, 1, False, "pub", 0, {})
                     for i in range(n))
    results = tuple(api.AppendResult(status, first_cl + 50 * i, queues) for i in range(n))
    return messages, results


def _indexed(n: int, first: int, store_ts: int = 7, group: str = "g1", queue: str = Q):
    return api.IndexedAppend(group, store_ts, tuple([50] * n), {queue: first})


def test_a_batch_answers_reads_from_its_first_entry_on():
    """Each kept message is the record a broker read would give: position, offset, size, store and born times."""
    own = OwnAppends()
    messages, results = _batch(3)
    own.add(messages, results, _indexed(3, first=10))
    read = own.read(api.QueuePosition(Q, "g1", 11), 5)
    assert [m.position.offset for m in read.messages] == [11, 12] and read.next == api.QueuePosition(Q, "g1", 13)
    record = read.messages[0].record
    assert (record.offset, record.size, record.store_ts, record.born_ts, record.topic, record.body) == \
        (1050, 50, 7, 7, "dev/1/temp", b"1")
    assert own.read(api.QueuePosition(Q, "g1", 9), 5) is None  # before our entries: the broker's
    assert own.read(api.QueuePosition(Q, "g2", 11), 5) is None  # another group's queue of the same name


def test_a_short_run_is_no_answer_when_the_news_told_of_more():
    """A run that stops before the end the last news named is not all there is: the read goes to the broker."""
    own = OwnAppends()
    messages, results = _batch(2)
    own.add(messages, results, _indexed(2, first=0))
    own.news(Q, 2)
    assert len(own.read(api.QueuePosition(Q, "g1", 0), 10).messages) == 2
    own.news(Q, 5)  # another proxy's entries 2..4
    assert own.read(api.QueuePosition(Q, "g1", 0), 10) is None
    assert len(own.read(api.QueuePosition(Q, "g1", 0), 2).messages) == 2  # a full answer stays ours
    own.news(Q, -1)  # an end the broker could not say: nothing short is answered here
    assert own.read(api.QueuePosition(Q, "g1", 0), 10) is None


def test_consecutive_batches_join_and_the_oldest_go_first():
    """Batches in a row answer one read across them; past the bound the oldest runs are dropped."""
    own = OwnAppends(max_entries=5)
    for k in range(3):
        messages, results = _batch(2, first_cl=1000 * k)
        own.add(messages, results, _indexed(2, first=2 * k))
    assert own.read(api.QueuePosition(Q, "g1", 0), 10) is None  # the first run went (6 entries > 5)
    read = own.read(api.QueuePosition(Q, "g1", 2), 10)
    assert [m.position.offset for m in read.messages] == [2, 3, 4, 5]


def test_only_stored_messages_of_the_told_queues_are_kept():
    """Refused messages and queues the answer does not name make no entries; clear forgets everything."""
    own = OwnAppends()
    messages, results = _batch(3, queues=(Q, "dev"))
    results = (results[0], api.AppendResult(api.AppendStatus.MESSAGE_ILLEGAL, -1, (), "too big"), results[2])
    own.add(messages, results, _indexed(3, first=4))
    read = own.read(api.QueuePosition(Q, "g1", 4), 10)
    assert [m.record.topic for m in read.messages] == ["dev/0/temp", "dev/2/temp"]
    assert own.read(api.QueuePosition("dev", "g1", 4), 10) is None
    own.clear()
    assert own.read(api.QueuePosition(Q, "g1", 4), 10) is None


def test_a_read_at_the_known_end_after_our_newest_run_is_empty_here():
    """A caught-up reader's read at the end the news named, right after our newest run, is answered empty; once the
    news names a later end it goes to the broker."""
    own = OwnAppends()
    messages, results = _batch(2)
    own.add(messages, results, _indexed(2, first=4))
    own.news(Q, 6)
    empty = own.read(api.QueuePosition(Q, "g1", 6), 10)
    assert empty.messages == () and empty.next == api.QueuePosition(Q, "g1", 6)
    assert own.read(api.QueuePosition(Q, "g2", 6), 10) is None
    own.news(Q, 9)
    assert own.read(api.QueuePosition(Q, "g1", 6), 10) is None


def test_record_bytes_bound_what_is_kept():
    """Past max_bytes of record bytes the oldest runs go, however few their entries."""
    own = OwnAppends(max_entries=100, max_bytes=250)  # the batches' records are 50 bytes each
    for k in range(3):
        messages, results = _batch(2, first_cl=1000 * k)
        own.add(messages, results, _indexed(2, first=2 * k))
    assert own.read(api.QueuePosition(Q, "g1", 0), 10) is None
    assert [m.position.offset for m in own.read(api.QueuePosition(Q, "g1", 2), 10).messages] == [2, 3, 4, 5]


def _read_result(offsets, next_offset: int, group: str = "g1", lost: int = 0) -> api.ReadResult:
    from store.record import Record
    messages = tuple(api.QueuedMessage(api.QueuePosition(Q, group, o),
                                       Record(2000 + o, 40, RecordKind.MQTT_PUBLISH, 1, False, 5, 5, "dev/x/temp",
                                              "pub", {}, b"%d" % o)) for o in offsets)
    return api.ReadResult(messages, api.QueuePosition(Q, group, next_offset), lost)


def test_entries_a_news_carried_answer_reads_and_join_our_runs():
    """A news event's run of entries answers reads as our own appends do, and follows on from them."""
    own = OwnAppends()
    messages, results = _batch(2)
    own.add(messages, results, _indexed(2, first=0))
    carried = _read_result([2, 3, 4], 5)
    own.add_read(carried)
    own.news(Q, 5)
    read = own.read(api.QueuePosition(Q, "g1", 0), 10)
    assert [m.position.offset for m in read.messages] == [0, 1, 2, 3, 4] and read.next.offset == 5
    assert read.messages[2:] == carried.messages
    assert own.read(api.QueuePosition(Q, "g1", 5), 10).messages == ()  # at the end the news named


def test_entries_that_do_not_follow_one_another_are_not_kept():
    """A carried run with a gap, a loss or a next position that does not follow its last entry is not kept: a
    read of it goes to the broker."""
    for bad in (_read_result([2, 4], 5), _read_result([2, 3], 4, lost=1), _read_result([2, 3], 7)):
        own = OwnAppends()
        own.add_read(bad)
        own.news(Q, 7)
        assert own.read(api.QueuePosition(Q, "g1", 2), 1) is None


def test_a_forgotten_queue_answers_nothing_and_frees_its_share_of_the_bound():
    """forget drops a queue's runs and end, and what they counted: the bound then keeps the other queues' runs."""
    own = OwnAppends(max_entries=6)
    own.add_read(_read_result([0, 1, 2], 3))
    own.news(Q, 3)
    other = "%LMQ%other"
    messages, results = _batch(2, queues=(other,))
    own.add(messages, results, api.IndexedAppend("g1", 7, (50, 50), {other: 0}))
    own.forget(Q)
    assert own.read(api.QueuePosition(Q, "g1", 3), 10) is None
    assert own.read(api.QueuePosition(Q, "g1", 0), 1) is None
    messages, results = _batch(4, queues=(other,))
    own.add(messages, results, api.IndexedAppend("g1", 7, (50,) * 4, {other: 2}))  # 6 entries: nothing evicted
    assert len(own.read(api.QueuePosition(other, "g1", 0), 6).messages) == 6
