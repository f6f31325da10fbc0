"""The store interface's contract, written once and run against every implementation (see conftest.py)."""

from __future__ import annotations

import base64

import pytest

from cluster.remote import codec as store_codec
from store import api
from store.record import Message, RecordKind
from tests.contract.conftest import GROUP, RETAINED_LIMIT


def publish(topic: str, body: bytes, qos: int = 1, **kw) -> Message:
    return Message(topic, body, RecordKind.MQTT_PUBLISH, qos, **kw)


def read_all(h, position: api.QueuePosition) -> list[bytes]:
    """Every body from ``position`` on, following ``next``."""
    bodies: list[bytes] = []
    while True:
        result = h.wait(h.store.read_queue(position, 100))
        if not result.messages:
            return bodies
        bodies += [m.record.body for m in result.messages]
        position = result.next


def subscribe(h, topic_filter: str) -> api.QueuePosition:
    """Register interest in a filter; the position where its new messages start."""
    queue = h.wait(h.store.add_filter(topic_filter))
    (position,) = h.wait(h.store.end_positions(queue))
    return position


def test_every_operation_is_served(store):
    """The implementation has every operation of the interface."""
    assert isinstance(store.store, api.Store)
    assert all(callable(getattr(store.store, name)) for name in store_codec.OPERATIONS)


# -- the message log ------------------------------------------------------------------------------------

def test_append_stores_the_message_and_names_its_queues(store):
    """An append resolves PUT_OK with its commit-log offset and queues, and the message is readable there."""
    start = subscribe(store, "dev/+/temp")
    result = store.wait(store.store.append(publish("dev/1/temp", b"21.5", client_id="c1")))
    assert result.ok and result.offset >= 0
    assert set(result.queues) == {"%TOPIC%dev", start.queue}
    got = store.wait(store.store.read_queue(start, 10))
    (m,) = got.messages
    assert (m.record.topic, m.record.body, m.record.qos, m.record.client_id) == ("dev/1/temp", b"21.5", 1, "c1")
    assert m.record.offset == result.offset and m.position == start


def test_append_of_an_illegal_message_is_a_status(store):
    """A message the log cannot take resolves MESSAGE_ILLEGAL (not an error) and nothing is stored."""
    start = subscribe(store, "bad/#")
    result = store.wait(store.store.append(publish("bad/qos", b"x", qos=3)))
    assert result.status is api.AppendStatus.MESSAGE_ILLEGAL and result.offset == -1 and result.reason
    assert read_all(store, start) == []


def test_append_batch_answers_each_message_in_order(store):
    """A batch resolves one result per message, in order, offsets growing; an empty batch resolves empty."""
    start = subscribe(store, "b/#")
    results = store.wait(store.store.append_batch(tuple(publish("b/%d" % i, b"%d" % i) for i in range(5))))
    assert [r.status for r in results] == [api.AppendStatus.PUT_OK] * 5
    assert [r.offset for r in results] == sorted(r.offset for r in results)
    assert read_all(store, start) == [b"0", b"1", b"2", b"3", b"4"]
    assert store.wait(store.store.append_batch(())) == ()


# -- queues ---------------------------------------------------------------------------------------------

def test_read_from_a_position_continues_at_next(store):
    """A read returns messages with their positions and where to continue; reading from there gets the rest."""
    start = subscribe(store, "r/#")
    store.wait(store.store.append_batch(tuple(publish("r/x", b"%d" % i) for i in range(7))))
    first = store.wait(store.store.read_queue(start, 3))
    assert [m.record.body for m in first.messages] == [b"0", b"1", b"2"]
    assert [m.position for m in first.messages] == [start, start.next(), start.next().next()]
    assert first.next == first.messages[-1].position.next() and first.lost == 0
    rest = store.wait(store.store.read_queue(first.next, 100))
    assert [m.record.body for m in rest.messages] == [b"3", b"4", b"5", b"6"]
    empty = store.wait(store.store.read_queue(rest.next, 100))
    assert empty.messages == () and empty.next == rest.next
    (end,) = store.wait(store.store.end_positions(start.queue))
    assert end == rest.next


def test_read_with_a_bad_count_is_refused(store):
    """max_count below 1 fails with InvalidArgument."""
    start = subscribe(store, "c/#")
    assert isinstance(store.error(store.store.read_queue(start, 0)), api.InvalidArgument)


def test_positions_belong_to_a_group_and_queue(store):
    """Positions name the serving group; they order within one queue only; an unknown queue is empty."""
    (first,) = store.wait(store.store.first_positions("%LMQ%never/used"))
    (end,) = store.wait(store.store.end_positions("%LMQ%never/used"))
    assert first == end and first.group == GROUP and first.queue == "%LMQ%never/used"
    assert first < first.next() and first.next() >= first and not first.next() <= first
    other = api.QueuePosition("%LMQ%other", GROUP, first.offset)
    with pytest.raises(TypeError):
        _ = first < other


def test_read_of_another_groups_position_is_refused(store):
    """A position of a broker group this store does not serve fails with WrongGroup."""
    start = subscribe(store, "w/#")
    foreign = api.QueuePosition(start.queue, "elsewhere", start.offset)
    assert isinstance(store.error(store.store.read_queue(foreign, 10)), api.WrongGroup)


def test_filter_interest_decides_what_is_indexed(store):
    """A light queue gets messages only while someone holds interest in its filter (reference-counted)."""
    start = subscribe(store, "f/+")
    assert start.queue == "%LMQ%f/+"
    store.wait(store.store.add_filter("f/+"))  # a second subscriber
    store.wait(store.store.append(publish("f/1", b"a")))
    store.wait(store.store.remove_filter("f/+"))
    store.wait(store.store.append(publish("f/1", b"b")))  # one reference left: still indexed
    store.wait(store.store.remove_filter("f/+"))
    store.wait(store.store.append(publish("f/1", b"c")))
    assert read_all(store, start) == [b"a", b"b"]


def test_filter_errors(store):
    """An invalid filter fails with InvalidArgument; dropping interest nobody holds with NotFound."""
    assert isinstance(store.error(store.store.add_filter("a/#/b")), api.InvalidArgument)
    assert isinstance(store.error(store.store.remove_filter("never/added")), api.NotFound)


def test_watch_hears_news_once_per_tick_until_unwatched(store):
    """A watcher is told the queue name once per tick of appends, and nothing after unwatching."""
    start = subscribe(store, "n/#")
    heard: list[str] = []
    watch = store.wait(store.store.watch_queue(start.queue, heard.append))
    assert watch.queue == start.queue
    store.wait(store.store.append_batch((publish("n/1", b"1"), publish("n/2", b"2"))))
    store.wait(store.store.append(publish("other/1", b"x")))  # not this queue
    assert heard == [start.queue]
    store.wait(store.store.unwatch_queue(watch))
    store.wait(store.store.append(publish("n/3", b"3")))
    assert heard == [start.queue]


def test_unwatch_of_an_unknown_watch_fails(store):
    """Stopping a watch that does not exist fails with NotFound."""
    assert isinstance(store.error(store.store.unwatch_queue(api.Watch("%LMQ%x", 12345))), api.NotFound)


# -- session state ------------------------------------------------------------------------------------------

HOLDER = "proxy-1"


def _claim(store, client_id: str = "c1", holder: str = HOLDER) -> int:
    return store.wait(store.store.claim_session(client_id, holder))


def _session(store, client_id: str = "c1") -> tuple[api.SubscriptionState, api.SubscriptionState]:
    start = subscribe(store, "s/+")
    e = _claim(store, client_id)
    store.wait(store.store.put_session(api.SessionMeta(client_id, 3600, 5, None), e))
    plain = api.SubscriptionState("s/+", 1, (start.next(),), no_local=True, sub_id=7)
    shared = api.SubscriptionState("s/#", 2, (), share_group="g")
    store.wait(store.store.put_subscription(client_id, plain, e))
    store.wait(store.store.put_subscription(client_id, shared, e))
    store.wait(store.store.put_outbound(client_id, api.OutboundState(10, plain.key, start, 1), e))
    store.wait(store.store.put_released(client_id, 11, e))
    store.wait(store.store.put_inbound_qos2(client_id, 12, e))
    return plain, shared


def test_session_state_round_trips(store):
    """Meta, subscriptions, outbound, released and inbound QoS 2 state come back as stored, with the claim."""
    plain, shared = _session(store)
    s = store.wait(store.store.get_session("c1"))
    assert s.meta == api.SessionMeta("c1", 3600, 5, None)
    assert s.subscriptions == (shared, plain)  # key order: "$share/g/s/#" < "s/+"
    (out,) = s.outbound
    assert (out.packet_id, out.subscription_key, out.qos) == (10, "s/+", 1) and out.position < plain.positions[0]
    assert s.released == frozenset({11}) and s.inbound_qos2 == frozenset({12})
    assert (s.epoch, s.holder) == (1, HOLDER)
    assert store.wait(store.store.get_session("nobody")) is None


def test_session_parts_are_removed_one_by_one(store):
    """Each delete removes exactly its part; a disconnect time is kept on the meta."""
    plain, shared = _session(store)
    store.wait(store.store.delete_subscription("c1", shared.key, 1))
    store.wait(store.store.delete_outbound("c1", 10, 1))
    store.wait(store.store.delete_released("c1", 11, 1))
    store.wait(store.store.delete_inbound_qos2("c1", 12, 1))
    store.wait(store.store.put_session(api.SessionMeta("c1", 3600, 5, store.now_ms()), 1))
    s = store.wait(store.store.get_session("c1"))
    assert s == api.SessionState(api.SessionMeta("c1", 3600, 5, store.now_ms()), (plain,), epoch=1, holder=HOLDER)


def test_delete_session_removes_everything(store):
    """delete_session removes a session and all under it; list_sessions shows the others in id order."""
    _session(store, "c1")
    for cid in ("c0", "c2"):
        store.wait(store.store.put_session(api.SessionMeta(cid, 60, 4, None), _claim(store, cid)))
    assert [s.meta.client_id for s in store.wait(store.store.list_sessions())] == ["c0", "c1", "c2"]
    store.wait(store.store.delete_session("c1", 1))
    assert store.wait(store.store.get_session("c1")) is None
    assert [s.meta.client_id for s in store.wait(store.store.list_sessions())] == ["c0", "c2"]
    store.wait(store.store.delete_session("c1", 1))  # absent: no error


def test_session_errors(store):
    """Bad packet ids and positions of the wrong queue fail with InvalidArgument, another group's with WrongGroup."""
    start = subscribe(store, "e/+")
    e = _claim(store)
    store.wait(store.store.put_session(api.SessionMeta("c1", 60, 5, None), e))
    for pid in (0, 65536):
        assert isinstance(store.error(store.store.put_released("c1", pid, e)), api.InvalidArgument)
        assert isinstance(store.error(store.store.put_outbound("c1", api.OutboundState(pid, "e/+", start, 1), e)),
                          api.InvalidArgument)
    wrong_queue = api.SubscriptionState("e/#", 1, (start,))
    assert isinstance(store.error(store.store.put_subscription("c1", wrong_queue, e)), api.InvalidArgument)
    foreign = api.SubscriptionState("e/+", 1, (api.QueuePosition(start.queue, "elsewhere", 0),))
    assert isinstance(store.error(store.store.put_subscription("c1", foreign, e)), api.WrongGroup)
    assert store.wait(store.store.get_session("c1")).subscriptions == ()


# -- claims and fencing (MQTT-3.1.4-3 across proxies) -----------------------------------------------------

def test_claims_bump_the_epoch_and_name_the_holder(store):
    """Each claim of a client id fires a higher epoch, durably recorded with its holder, also for a new id."""
    first = _claim(store, "c1", "proxy-1")
    second = _claim(store, "c1", "proxy-2")
    assert second > first >= 1
    assert _claim(store, "other", "proxy-1") >= 1
    store.wait(store.store.put_session(api.SessionMeta("c1", 60, 5, None), second))
    s = store.wait(store.store.get_session("c1"))
    assert (s.epoch, s.holder) == (second, "proxy-2")


def test_claim_and_get_claims_then_reads_and_names_the_holder_it_took_from(store):
    """claim_and_get fires the new epoch, the session stored (None for a new id) and who held the id before."""
    first = store.wait(store.store.claim_and_get("c1", "proxy-1"))
    assert first.session is None and first.taken_from == "" and first.epoch >= 1
    store.wait(store.store.put_session(api.SessionMeta("c1", 60, 5, None), first.epoch))
    second = store.wait(store.store.claim_and_get("c1", "proxy-2"))
    assert second.epoch > first.epoch and second.taken_from == "proxy-1"
    assert second.session.meta == api.SessionMeta("c1", 60, 5, None)
    assert (second.session.epoch, second.session.holder) == (second.epoch, "proxy-2")
    assert isinstance(store.error(store.store.put_session(api.SessionMeta("c1", 1, 5, None), first.epoch)), api.Fenced)


def test_writes_with_an_older_epoch_are_fenced(store):
    """After a takeover every write of the old holder fails with Fenced (code "fenced") and changes nothing."""
    start = subscribe(store, "f/+")
    old = _claim(store, "c1", "proxy-1")
    store.wait(store.store.put_session(api.SessionMeta("c1", 60, 5, None), old))
    new = _claim(store, "c1", "proxy-2")
    sub = api.SubscriptionState("f/+", 1, (start,))
    refused = [
        store.store.put_session(api.SessionMeta("c1", 1, 4, 5), old),
        store.store.put_subscription("c1", sub, old),
        store.store.delete_subscription("c1", "f/+", old),
        store.store.put_outbound("c1", api.OutboundState(3, "f/+", start, 1), old),
        store.store.delete_outbound("c1", 3, old),
        store.store.put_released("c1", 4, old),
        store.store.delete_released("c1", 4, old),
        store.store.put_inbound_qos2("c1", 5, old),
        store.store.delete_inbound_qos2("c1", 5, old),
        store.store.delete_session("c1", old),
    ]
    for d in refused:
        err = store.error(d)
        assert isinstance(err, api.Fenced) and err.code == "fenced"
    s = store.wait(store.store.get_session("c1"))
    assert s.meta == api.SessionMeta("c1", 60, 5, None) and s.subscriptions == () and s.outbound == ()
    store.wait(store.store.put_subscription("c1", sub, new))  # the new holder writes
    assert store.wait(store.store.get_session("c1")).subscriptions == (sub,)


def test_an_epoch_never_claimed_is_invalid(store):
    """A write with an epoch above the last claim is a caller bug: InvalidArgument."""
    e = _claim(store)
    assert isinstance(store.error(store.store.put_session(api.SessionMeta("c1", 60, 5, None), e + 1)),
                      api.InvalidArgument)


def test_epochs_keep_growing_across_delete_session(store):
    """Deleting a session keeps its claim, so a holder from before the delete stays fenced."""
    old = _claim(store, "c1", "proxy-1")
    new = _claim(store, "c1", "proxy-2")
    store.wait(store.store.delete_session("c1", new))
    assert isinstance(store.error(store.store.put_session(api.SessionMeta("c1", 60, 5, None), old)), api.Fenced)
    assert _claim(store, "c1", "proxy-1") > new


def test_a_released_claim_is_forgotten_and_its_epoch_stays_fenced(store):
    """release_session by the holder forgets an unstored session's claim; its epoch is Fenced, later claims higher."""
    old = _claim(store, "gone", "proxy-1")
    store.wait(store.store.release_session("gone", old))
    assert isinstance(store.error(store.store.put_session(api.SessionMeta("gone", 60, 5, None), old)), api.Fenced)
    assert _claim(store, "gone", "proxy-2") > old


def test_a_release_keeps_a_stored_sessions_claim_and_ignores_an_old_epoch(store):
    """A stored session keeps its claim through a release; a release by a holder taken over changes nothing."""
    e = _claim(store, "kept", "proxy-1")
    store.wait(store.store.put_session(api.SessionMeta("kept", 60, 5, None), e))
    store.wait(store.store.release_session("kept", e))
    store.wait(store.store.put_session(api.SessionMeta("kept", 61, 5, None), e))
    new = _claim(store, "kept", "proxy-2")
    store.wait(store.store.delete_session("kept", new))
    store.wait(store.store.release_session("kept", e))
    store.wait(store.store.put_session(api.SessionMeta("kept", 62, 5, None), new))
    assert store.wait(store.store.get_session("kept")).epoch == new


def test_a_will_is_written_with_the_claims_epoch_and_an_older_holders_is_fenced(store):
    """put_will/delete_will carry the epoch like every session write: the holder's pass (a delete of no will
    too), a holder taken over is Fenced, and a will that is not an MQTT publish is InvalidArgument."""
    will = api.WillState(Message("will/w", b"bye", RecordKind.MQTT_PUBLISH, 1, True, "w"), 5)
    old = _claim(store, "w", "proxy-1")
    store.wait(store.store.put_will("w", will, old))
    store.wait(store.store.delete_will("w", old))
    store.wait(store.store.delete_will("w", old))
    new = _claim(store, "w", "proxy-2")
    assert isinstance(store.error(store.store.put_will("w", will, old)), api.Fenced)
    assert isinstance(store.error(store.store.delete_will("w", old)), api.Fenced)
    store.wait(store.store.put_will("w", will, new))
    native = api.WillState(Message("q", b"x", RecordKind.NATIVE_MESSAGE), 0)
    assert isinstance(store.error(store.store.put_will("w", native, new)), api.InvalidArgument)
    store.wait(store.store.release_session("w", new))


def test_list_wills_gives_each_stored_will_with_its_claim(store):
    """list_wills: every stored will, in client-id order, with the holder and epoch of its claim; a will
    deleted or released is not listed."""
    props = {"exp": "1700000060000", "ct": "text/plain"}
    will = api.WillState(Message("will/b", b"bye", RecordKind.MQTT_PUBLISH, 1, True, "lw-b", 1_700_000_000_000,
                                 props), 7)
    b = _claim(store, "lw-b", "proxy-1")
    a = _claim(store, "lw-a", "proxy-2")
    gone = _claim(store, "lw-c", "proxy-1")
    store.wait(store.store.put_will("lw-b", will, b))
    store.wait(store.store.put_will("lw-a", api.WillState(Message("will/a", b"", RecordKind.MQTT_PUBLISH), 0), a))
    store.wait(store.store.put_will("lw-c", will, gone))
    store.wait(store.store.release_session("lw-c", gone))
    held = [h for h in store.wait(store.store.list_wills()) if h.client_id.startswith("lw-")]
    assert [(h.client_id, h.holder, h.epoch) for h in held] == [("lw-a", "proxy-2", a), ("lw-b", "proxy-1", b)]
    m = held[1].will.message
    assert (m.topic, m.body, m.qos, m.retain, m.born_ts, dict(m.properties), held[1].will.delay_s) == \
        ("will/b", b"bye", 1, True, 1_700_000_000_000, props, 7)
    store.wait(store.store.delete_will("lw-a", a))
    assert [h.client_id for h in store.wait(store.store.list_wills()) if h.client_id.startswith("lw-")] == ["lw-b"]
    for cid, epoch in (("lw-a", a), ("lw-b", b)):
        store.wait(store.store.release_session(cid, epoch))


def test_a_claim_by_another_identity_is_refused_and_fences_nobody(store):
    """A session claimed, or stored, by one identity is not claimed by another: NotAuthorized, the holder kept."""
    epoch = store.wait(store.store.claim_session("owned", "proxy-1", "user:alice"))
    assert isinstance(store.error(store.store.claim_session("owned", "proxy-2", "user:mallory")), api.NotAuthorized)
    store.wait(store.store.put_session(api.SessionMeta("owned", 3600, 5, None, "user:alice"), epoch))  # not fenced
    again = store.wait(store.store.claim_session("owned", "proxy-2", "user:alice"))  # the owner, elsewhere: taken over
    assert again > epoch
    store.wait(store.store.release_session("owned", again))  # the stored session keeps its claim and its owner
    assert isinstance(store.error(store.store.claim_session("owned", "proxy-3", "anonymous")), api.NotAuthorized)
    free = store.wait(store.store.claim_session("free", "proxy-1", "user:bob"))
    store.wait(store.store.release_session("free", free))  # nothing stored: the claim and its owner are forgotten
    assert store.wait(store.store.claim_session("free", "proxy-2", "user:carol")) > free


def test_a_claim_by_another_holder_tells_the_old_one(local):
    """LocalStore raises the takeover event (client id, old holder, new epoch) for the RPC to carry."""
    heard = []
    local.store.add_claim_listener(lambda *event: heard.append(event))
    _claim(local, "c1", "proxy-1")
    _claim(local, "c1", "proxy-1")  # the same holder again: no takeover
    epoch = _claim(local, "c1", "proxy-2")
    assert heard == [("c1", "proxy-1", epoch)]


def test_claims_survive_a_restart(tmp_path):
    """The claim is durable: after the parts reopen, the old holder's epoch is still fenced."""
    from tests.contract.conftest import _harness
    gen = _harness(str(tmp_path), "local")
    h = next(gen)
    old = _claim(h, "c1", "proxy-1")
    new = _claim(h, "c1", "proxy-2")
    next(gen, None)
    gen = _harness(str(tmp_path), "local")
    h = next(gen)
    assert isinstance(h.error(h.store.put_session(api.SessionMeta("c1", 60, 5, None), old)), api.Fenced)
    h.wait(h.store.put_session(api.SessionMeta("c1", 60, 5, None), new))
    next(gen, None)


def test_share_positions_round_trip(store):
    """A shared group's committed position comes back; none committed reads as no positions."""
    start = subscribe(store, "sh/#")
    assert store.wait(store.store.get_share_positions("g", "sh/#")) == ()
    store.wait(store.store.put_share_position("g", "sh/#", start.next()))
    assert store.wait(store.store.get_share_positions("g", "sh/#")) == (start.next(),)
    foreign = api.QueuePosition(start.queue, "elsewhere", 0)
    assert isinstance(store.error(store.store.put_share_position("g", "sh/#", foreign)), api.WrongGroup)


# -- retained messages -------------------------------------------------------------------------------------

def test_retained_put_get_and_delete(store):
    """Retained messages are found by exact topic and by wildcard filter; a delete clears one topic."""
    for topic in ("home/1/t", "home/2/t", "$SYS/x"):
        assert store.wait(store.store.put_retained(publish(topic, topic.encode(), retain=True))).ok
    got = store.wait(store.store.get_retained("home/+/t"))
    assert [(m.topic, m.record.body, m.record.retain) for m in got] == [
        ("home/1/t", b"home/1/t", True), ("home/2/t", b"home/2/t", True)]
    assert [m.topic for m in store.wait(store.store.get_retained("#"))] == ["home/1/t", "home/2/t"]  # MQTT-4.7.2-1
    assert store.wait(store.store.delete_retained("home/1/t")).ok
    assert [m.topic for m in store.wait(store.store.get_retained("home/#"))] == ["home/2/t"]
    assert store.wait(store.store.get_retained("nothing/here")) == ()


def test_retained_errors(store):
    """No retain flag, no payload or an invalid filter: InvalidArgument; past the retained limit: QuotaExceeded."""
    assert isinstance(store.error(store.store.put_retained(publish("t", b"x"))), api.InvalidArgument)
    assert isinstance(store.error(store.store.put_retained(publish("t", b"", retain=True))), api.InvalidArgument)
    assert isinstance(store.error(store.store.get_retained("a/#/b")), api.InvalidArgument)
    for i in range(RETAINED_LIMIT):
        assert store.wait(store.store.put_retained(publish("q/%d" % i, b"x", retain=True))).ok
    err = store.error(store.store.put_retained(publish("q/new", b"x", retain=True)))
    assert isinstance(err, api.QuotaExceeded) and "q/new" in str(err)
    assert store.wait(store.store.put_retained(publish("q/0", b"replaced", retain=True))).ok  # a replacement fits


# -- timers ---------------------------------------------------------------------------------------------------

def test_timer_delivers_at_its_time(store):
    """A scheduled message is not in its queues before its time and is after it."""
    start = subscribe(store, "later/#")
    result = store.wait(store.store.schedule_timer(publish("later/x", b"hi"), store.now_ms() + 1500))
    assert result.ok and result.offset >= 0
    store.run_for(1.2)
    assert read_all(store, start) == []
    store.run_for(0.6)
    assert read_all(store, start) == [b"hi"]


def test_timer_cancel(store):
    """Cancelling before the time answers True and nothing comes; after delivery it answers False."""
    start = subscribe(store, "later/#")
    gone = store.wait(store.store.schedule_timer(publish("later/gone", b"no"), store.now_ms() + 1000))
    kept = store.wait(store.store.schedule_timer(publish("later/kept", b"yes"), store.now_ms() + 1000))
    assert store.wait(store.store.cancel_timer(gone.offset)) is True
    store.run_for(1.5)
    assert read_all(store, start) == [b"yes"]
    assert store.wait(store.store.cancel_timer(kept.offset)) is False


def test_timer_errors(store):
    """Cancelling what is no timer fails with NotFound; a TIMER-kind message cannot be scheduled."""
    plain = store.wait(store.store.append(publish("t/x", b"plain")))
    assert isinstance(store.error(store.store.cancel_timer(plain.offset)), api.NotFound)
    assert isinstance(store.error(store.store.cancel_timer(10**12)), api.NotFound)
    bad = store.wait(store.store.schedule_timer(Message("t", b"", RecordKind.TIMER), store.now_ms()))
    assert bad.status is api.AppendStatus.MESSAGE_ILLEGAL


# -- native queues (one door: native_request, the client's JSON object whole) ---------------------------------

def native(store, **request) -> dict:
    """One native request through the interface; its reply object."""
    return store.wait(store.store.native_request(request))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_native_produce_consume_confirm(store):
    """An at-least-once message is handed out once, comes back after retry unless confirmed, then is gone."""
    produced = native(store, action="produce", queue="jobs", data=b64(b"\x00\xffjob"), encoding="base64", retry=2)
    msg_id = produced["msg_id"]
    d = native(store, action="consume", queue="jobs", encoding="base64")
    assert (d["msg_id"], base64.b64decode(d["data"]), d.get("attempts", 1)) == (msg_id, b"\x00\xffjob", 1)
    assert "data" not in native(store, action="consume", queue="jobs")  # in flight: invisible
    store.run_for(2.1)
    again = native(store, action="consume", queue="jobs")
    assert (again["msg_id"], again["attempts"]) == (msg_id, 2)
    assert native(store, action="confirm", queue="jobs", msg_id=msg_id)["code"] == 0
    store.run_for(3)
    assert "data" not in native(store, action="consume", queue="jobs")


def test_native_batch_and_delayed_produce(store):
    """A batch answers one id per item in order; a delayed item is consumable only after its delay."""
    produced = native(store, action="produce", queue="jobs", batch=["a", "b", {"data": "late", "delay": 1}])
    assert produced["code"] == 0 and len(produced["msg_ids"]) == 3 and all(i is not None for i in produced["msg_ids"])
    assert [native(store, action="consume", queue="jobs")["data"] for _ in range(2)] == ["a", "b"]
    assert "data" not in native(store, action="consume", queue="jobs")
    store.run_for(1.2)
    late = native(store, action="consume", queue="jobs")
    assert (late["data"], late["msg_id"]) == ("late", produced["msg_ids"][2])


def test_native_topic_consume_reads_mqtt_publishes(store):
    """Consuming a topic reads MQTT publishes of its first level, with their topic, qos and publisher."""
    appended = store.wait(store.store.append(publish("sensors/7/t", b"7", qos=1, client_id="dev7")))
    d = native(store, action="consume", topic="sensors")
    assert (d["msg_id"], d["data"], d["msg_topic"], d["qos"], d["client_id"]) == \
        (appended.offset, "7", "sensors/7/t", 1, "dev7")
    produced = native(store, action="produce", topic="sensors/8/cmd", data="on", qos=0)
    d2 = native(store, action="consume", topic="sensors")
    assert (d2["msg_id"], d2["msg_topic"], d2["qos"]) == (produced["msg_id"], "sensors/8/cmd", 0)


def test_native_errors(store):
    """A malformed request or one the engine refuses is answered code -1 with a reason, never failed."""
    for bad in ({"action": "consume", "queue": "q", "topic": "t"}, {"action": "produce", "queue": "a,b", "data": "x"},
                {"action": "produce", "queue": "jobs", "data": "x", "delay": 5, "ttl": 5}, {"action": "fly"}):
        reply = native(store, **bad)
        assert reply["code"] == -1 and reply["reason"], bad
    refused = native(store, action="confirm", queue="jobs", msg_id=424242)
    assert refused["code"] == -1 and "not in flight" in refused["reason"]
    assert isinstance(store.error(store.store.native_request(["not", "an", "object"])), api.InvalidArgument)


def test_pop_ack_and_change_invisible_time(store):
    """A popped message is invisible for its time, comes back when moved earlier, and is gone once acked."""
    msg_id = native(store, action="produce", queue="jobs", data="p")["msg_id"]
    d = native(store, action="pop", queue="jobs", group="workers", invisible_time=30)
    assert (d["msg_id"], d["data"]) == (msg_id, "p")
    assert "data" not in native(store, action="pop", queue="jobs", group="workers", invisible_time=30)
    moved = native(store, action="change_invisible_time", queue="jobs", group="workers", msg_id=msg_id,
                   invisible_time=1)
    assert moved["visible_at"] == store.now_ms() + 1000
    store.run_for(1.1)
    again = native(store, action="pop", queue="jobs", group="workers")
    assert (again["msg_id"], again["attempts"]) == (msg_id, 2)
    assert native(store, action="ack", queue="jobs", group="workers", msg_id=msg_id)["code"] == 0
    store.run_for(31)
    assert "data" not in native(store, action="pop", queue="jobs", group="workers")


def test_pop_errors(store):
    """Acking twice, or moving the invisible time of what is not in flight, is refused; a zero invisible time too."""
    msg_id = native(store, action="produce", queue="jobs", data="p")["msg_id"]
    native(store, action="pop", queue="jobs", group="workers")
    native(store, action="ack", queue="jobs", group="workers", msg_id=msg_id)
    assert native(store, action="ack", queue="jobs", group="workers", msg_id=msg_id)["code"] == -1
    assert native(store, action="change_invisible_time", queue="jobs", group="workers", msg_id=msg_id,
                  invisible_time=5)["code"] == -1
    assert native(store, action="pop", queue="jobs", group="workers", invisible_time=0)["code"] == -1
