"""Push layer: events merged per tick, one store read serving many readers, one encode for many sessions."""

from __future__ import annotations

from twisted.internet import defer, task

from mqtt_proxy.codec import (
    Publish,
    Subscribe,
    Subscription,
    SubscriptionOptions,
    encode,
)
from push.notifier import Notifier
from push.read_cache import ReadCache
from store.api import QueuedMessage, QueuePosition, ReadResult
from tests.unit.test_mqtt_broker import Harness, published


def test_events_for_one_queue_are_merged_per_tick():
    """Ten notifications of one queue in a tick reach each watcher once, with only the queue name."""
    clock = task.Clock()
    n = Notifier(clock)
    heard = []
    n.watch("q1", 1, heard.append)
    n.watch("q1", 2, heard.append)
    n.watch("q2", 3, heard.append)
    for _ in range(10):
        n.notify(["q1"])
    assert heard == []
    clock.advance(0)
    assert heard == ["q1", "q1"]
    n.unwatch("q1", 1)
    n.notify(["q1", "nobody-watches"])
    clock.advance(0)
    assert heard == ["q1", "q1", "q1"]


def test_a_broken_watcher_does_not_starve_the_others():
    """An exception in one watcher is logged and the rest are still told."""
    clock = task.Clock()
    n = Notifier(clock)
    heard = []
    n.watch("q", 1, lambda q: 1 / 0)
    n.watch("q", 2, heard.append)
    n.notify(["q"])
    clock.advance(0)
    assert heard == ["q"]


def one_tick(clock):
    """Run the calls due now, as one reactor iteration does (``Clock.advance`` also runs those they add)."""
    for call in [c for c in clock.getDelayedCalls() if c.getTime() <= clock.seconds()]:
        if call.active():
            func, args, kw = call.func, call.args, call.kw
            call.cancel()
            func(*args, **kw)


def test_news_merged_by_the_caller_is_told_at_once():
    """notify_now (the store's listener: one call per drained batch) tells each watcher in the call, no tick later."""
    clock = task.Clock()
    n = Notifier(clock)
    heard = []
    n.watch("q1", 1, heard.append)
    n.watch("q1", 2, lambda q: 1 / 0)  # a broken watcher starves nobody here either
    n.watch("q2", 3, heard.append)
    n.notify_now(["q1", "nobody-watches"])
    assert heard == ["q1"] and not clock.getDelayedCalls()
    assert (n.events_in, n.events_out) == (2, 2)


def test_a_subscriber_gets_the_publish_in_the_tick_the_store_acknowledges_it(tmp_path):
    """QoS 1: the publisher's PUBACK and the subscriber's PUBLISH are written in the same reactor tick."""
    harness = Harness(tmp_path)
    try:
        sub = harness.connect("sub")
        sub.send(Subscribe(1, (Subscription("t/+", SubscriptionOptions(qos=1)),)))
        sub.received()
        pub = harness.connect("pub")
        pub.received()
        pub.proto.dataReceived(encode(Publish("t/1", b"x", qos=1, packet_id=7), 5))
        one_tick(harness.clock)  # the inbound batch goes to the store
        assert pub.transport.value() == b""
        one_tick(harness.clock)  # the store drains it: acknowledgement and delivery together
        assert [type(p).__name__ for p in pub.received()] == ["PubAck"]
        assert [p.payload for p in published(sub)] == [b"x"]
    finally:
        harness.close()


def test_read_cache_serves_many_readers_with_one_store_read(tmp_path):
    """Readers of the same offsets after the first are served from the cache."""
    h = Harness(tmp_path)
    try:
        sub = h.connect("reader-0")
        sub.send(Subscribe(1, (Subscription("rc/t"),)))
        (start,) = h.broker.sessions["reader-0"].subs["rc/t"].positions.values()
        pub = h.connect("writer")
        for i in range(20):
            pub.send(Publish("rc/t", b"%d" % i))
        calls = []
        real_read = h.local.read_queue
        h.local.read_queue = lambda *a: calls.append(a) or real_read(*a)
        cache = ReadCache(h.local)
        results = []
        for _ in range(5):
            cache.read(start, 20).addCallback(results.append)
        h.tick()
        assert len(calls) == 1
        assert all([m.record.body for m in r.messages] == [b"%d" % i for i in range(20)] for r in results)
        assert all(r.next == results[0].next for r in results)
        assert cache.hits == 80
    finally:
        h.close()


class _CountingQueue:
    """A light queue of ``size`` messages answering ``read_queue`` at once, counting the reads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.reads = []

    def read_queue(self, position, max_count):
        self.reads.append(position.offset)
        end = min(self.size, position.offset + max_count)
        messages = tuple(QueuedMessage(QueuePosition("q", "g", o), _Rec(o)) for o in range(position.offset, end))
        return defer.succeed(ReadResult(messages, QueuePosition("q", "g", end)))


class _Rec:
    """The one field of a record the read cache reads."""

    size = 10

    def __init__(self, offset: int) -> None:
        self.offset = offset


def test_read_cache_evicts_the_oldest_positions_not_the_latest_refill():
    """A lagging reader's store read does not push out the entries the readers ahead of it are about to read."""
    store = _CountingQueue(12)
    cache = ReadCache(store, per_queue=8)
    at = lambda o: QueuePosition("q", "g", o)  # noqa: E731
    for o in (0, 4, 8):  # the leader reads ahead; at 12 entries the oldest (0-5) go
        cache.read(at(o), 4)
    cache.read(at(0), 8)  # a laggard misses and refills 0-7: over the bound, and 0-5 are the oldest again
    store.reads.clear()
    got = []
    cache.read(at(8), 4).addCallback(got.append)
    assert store.reads == [] and [m.record.offset for m in got[0].messages] == [8, 9, 10, 11]


def test_qos0_publish_to_many_sessions_is_encoded_once(tmp_path):
    """Fifty QoS 0 subscribers of one filter get the same bytes from a single encode."""
    h = Harness(tmp_path)
    try:
        subs = []
        for i in range(50):
            c = h.connect(f"fan-{i}", level=4)
            c.send(Subscribe(1, (Subscription("fan/#"),)))
            c.received()
            subs.append(c)
        encodes = []
        import mqtt_proxy.delivery as broker_module
        real = broker_module.encode_publish
        broker_module.encode_publish = lambda *a: encodes.append(a) or real(*a)
        try:
            pub = h.connect("fan-pub", level=4)
            pub.send(Publish("fan/1", b"hello"))
        finally:
            broker_module.encode_publish = real
        assert all([p.payload for p in published(c)] == [b"hello"] for c in subs)
        assert len(encodes) == 1
    finally:
        h.close()


# -- the proxy side over the store interface ----------------------------------------------------------------

def _loopback(tmp_path):
    """A LoopbackStore (answers a tick late, through the codec) over a real in-process store, and its harness."""
    from tests.contract.conftest import _harness
    from tests.contract.loopback_store import LoopbackStore
    gen = _harness(str(tmp_path), "local")
    h = next(gen)
    return LoopbackStore(h.store, h.clock), h, gen


def test_queue_watches_share_one_store_watch_and_catch_up_on_registration(tmp_path):
    """Two local watchers of a queue cost one watch_queue; each is told once when it takes effect, then on news."""
    from push.watches import QueueWatches
    from store.record import Message, RecordKind
    loop, h, gen = _loopback(tmp_path)
    try:
        queue = h.wait(loop.add_filter("w/#"))
        watches = QueueWatches(loop)
        heard = []
        watches.watch(queue, "a", lambda q: heard.append(("a", q)))
        watches.watch(queue, "b", lambda q: heard.append(("b", q)))
        assert heard == []  # nothing is registered yet: a remote store answers later
        h.run_for(0.1, step=0.05)
        assert sorted(heard) == [("a", queue), ("b", queue)] and loop.calls == 2  # add_filter + one watch
        heard.clear()
        h.wait(loop.append(Message("w/1", b"x", RecordKind.MQTT_PUBLISH, 0)))
        h.run_for(0.1, step=0.05)
        assert sorted(heard) == [("a", queue), ("b", queue)]
    finally:
        next(gen, None)


def test_queue_watches_drop_the_store_watch_with_the_last_watcher(tmp_path):
    """Unwatching the last watcher unwatches the store, also when it goes before the registration came back."""
    from push.watches import QueueWatches
    from store.record import Message, RecordKind
    loop, h, gen = _loopback(tmp_path)
    try:
        queue = h.wait(loop.add_filter("u/#"))
        watches = QueueWatches(loop)
        heard = []
        watches.watch(queue, "a", heard.append)
        watches.unwatch(queue, "a")  # before watch_queue answered
        h.run_for(0.1, step=0.05)
        h.wait(loop.append(Message("u/1", b"x", RecordKind.MQTT_PUBLISH, 0)))
        h.run_for(0.1, step=0.05)
        assert heard == [] and watches.watched() == 0
        assert h.store._watches == {}  # the store holds no watch for it any more
    finally:
        next(gen, None)


def test_read_cache_joins_cached_head_and_stored_tail(tmp_path):
    """A read partly in the cache takes the cached head and reads only the rest, following the store's next."""
    from store.record import Message, RecordKind
    loop, h, gen = _loopback(tmp_path)
    try:
        cache = ReadCache(loop)
        queue = h.wait(loop.add_filter("j/#"))
        (start,) = h.wait(loop.end_positions(queue))
        for i in range(3):
            h.wait(loop.append(Message("j/1", b"%d" % i, RecordKind.MQTT_PUBLISH, 0)))
        head = h.wait(cache.read(start, 10))
        for i in range(3, 7):
            h.wait(loop.append(Message("j/1", b"%d" % i, RecordKind.MQTT_PUBLISH, 0)))
        calls = loop.calls
        again = h.wait(cache.read(start, 10))  # no news yet: the end the first read found still stands
        assert again.messages == head.messages and loop.calls == calls
        cache.news(queue)  # (QueueWatches tells the cache first)
        whole = h.wait(cache.read(start, 10))
        assert [m.record.body for m in whole.messages] == [b"%d" % i for i in range(7)]
        assert whole.messages[:3] == head.messages and loop.calls == calls + 1  # one store read, for the tail
        assert h.wait(cache.read(whole.next, 10)).messages == ()
        assert cache.hits == 6
    finally:
        next(gen, None)


def test_a_drained_subscription_reads_again_only_after_news(tmp_path):
    """Acknowledgements of a subscriber at the end of its queue cause no store reads; the next message does."""
    from mqtt_proxy.codec import PubAck, SubscriptionOptions
    h = Harness(tmp_path)
    try:
        sub = h.connect("drained", level=4)
        sub.send(Subscribe(1, (Subscription("dr/#", SubscriptionOptions(qos=1)),)))
        sub.received()
        pub = h.connect("dr-pub", level=4)
        reads = []
        real_read = h.local.read_queue
        h.local.read_queue = lambda *a: reads.append(a) or real_read(*a)
        for i in range(3):
            pub.send(Publish("dr/t", b"%d" % i, qos=1, packet_id=i + 1))
        got = published(sub)
        assert [p.payload for p in got] == [b"0", b"1", b"2"]
        sub.send(PubAck(got[0].packet_id))  # an acknowledgement pumps: one read finds the queue drained
        settled = len(reads)
        for p in got[1:]:
            sub.send(PubAck(p.packet_id))  # more pumps, a tick apart: nothing new, so no read
        h.tick()
        assert len(reads) == settled
        pub.send(Publish("dr/t", b"3", qos=1, packet_id=9))
        assert [p.payload for p in published(sub)] == [b"3"] and len(reads) > settled
    finally:
        h.close()


def test_a_queue_with_one_reader_bypasses_the_read_cache(tmp_path):
    """A single subscriber's reads go straight to the store; a second subscriber of the filter brings the cache in."""
    h = Harness(tmp_path)
    try:
        one = h.connect("solo", level=4)
        one.send(Subscribe(1, (Subscription("solo/#"),)))
        pub = h.connect("solo-pub", level=4)
        pub.send(Publish("solo/t", b"a"))
        assert [p.payload for p in published(one)] == [b"a"]
        cache = h.broker.registry.ctx.delivery.read_cache
        assert (cache.hits, cache.misses) == (0, 0)
        two = h.connect("duo", level=4)
        two.send(Subscribe(1, (Subscription("solo/#"),)))
        pub.send(Publish("solo/t", b"b"))
        assert [p.payload for p in published(one)] == [b"b"] and [p.payload for p in published(two)] == [b"b"]
        assert cache.misses == 1 and cache.hits == 1  # one store read served both
    finally:
        h.close()


class _SlowQueue(_CountingQueue):
    """As ``_CountingQueue``, but each read answers only when ``answer()`` is called (a store across RPC)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.waiting = []

    def read_queue(self, position, max_count):
        d = defer.Deferred()
        self.waiting.append((super().read_queue(position, max_count), d))
        return d

    def answer(self) -> None:
        waiting, self.waiting = self.waiting, []
        for result, d in waiting:
            result.chainDeferred(d)


def test_readers_of_a_position_with_a_store_read_under_way_wait_for_it():
    """Sessions that ask for the same position while its store read is under way (a fan-out's readers after news,
    across RPC) share that read: one store read, every reader answered, failures shared too."""
    store = _SlowQueue(20)
    cache = ReadCache(store)
    at = QueuePosition("q", "g", 0)
    got = []
    for count in (20, 20, 5, 20):
        cache.read(at, count).addCallback(got.append)
    assert store.reads == [0] and got == []
    store.answer()
    assert store.reads == [0]
    assert sorted([m.record.offset for m in r.messages] for r in got) == [list(range(5))] + [list(range(20))] * 3
    assert all(r.next == QueuePosition("q", "g", 20 if len(r.messages) == 20 else 5) for r in got)
    failed = []
    cache.read(QueuePosition("q", "g", 40), 10).addErrback(failed.append)
    cache.read(QueuePosition("q", "g", 40), 10).addErrback(failed.append)
    store.waiting[0][1].errback(RuntimeError("broker gone"))
    store.waiting.clear()
    assert len(failed) == 2 and store.reads == [0, 40]
