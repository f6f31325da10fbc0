"""The MongoDB bridge's sans-IO parts: documents, config, and the pump's batching and back-off under task.Clock."""

from __future__ import annotations

import pytest
from twisted.internet import defer, task

from cluster.bridges.config import BridgeConfig, MongoBridgeConfig, bridge_values
from cluster.bridges.documents import document, parse_document_id, payload_value
from cluster.bridges.positions import PositionFile
from cluster.bridges.pump import POLL_INTERVAL, BridgePump, InsertResult, State
from store import api
from store import record as rec
from store.config import ConfigError
from store.executor import SynchronousExecutor

QUEUE = "%LMQ%dev/#"


def _record(offset: int, body: bytes = b"x", topic: str = "dev/1") -> rec.Record:
    return rec.Record(offset, 10, rec.RecordKind.MQTT_PUBLISH, 1, False, 1000 + offset, 900 + offset, topic, "c1",
                      {rec.QUEUES_PROPERTY: QUEUE, "user": "v"}, body)


class FakeQueue:
    """A light queue in memory: entry i is the record at commit-log offset 100 * i; ``drop`` plays retention."""

    def __init__(self) -> None:
        self.records: list[rec.Record] = []
        self.first = 0
        self.reads = 0

    def add(self, n: int) -> None:
        for _ in range(n):
            i = len(self.records)
            self.records.append(_record(100 * i, b'{"n": %d}' % i))

    def read(self, position: api.QueuePosition, max_count: int) -> defer.Deferred:
        self.reads += 1
        start = max(position.offset, self.first)
        stop = min(len(self.records), start + max_count)
        msgs = tuple(api.QueuedMessage(api.QueuePosition(QUEUE, "g1", i), self.records[i]) for i in range(start, stop))
        return defer.succeed(api.ReadResult(msgs, api.QueuePosition(QUEUE, "g1", max(stop, start)),
                                            start - position.offset))

    def end(self) -> int:
        return len(self.records)


class FakeSink:
    """A collection keyed by _id; ``down`` makes every insert fail as an unreachable server does."""

    def __init__(self) -> None:
        self.docs: dict[str, dict] = {}
        self.down = False
        self.batches: list[int] = []
        self.pending: list[defer.Deferred] = []
        self.hold = False

    def insert(self, docs, bodies):
        if self.down:
            return defer.fail(ConnectionError("server selection timed out"))
        self.batches.append(len(docs))
        new = [d for d in docs if d["_id"] not in self.docs]
        for d in new:
            self.docs[d["_id"]] = d
        result = InsertResult(len(new), len(docs) - len(new))
        if self.hold:
            d = defer.Deferred()
            self.pending.append((d, result))
            return d
        return defer.succeed(result)


class Saved:
    def __init__(self) -> None:
        self.offset = None
        self.fail = False

    def save(self, offset):
        if self.fail:
            return defer.fail(OSError("disk full"))
        self.offset = offset
        return defer.succeed(None)


def _pump(queue, sink, saved, clock, batch=4, retry_max=30.0):
    return BridgePump("b1", QUEUE, "g1", queue.read, sink, saved.save, queue.end, clock, batch_size=batch,
                      retry_max=retry_max)


def _run(clock, turns=50):
    for _ in range(turns):
        clock.advance(0)


def test_catches_up_in_batches_and_saves_after_each():
    """A backlog goes in batches of batch_size; the position saved is past the last inserted batch; lag ends at 0."""
    clock, q, sink, saved = task.Clock(), FakeQueue(), FakeSink(), Saved()
    q.add(10)
    pump = _pump(q, sink, saved, clock)
    pump.start(0)
    _run(clock)
    assert sink.batches == [4, 4, 2]
    assert sorted(parse_document_id(i)[1] for i in sink.docs) == [100 * i for i in range(10)]
    assert saved.offset == 10 and pump.position == 10 and pump.lag == 0
    assert pump.state is State.IDLE and pump.stats.inserted == 10


def test_news_wakes_an_idle_pump_and_idle_polls():
    """wake() reads at once; without it an idle pump still reads after POLL_INTERVAL (a missed notify)."""
    clock, q, sink, saved = task.Clock(), FakeQueue(), FakeSink(), Saved()
    pump = _pump(q, sink, saved, clock)
    pump.start(0)
    q.add(2)
    pump.wake()
    _run(clock)
    assert len(sink.docs) == 2
    q.add(1)
    _run(clock)
    assert len(sink.docs) == 2
    clock.advance(POLL_INTERVAL)
    _run(clock)
    assert len(sink.docs) == 3


def test_outage_keeps_position_backs_off_and_catches_up():
    """Sink down: nothing saved past what is in, retries at 0.5, 1, 2, ... capped at retry_max; back: all in once."""
    clock, q, sink, saved = task.Clock(), FakeQueue(), FakeSink(), Saved()
    q.add(3)
    pump = _pump(q, sink, saved, clock, retry_max=4.0)
    pump.start(0)
    _run(clock)
    sink.down = True
    q.add(5)
    pump.wake()
    _run(clock)
    assert pump.state is State.RETRYING and pump.position == 3 and pump.stats.outages == 1
    reads = q.reads
    waits = []
    for _ in range(5):
        delay = pump._timer.getTime() - clock.seconds()
        waits.append(delay)
        clock.advance(delay)
        _run(clock)
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert q.reads == reads + 5 and pump.position == 3 and pump.owed() == api.Owed("bridge b1", QUEUE, 3)
    assert pump.stats.failed == 6 and pump.lag == 5
    sink.down = False
    clock.advance(4.0)
    _run(clock)
    assert pump.position == 8 and len(sink.docs) == 8 and pump.stats.outages == 1 and pump.last_error == ""
    assert pump.backoff.next() == 0.5  # reset once the outage is over


def test_replay_after_a_lost_save_inserts_nothing_twice():
    """A position save that fails leaves the old one: the batch is read again and counted as duplicates."""
    clock, q, sink, saved = task.Clock(), FakeQueue(), FakeSink(), Saved()
    q.add(4)
    saved.fail = True
    pump = _pump(q, sink, saved, clock)
    pump.start(0)
    _run(clock)
    assert pump.position == 0 and pump.state is State.RETRYING and len(sink.docs) == 4
    saved.fail = False
    clock.advance(0.5)
    _run(clock)
    assert pump.position == 4 and pump.stats.inserted == 4 and pump.stats.duplicates == 4


def test_retention_loss_is_counted_and_skipped():
    """Entries a disk limit deleted before the bridge read them: counted in lost; the bridge goes on after them."""
    clock, q, sink, saved = task.Clock(), FakeQueue(), FakeSink(), Saved()
    q.add(6)
    q.first = 4
    pump = _pump(q, sink, saved, clock)
    pump.start(1)
    _run(clock)
    assert pump.stats.lost == 3 and pump.position == 6 and len(sink.docs) == 2


def test_a_loss_is_counted_once_however_often_the_insert_is_retried():
    """Entries gone before an outage's retries: each retry reads the same gap; lost counts it once, when it is passed."""
    clock, q, sink, saved = task.Clock(), FakeQueue(), FakeSink(), Saved()
    q.add(6)
    q.first = 4
    sink.down = True
    pump = _pump(q, sink, saved, clock)
    pump.start(0)
    for _ in range(4):
        clock.advance(pump._timer.getTime() - clock.seconds())
        _run(clock)
    assert pump.stats.lost == 0 and pump.position == 0
    sink.down = False
    clock.advance(pump._timer.getTime() - clock.seconds())
    _run(clock)
    assert pump.stats.lost == 4 and pump.position == 6 and len(sink.docs) == 2


def test_stop_waits_for_the_insert_in_flight():
    """stop() fires only once the insert in flight is over, and nothing is read after it."""
    clock, q, sink, saved = task.Clock(), FakeQueue(), FakeSink(), Saved()
    q.add(2)
    sink.hold = True
    pump = _pump(q, sink, saved, clock)
    pump.start(0)
    _run(clock)
    stopped = pump.stop()
    assert not stopped.called
    d, result = sink.pending.pop()
    d.callback(result)
    assert stopped.called
    reads = q.reads
    clock.advance(POLL_INTERVAL * 3)
    assert q.reads == reads and pump.state is State.STOPPED


def test_documents_carry_the_message_and_a_stable_id():
    """A document has the spec's fields, _id GROUP:OFFSET, and no broker-internal property."""
    doc = document(_record(4096, b'{"t": 21.5}'), "g2", "auto")
    assert doc == {"_id": "g2:4096", "topic": "dev/1", "payload": {"t": 21.5}, "client_id": "c1", "qos": 1,
                   "retain": False, "store_ts": 5096, "born_ts": 4996, "properties": {"user": "v"}}
    assert parse_document_id(doc["_id"]) == ("g2", 4096)


@pytest.mark.parametrize("mode,body,expected", [
    ("auto", b'{"a": 1}', {"a": 1}),
    ("auto", b"[1, 2]", b"[1, 2]"),
    ("auto", b"21.5", b"21.5"),
    ("auto", b"{not json", b"{not json"),
    ("auto", b'{"big": 123456789012345678901234567890}', b'{"big": 123456789012345678901234567890}'),
    ("json", b"[1, 2]", [1, 2]),
    ("json", b"\xff\xfe", b"\xff\xfe"),
    ("bytes", b'{"a": 1}', b'{"a": 1}'),
    ("auto", b"", b""),
])
def test_payload_modes(mode, body, expected):
    """auto: only a JSON object becomes a sub-document; json: any JSON value; bytes: always binary."""
    assert payload_value(body, mode) == expected


def test_config_names_the_bad_key():
    """A bad bridge table is refused naming its index and key; two bridges may not share a name."""
    ok = bridge_values({"mongodb": [{"name": "t", "filter": "dev/#", "collection": "telemetry"}]})
    assert BridgeConfig(**ok).mongodb == (MongoBridgeConfig("t", "dev/#", "telemetry"),)
    for table, words in (({"name": "t", "filter": "dev/#", "collection": "c", "payload": "xml"}, "payload"),
                         ({"name": "t", "filter": "dev/#/x", "collection": "c"}, "filter"),
                         ({"name": "t", "filter": "$share/g/a", "collection": "c"}, "filter"),
                         ({"name": "a b", "filter": "a", "collection": "c"}, "name"),
                         ({"name": "t", "filter": "a", "collection": "$x"}, "collection"),
                         ({"name": "t", "filter": "a"}, "collection")):
        with pytest.raises(ConfigError, match=words):
            bridge_values({"mongodb": [table]})
    with pytest.raises(ConfigError, match="twice"):
        from store.config import from_mapping
        from_mapping(BridgeConfig, "bridge", bridge_values({"mongodb": [
            {"name": "t", "filter": "a", "collection": "c"}, {"name": "t", "filter": "b", "collection": "c"}]}))


def test_position_file_round_trip_and_other_queue(tmp_path):
    """A saved position loads back; one saved for another queue or group is ignored (the bridge starts afresh)."""
    f = PositionFile(str(tmp_path / "bridges"), "b1", QUEUE, "g1", SynchronousExecutor())
    assert f.load() is None
    f.save(42)
    assert f.load() == 42
    assert PositionFile(str(tmp_path / "bridges"), "b1", "%LMQ%other", "g1", SynchronousExecutor()).load() is None
    (tmp_path / "bridges" / "b1.json").write_bytes(b"{torn")
    assert f.load() is None
