"""The broker-side store server: notify as event frames only to the connections that watch a queue,
sent as the store tells it with the news' entries, dropped with their connection (RemoteStore on both ends, in
memory, on a task.Clock)."""

from __future__ import annotations

import msgpack
import pytest
from twisted.internet import task
from twisted.test import iosim

from cluster.remote import codec as store_codec
from cluster.remote import server as server_module
from cluster.remote.server import StoreServer
from cluster.remote.store import RemoteStore
from cluster.rpc.dispatch import Dispatcher
from cluster.rpc.frames import Hello
from cluster.rpc.peer import PeerClient
from cluster.rpc.protocol import RpcProtocol, RpcSettings
from cluster.rpc.server import RpcServerFactory
from store import api
from store.record import Message, RecordKind
from tests.contract.conftest import T0, Parts

SETTINGS = RpcSettings(call_timeout=5.0, heartbeat_interval=1.0)


class Rig:
    """One broker (a real in-process store behind StoreServer) and any number of RemoteStore proxies."""

    def __init__(self, path: str) -> None:
        self.clock = task.Clock()
        self.clock.advance(T0)
        self.parts = Parts(path, self.clock)
        self.dispatcher = Dispatcher(self.clock)
        self.server = StoreServer(self.parts.local(), self.clock)
        self.server.register(self.dispatcher)
        self.factory = RpcServerFactory(Hello("twistmq", "b1", "broker", 1), SETTINGS, self.clock, self.dispatcher)
        self.factory.on_lost(self.server.connection_lost)
        self.pumps: list = []

    def proxy(self, name: str) -> tuple[RemoteStore, RpcProtocol]:
        client = PeerClient("b1", None, Hello("twistmq", name, "proxy", 1), SETTINGS, self.clock)
        remote = RemoteStore(client)
        p = RpcProtocol(client.local, True, SETTINGS, self.clock, on_event=client._event)
        server = self.factory.buildProtocol(None)
        self.pumps.append(iosim.connect(server, iosim.makeFakeServer(server), p, iosim.makeFakeClient(p)))
        client._up(p)  # what the ClientService's factory does once the handshake is done
        return remote, p

    def settle(self) -> None:
        for _ in range(6):
            for pump in self.pumps:
                pump.flush()
            self.clock.advance(0)

    def wait(self, d):
        out: list = []
        d.addBoth(out.append)
        self.settle()
        assert out, "no answer"
        if hasattr(out[0], "raiseException"):
            out[0].raiseException()
        return out[0]


@pytest.fixture
def rig(tmp_path):
    r = Rig(str(tmp_path))
    yield r
    r.parts.close(r.clock)


def publish(topic: str) -> Message:
    return Message(topic, b"x", RecordKind.MQTT_PUBLISH, 1)


def test_news_goes_only_to_watching_connections_once_per_tick(rig):
    """Three appends in one tick to A's queue give A one event and a proxy watching another queue none."""
    a, _pa = rig.proxy("proxy-a")
    b, _pb = rig.proxy("proxy-b")
    qa = rig.wait(a.add_filter("a/#"))
    qb = rig.wait(b.add_filter("b/#"))
    heard_a, heard_b = [], []
    rig.wait(a.watch_queue(qa, heard_a.append))
    rig.wait(a.watch_queue(qa, heard_a.append))  # two watches on one connection: still one frame per tick
    rig.wait(b.watch_queue(qb, heard_b.append))
    c, _pc = rig.proxy("proxy-c")  # a publisher elsewhere: a's own appends would tell it in their answers
    batch = c.append_batch((publish("a/1"), publish("a/2")))
    single = c.append(publish("a/3"))
    rig.wait(batch), rig.wait(single)
    assert heard_a == [qa, qa]  # one frame, two local watches called
    assert heard_b == []
    assert rig.dispatcher.metrics.events == 1


def test_a_connection_cannot_unwatch_anothers_watch(rig):
    """A watch belongs to the connection that made it: the broker answers NotFound to any other."""
    a, _pa = rig.proxy("proxy-a")
    b, _pb = rig.proxy("proxy-b")
    q = rig.wait(a.add_filter("w/#"))
    rig.wait(a.watch_queue(q, lambda _q: None))
    (remote_watch,) = [w for _q, _cb, w in a._watches.values()]
    frame_of_b = b._call("unwatch_queue", (remote_watch,), {})
    out: list = []
    frame_of_b.addBoth(out.append)
    rig.settle()
    assert isinstance(out[0].value, api.NotFound)
    assert rig.server.watches == 1


def test_watches_are_dropped_when_their_connection_goes(rig):
    """When a proxy's connection closes, the broker drops its watches and sends it nothing more."""
    a, pa = rig.proxy("proxy-a")
    q = rig.wait(a.add_filter("gone/#"))
    rig.wait(a.watch_queue(q, lambda _q: None))
    rig.wait(a.watch_queue(q, lambda _q: None))
    assert rig.server.watches == 2
    pa.transport.loseConnection()
    rig.settle()
    assert rig.server.watches == 0 and rig.dispatcher.metrics.connections == 0
    other, _p = rig.proxy("proxy-c")
    rig.wait(other.append(publish("gone/1")))  # news of an unwatched queue: no frame to anyone
    assert rig.dispatcher.metrics.events == 0


def test_remote_store_watches_again_after_a_reconnect(rig):
    """After a reconnect RemoteStore registers its watches again, calls each once (news may be missed),
    and the Watch its caller holds keeps working."""
    client = PeerClient("b1", None, Hello("twistmq", "proxy-r", "proxy", 1), SETTINGS, rig.clock)
    remote = RemoteStore(client)

    def connect():
        p = RpcProtocol(client.local, True, SETTINGS, rig.clock, on_event=client._event)
        server = rig.factory.buildProtocol(None)
        rig.pumps.append(iosim.connect(server, iosim.makeFakeServer(server), p, iosim.makeFakeClient(p)))
        client._up(p)
        return p

    first = connect()
    q = rig.wait(remote.add_filter("r/#"))
    heard: list[str] = []
    watch = rig.wait(remote.watch_queue(q, heard.append))
    first.transport.loseConnection()
    rig.settle()
    assert rig.server.watches == 0
    connect()
    rig.settle()
    assert heard == [q] and rig.server.watches == 1
    rig.wait(remote.append(publish("r/1")))
    assert heard == [q, q]
    rig.wait(remote.unwatch_queue(watch))
    assert rig.server.watches == 0


def test_filter_interest_goes_with_its_connection(rig):
    """Interest a proxy took is dropped when its connection goes; a proxy cannot drop another's interest."""
    a, pa = rig.proxy("proxy-a")
    b, _pb = rig.proxy("proxy-b")
    q = rig.wait(a.add_filter("i/#"))
    out: list = []
    b.remove_filter("i/#").addBoth(out.append)
    rig.settle()
    assert isinstance(out[0].value, api.NotFound) and rig.server.filters == 1
    (start,) = rig.wait(b.end_positions(q))
    rig.wait(b.append(publish("i/1")))  # indexed: a holds interest
    pa.transport.loseConnection()
    rig.settle()
    assert rig.server.filters == 0
    rig.wait(b.append(publish("i/2")))  # not indexed: nobody holds interest any more
    assert [m.record.topic for m in rig.wait(b.read_queue(start, 10)).messages] == ["i/1"]


def test_the_broker_holds_interest_for_stored_sessions(rig, tmp_path):
    """SessionInterest takes interest per stored subscription (also after a restart, from the KV) and drops
    it with the subscription or the session, so persistent sessions miss nothing while no proxy holds it."""
    from cluster.local.session_interest import SessionInterest
    from store.session_store import SessionStore

    local = rig.parts.local()
    held = SessionInterest(local, SessionStore(rig.parts.kv))
    q = rig.wait(local.add_filter("p/#"))
    (start,) = rig.wait(local.end_positions(q))
    rig.wait(local.remove_filter("p/#"))
    epoch = rig.wait(held.claim_session("c1", "proxy-1"))
    rig.wait(held.put_session(api.SessionMeta("c1", 3600, 5), epoch))
    rig.wait(held.put_subscription("c1", api.SubscriptionState("p/#", 1, (start,)), epoch))
    rig.wait(held.put_subscription("c1", api.SubscriptionState("p/#", 1, (start,)), epoch))  # replaced: one ref
    assert held.held == 1
    rig.wait(held.append(publish("p/1")))
    restarted = SessionInterest(local, SessionStore(rig.parts.kv))  # as a broker starting on this KV
    rig.wait(restarted.restore())
    assert restarted.held == 1
    rig.wait(held.delete_session("c1", epoch))
    rig.wait(restarted.delete_subscription("c1", "p/#", epoch))
    assert held.held == restarted.held == 0
    rig.wait(held.append(publish("p/2")))  # no interest left: not indexed
    assert [m.record.topic for m in rig.wait(local.read_queue(start, 10)).messages] == ["p/1"]


def test_restore_follows_subscriptions_stored_by_another_writer(rig):
    """A promoted slave's restore(): interest in the subscriptions its KV got from elsewhere (replication), none
    left in those deleted there since; the messages appended in between are indexed for them."""
    from cluster.local.session_interest import SessionInterest
    from store.session_store import SessionStore

    local = rig.parts.local()
    q = rig.wait(local.add_filter("r/#"))
    (start,) = rig.wait(local.end_positions(q))
    rig.wait(local.remove_filter("r/#"))
    promoted = SessionInterest(local, SessionStore(rig.parts.kv))
    rig.wait(promoted.restore())
    writer = SessionInterest(local, SessionStore(rig.parts.kv))  # the master, writing the KV both share
    epoch = rig.wait(writer.claim_session("c1", "proxy-1"))
    rig.wait(writer.put_session(api.SessionMeta("c1", 3600, 5), epoch))
    rig.wait(writer.put_subscription("c1", api.SubscriptionState("r/#", 1, (start,)), epoch))
    assert promoted.held == 0
    rig.wait(promoted.restore())
    assert promoted.held == 1
    rig.wait(writer.delete_subscription("c1", "r/#", epoch))  # writer's interest goes; promoted's is its own
    rig.wait(promoted.append(publish("r/1")))
    rig.wait(promoted.restore())
    assert promoted.held == 0
    rig.wait(promoted.append(publish("r/2")))  # nobody's interest left: not indexed
    assert [m.record.topic for m in rig.wait(local.read_queue(start, 10)).messages] == ["r/1"]


def test_native_requests_go_whole_to_the_engine(rig):
    """RemoteStore.native_request forwards the client's request map and returns the engine's reply map."""
    a, _pa = rig.proxy("proxy-a")
    produced = rig.wait(a.native_request({"action": "produce", "queue": "jobs", "data": "hello", "seq": 9}))
    assert produced["code"] == 0 and produced["seq"] == 9
    consumed = rig.wait(a.native_request({"action": "consume", "queue": "jobs"}))
    assert (consumed["msg_id"], consumed["data"]) == (produced["msg_id"], "hello")
    assert rig.wait(a.native_request({"action": "consume", "queue": ""}))["code"] == -1


def _read_calls(rig) -> int:
    return rig.dispatcher.metrics.calls["store.read_queue"]


def test_a_proxy_reads_its_own_appends_without_a_call(rig):
    """The append's answer says where the proxy's messages went in a queue it watches: a read of them is answered
    by the proxy with what the broker would answer, and no read reaches the broker."""
    a, _pa = rig.proxy("proxy-a")
    b, _pb = rig.proxy("proxy-b")
    q = rig.wait(a.add_filter("own/#"))
    rig.wait(a.watch_queue(q, lambda _q: None))
    rig.wait(b.watch_queue(q, lambda _q: None))  # b reads from the broker: the broker keeps them in memory
    (start,) = rig.wait(a.end_positions(q))
    sent = (publish("own/1"), Message("own/2", b"yy", RecordKind.MQTT_PUBLISH, 0, False, "c", 0, {"k": "v"}),
            publish("other/1"), publish("own/3"))
    results = rig.wait(a.append_batch(sent))
    assert [r.ok for r in results] == [True] * 4
    mine = rig.wait(a.read_queue(start, 10))
    assert _read_calls(rig) == 0 and a.own.answered == 1
    theirs = rig.wait(b.read_queue(start, 10))  # b appended nothing: its news carried the entries
    assert _read_calls(rig) == 0 and b.own.answered == 1
    broker = rig.wait(rig.server.store.read_queue(start, 10))  # what a read of the broker answers
    assert mine == theirs == broker and len(mine.messages) == 3
    assert [m.record.topic for m in mine.messages] == ["own/1", "own/2", "own/3"]


def test_a_read_past_the_own_entries_goes_to_the_broker(rig, monkeypatch):
    """Entries another proxy appended after ours (told by the news) are not hidden: a read wanting more than our
    own run and the news' entries is the broker's, and both proxies' appends in one drain get their right queue
    offsets."""
    monkeypatch.setattr(server_module, "MAX_NEWS_ENTRIES", 1)  # the news carries b1 only
    a, _pa = rig.proxy("proxy-a")
    b, _pb = rig.proxy("proxy-b")
    q = rig.wait(a.add_filter("mix/#"))
    for store in (a, b):
        rig.wait(store.watch_queue(q, lambda _q: None))
    (start,) = rig.wait(a.end_positions(q))
    da = a.append_batch((publish("mix/a1"), publish("mix/a2")))
    db = b.append_batch((publish("mix/b1"), publish("mix/b2"), publish("mix/b3")))
    rig.wait(da), rig.wait(db)  # one drain: a's records first, then b's
    two = rig.wait(a.read_queue(start, 2))
    assert _read_calls(rig) == 0 and [m.record.topic for m in two.messages] == ["mix/a1", "mix/a2"]
    whole = rig.wait(a.read_queue(start, 10))
    assert _read_calls(rig) == 1 and [m.record.topic for m in whole.messages] == \
        ["mix/a1", "mix/a2", "mix/b1", "mix/b2", "mix/b3"]
    b_own = rig.wait(b.read_queue(two.next, 3))
    assert _read_calls(rig) == 1 and b_own.messages == whole.messages[2:] and b_own.next == whole.next


def test_nothing_past_the_confirm_offset_is_told(rig):
    """On a master whose confirm offset is short of a batch, the answer tells nothing: the proxy's read goes to the
    broker, which shows nothing past the confirm offset; once it passes, the broker's read has them."""
    a, _pa = rig.proxy("proxy-a")
    q = rig.wait(a.add_filter("held/#"))
    rig.wait(a.watch_queue(q, lambda _q: None))
    (start,) = rig.wait(a.end_positions(q))
    store = rig.parts.store
    store.set_confirm_offset(store.commit_log.max_offset)  # a master whose slaves hold nothing newer
    rig.wait(a.append_batch((publish("held/1"), publish("held/2"))))
    early = rig.wait(a.read_queue(start, 10))
    assert early.messages == () and a.own.answered == 0 and _read_calls(rig) == 1
    store.set_confirm_offset(store.commit_log.max_offset)
    rig.settle()
    late = rig.wait(a.read_queue(start, 10))  # the news of the confirm offset passing carried them
    assert [m.record.topic for m in late.messages] == ["held/1", "held/2"] and _read_calls(rig) == 1
    assert late == rig.wait(rig.server.store.read_queue(start, 10))


def test_the_broker_keeps_only_the_bytes_for_a_proxy_that_reads_its_own_appends(rig):
    """Appends whose only watcher is the proxy that made them are kept in the broker's memory as written (no Record
    built for them), and a read of them from the broker still has them; another watcher gets Records kept."""
    from store.message_store import _KEEP_BYTES, _KEEP_NOTHING, _KEEP_RECORD, _keep_what
    a, _pa = rig.proxy("proxy-a")
    b, _pb = rig.proxy("proxy-b")
    q = rig.wait(a.add_filter("solo/#"))
    rig.wait(a.watch_queue(q, lambda _q: None))
    (start,) = rig.wait(a.end_positions(q))
    kept = rig.parts.store.kept_in_memory
    rig.wait(a.append_batch((publish("solo/1"), publish("solo/2"))))
    assert rig.parts.store.kept_in_memory == kept + 2
    late = rig.wait(b.read_queue(start, 10))  # a session that fell behind reads them from the broker
    assert [(m.record.topic, m.record.body) for m in late.messages] == [("solo/1", b"x"), ("solo/2", b"x")]
    watched = {q: 1}
    assert _keep_what(lambda qs, excluding=None: excluding is None, (q,), watched) == _KEEP_BYTES
    assert _keep_what(lambda qs, excluding=None: True, (q,), watched) == _KEEP_RECORD  # another watcher too
    assert _keep_what(lambda qs, excluding=None: False, ("t/other",), watched) == _KEEP_NOTHING
    assert _keep_what(lambda qs, excluding=None: False, (q,), None) == _KEEP_NOTHING


def test_an_append_answer_is_its_proxys_news(rig):
    """The proxy that appended hears of its entries from the answer (no event frame for them); entries another
    proxy appends after them still come as an event, with the queue's end."""
    a, _pa = rig.proxy("proxy-a")
    b, _pb = rig.proxy("proxy-b")
    q = rig.wait(a.add_filter("told/#"))
    heard: list = []
    rig.wait(a.watch_queue(q, heard.append))
    rig.wait(a.append_batch((publish("told/1"), publish("told/2"))))
    assert heard == [q] and rig.dispatcher.metrics.events == 0 and a.events_received == 0
    rig.wait(b.append_batch((publish("told/3"),)))
    assert heard == [q, q] and a.events_received == 1
    (start,) = rig.wait(b.first_positions(q))
    whole = rig.wait(a.read_queue(start, 10))  # past a's own run: the broker's answer, b's entry included
    assert [m.record.topic for m in whole.messages] == ["told/1", "told/2", "told/3"]


def test_an_append_whose_answer_is_lost_tells_every_watcher(rig):
    """An append that timed out may have been stored, and its answer was its news: every watcher hears of its queue."""
    from cluster.rpc.protocol import CallTimeout
    a, _pa = rig.proxy("proxy-a")
    q = rig.wait(a.add_filter("lost/#"))
    heard: list = []
    rig.wait(a.watch_queue(q, heard.append))
    out: list = []
    a.append_batch((publish("lost/1"),)).addBoth(out.append)
    rig.clock.advance(SETTINGS.call_timeout + 0.5)  # the connection carried nothing meanwhile: no answer came
    assert out and out[0].check(CallTimeout)
    assert heard == [q]


def test_news_reaches_another_proxy_in_the_tick_its_append_is_answered(rig):
    """The news of an append goes to a watching proxy with the answer to the proxy that appended, not a reactor
    tick later (a publisher and a subscriber on two proxies waited that tick on every message)."""
    a, _pa = rig.proxy("proxy-a")
    c, _pc = rig.proxy("proxy-c")
    q = rig.wait(a.add_filter("tick/#"))
    heard: list = []
    rig.wait(a.watch_queue(q, heard.append))
    answered: list = []
    c.append_batch((publish("tick/1"),)).addCallback(answered.append)
    for pump in rig.pumps:
        pump.flush()  # the call reaches the broker
    reactor_turn(rig.clock)  # the store's drain: the record is written and answered
    for pump in rig.pumps:
        pump.flush()  # what the broker wrote in that turn reaches the proxies
    assert answered and heard == [q]


def reactor_turn(clock: task.Clock) -> None:
    """Run the calls due now as one reactor iteration does: those they schedule wait for the next one (Clock.advance
    would run them too)."""
    for call in [c for c in clock.getDelayedCalls() if c.getTime() <= clock.seconds()]:
        if call.active():
            func, args, kw = call.func, call.args, call.kw
            call.cancel()
            func(*args, **kw)


def test_news_carries_its_entries_to_another_proxy(rig):
    """A proxy that did not append the entries gets them with their news: its session's read of them, and the read
    at the end after them, are answered without a call and equal the broker's answers."""
    a, _pa = rig.proxy("proxy-a")
    c, _pc = rig.proxy("proxy-c")
    q = rig.wait(a.add_filter("push/#"))
    rig.wait(a.watch_queue(q, lambda _q: None))
    (start,) = rig.wait(a.end_positions(q))
    calls = _read_calls(rig)
    rig.wait(c.append_batch((publish("push/1"), publish("push/2"), publish("other/1"), publish("push/3"))))
    got = rig.wait(a.read_queue(start, 10))
    assert [m.record.topic for m in got.messages] == ["push/1", "push/2", "push/3"]
    assert got == rig.wait(rig.server.store.read_queue(start, 10))
    after = rig.wait(a.read_queue(got.next, 10))
    assert after.messages == () and after.next == got.next
    assert _read_calls(rig) == calls and a.own.answered == 2
    rig.wait(c.append_batch((publish("push/4"),)))  # the next news carries the next entries only
    more = rig.wait(a.read_queue(got.next, 10))
    assert [m.record.topic for m in more.messages] == ["push/4"] and _read_calls(rig) == calls


def test_news_carries_no_entry_past_the_confirm_offset(rig):
    """On a master, news released as the confirm offset passes one batch carries that batch's entries and none of
    the next one's, though the queue's end counts them; the next release carries the rest (its news has the
    same end: it is not taken for known)."""
    a, _pa = rig.proxy("proxy-a")
    c, _pc = rig.proxy("proxy-c")
    q = rig.wait(a.add_filter("conf/#"))
    heard: list = []
    rig.wait(a.watch_queue(q, heard.append))
    (start,) = rig.wait(a.end_positions(q))
    store = rig.parts.store
    store.set_confirm_offset(store.commit_log.max_offset)  # a master whose slaves hold nothing newer
    rig.wait(c.append_batch((publish("conf/1"),)))
    first_end = store.commit_log.max_offset
    rig.wait(c.append_batch((publish("conf/2"),)))
    assert heard == [] and rig.wait(a.read_queue(start, 10)).messages == ()
    calls = _read_calls(rig)
    store.set_confirm_offset(first_end)
    rig.settle()
    assert heard == [q]
    assert [m.record.topic for m in a.own.read(start, 1).messages] == ["conf/1"]
    assert a.own.read(start, 10) is None  # the end says 2 entries, the news showed 1: the rest is the broker's
    assert [m.record.topic for m in rig.wait(a.read_queue(start, 10)).messages] == ["conf/1"]
    assert _read_calls(rig) == calls + 1
    store.set_confirm_offset(store.commit_log.max_offset)
    rig.settle()
    assert heard == [q, q]
    whole = rig.wait(a.read_queue(start, 10))
    assert [m.record.topic for m in whole.messages] == ["conf/1", "conf/2"] and _read_calls(rig) == calls + 1


def test_queue_news_frames_round_trip_and_refuse_bad_shapes():
    """The news frame is [queue, end] or [queue, end, read result]; anything else is a CodecError."""
    assert store_codec.unpack_queue_news(store_codec.pack_queue_news("q", 7)) == ("q", 7, None)
    empty = api.ReadResult((), api.QueuePosition("q", "g", 7), 0)
    assert store_codec.unpack_queue_news(store_codec.pack_queue_news("q", 7, empty)) == ("q", 7, empty)
    for bad in ([], ["q"], ["q", "7"], [1, 7], ["q", 7, "x"], ["q", 7, [], 1]):
        with pytest.raises(store_codec.CodecError):
            store_codec.unpack_queue_news(msgpack.packb(bad))


def test_a_queue_watched_again_reads_what_came_while_it_was_not(rig):
    """Entries kept from a queue's news are dropped with its last watch: watched again (a persistent session back),
    a read at the end the old news named gets what was appended meanwhile, not an empty answer."""
    a, _pa = rig.proxy("proxy-a")
    c, _pc = rig.proxy("proxy-c")
    q = rig.wait(a.add_filter("back/#"))
    watch = rig.wait(a.watch_queue(q, lambda _q: None))
    (start,) = rig.wait(a.end_positions(q))
    rig.wait(c.append_batch((publish("back/1"),)))
    first = rig.wait(a.read_queue(start, 10))
    assert [m.record.topic for m in first.messages] == ["back/1"]
    rig.wait(a.unwatch_queue(watch))
    rig.wait(c.append_batch((publish("back/2"),)))  # no news of it to a: a watches nothing
    rig.wait(a.watch_queue(q, lambda _q: None))
    again = rig.wait(a.read_queue(first.next, 10))
    assert [m.record.topic for m in again.messages] == ["back/2"]


def test_a_connection_whose_writes_back_up_gets_news_without_entries(rig):
    """While a proxy's connection has its write buffer full (the transport paused it), its news is bare and the proxy
    reads what it wants; once resumed, the news carries the entries that came after."""
    a, _pa = rig.proxy("proxy-a")
    to_a = rig.pumps[-1].server  # the broker's end of a's connection
    c, _pc = rig.proxy("proxy-c")
    q = rig.wait(a.add_filter("slow/#"))
    rig.wait(a.watch_queue(q, lambda _q: None))
    (start,) = rig.wait(a.end_positions(q))
    calls = _read_calls(rig)
    to_a.pauseProducing()
    rig.wait(c.append_batch((publish("slow/1"),)))
    first = rig.wait(a.read_queue(start, 10))
    assert [m.record.topic for m in first.messages] == ["slow/1"] and _read_calls(rig) == calls + 1
    to_a.resumeProducing()
    rig.wait(c.append_batch((publish("slow/2"),)))
    second = rig.wait(a.read_queue(first.next, 10))
    assert [m.record.topic for m in second.messages] == ["slow/2"] and _read_calls(rig) == calls + 1
