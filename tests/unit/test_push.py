"""Push layer: events merged per tick, one store read serving many readers, one encode for many sessions."""

from __future__ import annotations

from twisted.internet import task

from mqtt_proxy.codec import Publish, Subscribe, Subscription
from push.notifier import Notifier
from push.read_cache import ReadCache
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
