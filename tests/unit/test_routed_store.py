"""RoutedStore: one store interface over two real broker groups (LocalStores on one task.Clock)."""

from __future__ import annotations

import pytest
from twisted.internet import task

from cluster.local.store import LocalStore
from cluster.remote.routed_store import RoutedStore
from cluster.routing import SlotTable
from store import api
from store.reader import iter_records
from store.record import Message, RecordKind
from store.session_store import SessionStore
from tests.contract.conftest import T0, Harness, Parts


@pytest.fixture
def cluster(tmp_path):
    """Groups g1 and g2 (real stores in tmp dirs) behind a RoutedStore."""
    clock = task.Clock()
    clock.advance(T0)
    parts = {g: Parts(str(tmp_path / g), clock) for g in ("g1", "g2")}
    locals_ = {g: LocalStore(p.store, p.notifier, p.retained, p.timers, SessionStore(p.kv), p.engine, group=g)
               for g, p in parts.items()}
    table = SlotTable.build(("g1", "g2"))
    routed = RoutedStore(table, locals_)
    harness = Harness(routed, clock, None)
    harness.table, harness.parts_by_group = table, parts
    yield harness
    for p in parts.values():
        p.close(clock)


def _levels(table, n=16):
    """First levels that hash to each group (16 in all, both groups used)."""
    levels = [f"t{i}" for i in range(n)]
    assert {table.group_of_topic(level) for level in levels} == {"g1", "g2"}
    return levels


def _topics_in_log(parts) -> set[str]:
    return {r.topic for r in iter_records(parts.store.commit_log.directory) if r.kind is RecordKind.MQTT_PUBLISH}


def test_each_group_log_holds_only_the_topics_its_slots_own(cluster):
    """Appends route by first level: a group's commit log holds no topic another group owns."""
    levels = _levels(cluster.table)
    results = cluster.wait(cluster.store.append_batch(tuple(Message(f"{lv}/chk/x", b"m", qos=1) for lv in levels)))
    assert all(r.ok for r in results) and len(results) == len(levels)
    for group, parts in cluster.parts_by_group.items():
        got = {t.partition("/")[0] for t in _topics_in_log(parts)}
        assert got == {lv for lv in levels if cluster.table.group_of_topic(lv) == group}


def test_a_wildcard_filter_reads_every_group_with_its_own_position(cluster):
    """'+/chk/#' is indexed in both groups; reading each group's position yields every message once."""
    store = cluster.store
    queue = cluster.wait(store.add_filter("+/chk/#"))
    starts = cluster.wait(store.end_positions(queue))
    assert {p.group for p in starts} == {"g1", "g2"}
    levels = _levels(cluster.table)
    for lv in levels:
        assert cluster.wait(store.append(Message(f"{lv}/chk/1", lv.encode(), qos=1))).ok
    got = []
    for position in starts:
        result = cluster.wait(store.read_queue(position, 100))
        got += [m.record.body.decode() for m in result.messages]
        assert all(m.position.group == position.group for m in result.messages)
    assert sorted(got) == sorted(levels)


def test_notify_comes_only_from_groups_that_hold_news(cluster):
    """A watch on a spanning filter's queue fires once per group with news, merged per tick."""
    store = cluster.store
    queue = cluster.wait(store.add_filter("+/chk/#"))
    events = []
    watch = cluster.wait(store.watch_queue(queue, events.append))
    levels = _levels(cluster.table)
    in_g1 = [lv for lv in levels if cluster.table.group_of_topic(lv) == "g1"]
    in_g2 = [lv for lv in levels if cluster.table.group_of_topic(lv) == "g2"]
    # Five appends in one tick, all in g1: one event (merged), none from g2.
    cluster.wait(store.append_batch(tuple(Message(f"{in_g1[0]}/chk/{i}", b"x") for i in range(5))))
    cluster.clock.advance(0.1)
    assert events == [queue]
    # News in both groups in one tick: one event from each.
    del events[:]
    cluster.wait(store.append_batch((Message(f"{in_g1[0]}/chk/a", b"x"), Message(f"{in_g2[0]}/chk/b", b"x"))))
    cluster.clock.advance(0.1)
    assert events == [queue, queue]
    cluster.wait(store.unwatch_queue(watch))
    assert isinstance(cluster.error(store.unwatch_queue(watch)), api.NotFound)


def test_session_state_lives_in_the_client_ids_group(cluster):
    """A session put through the facade is stored in its client id's group only."""
    store = cluster.store
    cid = "device-42"
    home = cluster.table.group_of_client(cid)
    epoch = cluster.wait(store.claim_session(cid, "proxy-1"))
    cluster.wait(store.put_session(api.SessionMeta(cid, 3600, 5), epoch))
    cluster.wait(store.put_inbound_qos2(cid, 7, epoch))
    state = cluster.wait(store.get_session(cid))
    assert state.meta.client_id == cid and state.epoch == epoch and state.inbound_qos2 == {7}
    other = "g1" if home == "g2" else "g2"
    assert SessionStore(cluster.parts_by_group[home].kv).load(cid).inbound_qos2 == {7}
    assert not SessionStore(cluster.parts_by_group[other].kv).load(cid).inbound_qos2
    assert [s.meta.client_id for s in cluster.wait(store.list_sessions())] == [cid]


class _Reads:
    """A group's store that counts the sessions read from it (everything else goes to the real one)."""

    def __init__(self, inner) -> None:
        self.inner, self.reads = inner, []

    def get_session(self, client_id):
        self.reads.append(client_id)
        return self.inner.get_session(client_id)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_client_with_nothing_in_its_home_group_is_read_there_only(cluster):
    """A CONNECT's read of a new client id asks its home group alone; a stored session is merged from every group."""
    cid = "fresh-7"
    home = cluster.table.group_of_client(cid)
    other = "g1" if home == "g2" else "g2"
    counted = _Reads(cluster.store.groups[other])
    routed = RoutedStore(cluster.table, {home: cluster.store.groups[home], other: counted})
    cluster.wait(routed.claim_session(cid, "proxy-1"))
    assert cluster.wait(routed.get_session(cid)) is None and counted.reads == []
    epoch = cluster.wait(routed.claim_session(cid, "proxy-1"))
    cluster.wait(routed.put_session(api.SessionMeta(cid, 3600, 5), epoch))
    assert cluster.wait(routed.get_session(cid)).meta.client_id == cid and counted.reads == [cid]


def _subscribed(cluster, cid, topic_filter, holder="proxy-1"):
    store = cluster.store
    epoch = cluster.wait(store.claim_session(cid, holder))
    cluster.wait(store.put_session(api.SessionMeta(cid, 3600, 5), epoch))
    queue = cluster.wait(store.add_filter(topic_filter))
    positions = cluster.wait(store.end_positions(queue))
    cluster.wait(store.put_subscription(cid, api.SubscriptionState(topic_filter, 1, positions), epoch))
    return epoch, positions


def test_a_spanning_subscription_is_kept_by_every_group_it_reads(cluster):
    """'+/chk/#' is stored in both groups with each group's own position; get_session merges them back."""
    epoch, positions = _subscribed(cluster, "sub-1", "+/chk/#")
    for group, parts in cluster.parts_by_group.items():
        stored = SessionStore(parts.kv).load("sub-1")
        assert list(stored.subscriptions) == ["+/chk/#"]
    (sub,) = cluster.wait(cluster.store.get_session("sub-1")).subscriptions
    assert sorted(p.group for p in sub.positions) == ["g1", "g2"] and set(sub.positions) == set(positions)


def test_outbound_goes_to_its_positions_group_and_its_ack_finds_it(cluster):
    """An outbound message is kept in the group its position names; deleting it needs no group."""
    epoch, positions = _subscribed(cluster, "sub-2", "+/chk/#")
    p2 = [p for p in positions if p.group == "g2"][0]
    cluster.wait(cluster.store.put_outbound("sub-2", api.OutboundState(3, "+/chk/#", p2, 1), epoch))
    assert 3 in SessionStore(cluster.parts_by_group["g2"].kv).load("sub-2").outbound
    assert [o.packet_id for o in cluster.wait(cluster.store.get_session("sub-2")).outbound] == [3]
    cluster.wait(cluster.store.delete_outbound("sub-2", 3, epoch))
    assert not SessionStore(cluster.parts_by_group["g2"].kv).load("sub-2").outbound


def test_a_takeover_fences_the_old_holder_in_every_group(cluster):
    """After another proxy claims the session, the old holder's writes fail with Fenced in each group."""
    old_epoch, positions = _subscribed(cluster, "sub-3", "+/chk/#", holder="proxy-1")
    from cluster.remote.routed_store import RoutedStore
    other_proxy = RoutedStore(cluster.table, cluster.store.groups)
    cluster.wait(other_proxy.claim_session("sub-3", "proxy-2"))
    for p in positions:
        err = cluster.error(cluster.store.put_outbound("sub-3", api.OutboundState(9, "+/chk/#", p, 1), old_epoch))
        assert isinstance(err, api.Fenced), p.group


class _Calls:
    """A group's store that records every call made to it (each goes on to the real one)."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)
        return call


def _split(cluster, cid):
    home = cluster.table.group_of_client(cid)
    other = "g1" if home == "g2" else "g2"
    counted = _Calls(cluster.store.groups[other])
    return home, other, counted, RoutedStore(cluster.table, {home: cluster.store.groups[home], other: counted})


def test_a_fresh_client_id_costs_its_other_group_nothing_until_its_first_write_there(cluster):
    """CONNECT to release of a fresh id calls its home group only; a write spanning the other group claims it
    there first, and the release lets both claims go."""
    cid = "fresh-9"
    home, other, counted, routed = _split(cluster, cid)
    claimed = cluster.wait(routed.claim_and_get(cid, "proxy-1"))
    assert claimed.session is None and claimed.taken_from == "" and counted.calls == []
    cluster.wait(routed.release_session(cid, claimed.epoch))
    assert counted.calls == [] and cluster.store.groups[home].claims == 0
    epoch = cluster.wait(routed.claim_session(cid, "proxy-1"))
    cluster.wait(routed.put_session(api.SessionMeta(cid, 3600, 5), epoch))
    assert counted.calls == ["claim_session", "put_session"]
    queue = cluster.wait(routed.add_filter("+/fresh/#"))
    positions = cluster.wait(routed.end_positions(queue))
    cluster.wait(routed.put_subscription(cid, api.SubscriptionState("+/fresh/#", 1, positions), epoch))
    assert counted.calls.count("claim_session") == 1  # claimed once, at the first write
    (sub,) = cluster.wait(routed.get_session(cid)).subscriptions
    assert sorted(p.group for p in sub.positions) == ["g1", "g2"]
    cluster.wait(routed.delete_session(cid, epoch))
    cluster.wait(routed.release_session(cid, epoch))
    assert [cluster.store.groups[g].claims for g in (home, other)] == [0, 0]


def test_a_held_id_is_claimed_everywhere_at_once_and_its_parts_come_with_the_claims(cluster):
    """A second proxy's claim of a stored session fences the first in both groups and reads each group's part
    in its claim's answer, with no separate read."""
    old_epoch, positions = _subscribed(cluster, "held-1", "+/chk/#", holder="proxy-1")
    home, other, counted, routed = _split(cluster, "held-1")
    claimed = cluster.wait(routed.claim_and_get("held-1", "proxy-2"))
    assert claimed.taken_from == "proxy-1" and counted.calls == ["claim_and_get"]
    (sub,) = claimed.session.subscriptions
    assert set(sub.positions) == set(positions)
    for p in positions:
        err = cluster.error(cluster.store.put_outbound("held-1", api.OutboundState(9, "+/chk/#", p, 1), old_epoch))
        assert isinstance(err, api.Fenced), p.group


def test_a_fresh_ids_old_holder_is_fenced_where_it_wrote_when_another_proxy_claims_it(cluster):
    """proxy-1 holds a fresh id that wrote only in its other group; proxy-2's claim finds it held and claims every
    group, so proxy-1's next write there is Fenced."""
    cid = "fresh-11"
    home, other, _counted, _ = _split(cluster, cid)
    first = cluster.store
    epoch = cluster.wait(first.claim_session(cid, "proxy-1"))
    topic = next(f"t{i}/w" for i in range(64) if cluster.table.group_of_topic(f"t{i}/w") == other)
    will = api.WillState(Message(topic, b"bye"))
    cluster.wait(first.put_will(cid, will, epoch))
    assert cluster.store.groups[other].claims == 1
    second = RoutedStore(cluster.table, cluster.store.groups)
    assert cluster.wait(second.claim_and_get(cid, "proxy-2")).taken_from == "proxy-1"
    assert isinstance(cluster.error(first.put_will(cid, will, epoch)), api.Fenced)


class _SlowClaims:
    """A group's store whose claims answer one second late."""

    def __init__(self, inner, clock) -> None:
        self.inner, self.clock = inner, clock

    def claim_session(self, *args):
        return task.deferLater(self.clock, 1.0, lambda: None).addCallback(
            lambda _: self.inner.claim_session(*args))

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_first_write_claim_that_lands_after_the_release_is_let_go_and_its_write_fenced(cluster):
    """The session is released while its claim of the other group is on its way: that claim is released when it
    lands and the write that waited for it fails Fenced, so no claim or state is left there."""
    cid = "fresh-12"
    home = cluster.table.group_of_client(cid)
    other = "g1" if home == "g2" else "g2"
    routed = RoutedStore(cluster.table, {home: cluster.store.groups[home],
                                         other: _SlowClaims(cluster.store.groups[other], cluster.clock)})
    epoch = cluster.wait(routed.claim_session(cid, "proxy-1"))
    out = []
    routed.put_session(api.SessionMeta(cid, 3600, 5), epoch).addBoth(out.append)
    routed.release_session(cid, epoch)
    cluster.clock.advance(1.0)
    assert len(out) == 1 and out[0].check(api.Fenced)
    assert cluster.store.groups[other].claims == 0
    assert SessionStore(cluster.parts_by_group[other].kv).load(cid) is None


def test_retained_messages_merge_across_groups(cluster):
    """Retained messages of a spanning filter come from every group, in topic order."""
    store = cluster.store
    levels = _levels(cluster.table)
    g1 = [lv for lv in levels if cluster.table.group_of_topic(lv) == "g1"][:2]
    g2 = [lv for lv in levels if cluster.table.group_of_topic(lv) == "g2"][:2]
    levels = g1 + g2  # the harness allows 3 retained messages per group
    for lv in levels:
        assert cluster.wait(store.put_retained(Message(f"{lv}/chk/r", b"r", qos=1, retain=True))).ok
    got = cluster.wait(store.get_retained("+/chk/#"))
    assert [m.topic for m in got] == sorted(f"{lv}/chk/r" for lv in levels)


def test_native_queue_lives_in_its_names_group(cluster):
    """A native produce and consume go to the group of the queue's name."""
    store = cluster.store
    produced = cluster.wait(store.native_request({"action": "produce", "queue": "jobs", "data": "job-1"}))
    assert produced["code"] == 0 and produced["msg_id"] is not None
    home = cluster.table.group_of_queue("jobs")
    other = next(g for g in cluster.parts_by_group if g != home)
    listed = {g: cluster.wait(cluster.store.groups[g].native_request({"action": "queue_list"})) for g in (home, other)}
    assert "jobs" in str(listed[home]["queues"]) and "jobs" not in str(listed[other]["queues"])
    delivery = cluster.wait(store.native_request({"action": "consume", "queue": "jobs"}))
    assert delivery["data"] == "job-1"


def test_a_position_of_an_unknown_group_is_wrong_group(cluster):
    """Reading a position whose group the table does not know fails with WrongGroup."""
    err = cluster.error(cluster.store.read_queue(api.QueuePosition("%LMQ%a", "g9", 0), 10))
    assert isinstance(err, api.WrongGroup)


def _queues_in(table, group, n=2):
    """``n`` native queue names that hash to ``group``."""
    out = [f"q{i}" for i in range(200) if table.group_of_queue(f"q{i}") == group][:n]
    assert len(out) == n
    return out


def test_native_msg_ids_of_two_groups_never_collide(cluster):
    """The first produce in each group is at offset 0 of its log; the ids the clients see still differ, and
    group g1's (number 0) are its plain offsets."""
    store = cluster.store
    ids = {}
    for group in ("g1", "g2"):
        for queue in _queues_in(cluster.table, group):
            reply = cluster.wait(store.native_request({"action": "produce", "queue": queue, "data": queue}))
            assert reply["code"] == 0, reply
            ids[queue] = (group, reply["msg_id"])
    assert len({i for _, i in ids.values()}) == len(ids)
    raw = {q: cluster.wait(store.groups[g].native_request({"action": "monitor", "queue": q}))["max_id"]
           for q, (g, _) in ids.items()}
    assert {q: i for q, (g, i) in ids.items() if g == "g1"} == {q: raw[q] for q, (g, _) in ids.items() if g == "g1"}
    assert all(i != raw[q] for q, (g, i) in ids.items() if g == "g2")


def test_confirm_and_cancel_by_msg_id_reach_the_group_that_made_it(cluster):
    """A consume's msg_id confirmed through the routed store leaves that group's in-flight set; a delayed
    produce's msg_id cancels its timer in its group (not found in the other)."""
    store = cluster.store
    for group in ("g1", "g2"):
        queue = _queues_in(cluster.table, group, 1)[0]
        assert cluster.wait(store.native_request({"action": "produce", "queue": queue, "data": "x", "retry": 30}))["code"] == 0
        got = cluster.wait(store.native_request({"action": "consume", "queue": queue}))
        assert got["data"] == "x"
        done = cluster.wait(store.native_request({"action": "confirm", "queue": queue, "msg_id": got["msg_id"]}))
        assert done == {**done, "code": 0, "msg_id": got["msg_id"]}, done
        again = cluster.wait(store.native_request({"action": "confirm", "queue": queue, "msg_id": got["msg_id"]}))
        assert again["code"] == -1  # already confirmed: it was the right group's in-flight entry
        delayed = cluster.wait(store.native_request({"action": "produce", "queue": queue, "data": "d", "delay": 60}))
        cancelled = cluster.wait(store.native_request({"action": "cancel_timer", "msg_id": delayed["msg_id"]}))
        assert cancelled["code"] == 0 and cancelled["cancelled"] is True and cancelled["msg_id"] == delayed["msg_id"]


def test_a_delayed_publish_through_the_routed_store_answers_a_result_whose_id_cancels_it(cluster):
    """schedule_timer (an MQTT $delayed/ publish) in each group answers an AppendResult whose offset is the
    msg_id; cancelling by it reaches the timer in its group."""
    for level in _levels(cluster.table)[:4]:
        result = cluster.wait(cluster.store.schedule_timer(Message(f"{level}/later", b"d", qos=1),
                                                           cluster.now_ms() + 60_000))
        assert result.status is api.AppendStatus.PUT_OK and result.offset >= 0, result
        assert cluster.wait(cluster.store.cancel_timer(result.offset)) is True


def test_a_msg_id_of_no_known_group_is_a_clear_error(cluster):
    """An id whose group number no group has is answered code -1 naming it, not sent to a guessed group."""
    reply = cluster.wait(cluster.store.native_request({"action": "cancel_timer", "msg_id": 77 << 48 | 5}))
    assert reply["code"] == -1 and "names no broker group" in reply["reason"]


def test_group_numbers_pin_and_fill_in_name_order():
    """Pinned numbers are kept; the other groups take the lowest free ones in name order; 0's ids are offsets."""
    from cluster.remote import msg_ids
    assert msg_ids.numbering(("g2", "g1", "g10")) == {"g1": 0, "g10": 1, "g2": 2}
    assert msg_ids.numbering(("g2", "g1", "g10"), {"g10": 2}) == {"g10": 2, "g1": 0, "g2": 1}
    assert msg_ids.pack(0, 752) == 752 and msg_ids.unpack(msg_ids.pack(3, 752)) == (3, 752)
    with pytest.raises(ValueError):
        msg_ids.numbering(("g1", "g2"), {"g1": 1, "g2": 1})


def virtual_names(table) -> tuple[str, tuple[str, str]]:
    """A virtual queue name and two real queues: one in the other group than the virtual's, one in its own."""
    names = [f"q{i}" for i in range(64)]
    vq = names[0]
    home = table.group_of_queue(vq)
    other = next(n for n in names[1:] if table.group_of_queue(n) != home)
    same = next(n for n in names[1:] if table.group_of_queue(n) == home)
    return vq, (other, same)


def test_a_virtual_queues_produce_reaches_real_queues_in_other_groups(cluster):
    """A produce to a virtual queue whose real queues hash to other groups than its name goes to each real
    queue's group, so a consume of every real queue (routed by its own name) finds the message."""
    vq, targets = virtual_names(cluster.table)
    routed = RoutedStore(cluster.table, cluster.store.groups, virtual_queues={vq: list(targets)})
    reply = cluster.wait(routed.native_request({"action": "produce", "queue": vq, "data": "job", "seq": 7}))
    assert reply["code"] == 0 and reply["queue"] == vq and reply["seq"] == 7 and isinstance(reply["msg_id"], int)
    for t in targets:
        got = cluster.wait(routed.native_request({"action": "consume", "queue": t}))
        assert got["code"] == 0 and got["data"] == "job", (t, got)
    batch = cluster.wait(routed.native_request({"action": 1, "queue": vq, "batch": ["a", "b"]}))
    assert batch["code"] == 0 and batch["count"] == 2
    for t in targets:
        got = [cluster.wait(routed.native_request({"action": "consume", "queue": t})).get("data") for _ in range(3)]
        assert got == ["a", "b", None], (t, got)
