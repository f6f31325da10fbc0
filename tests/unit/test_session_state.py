"""SessionState driven by events alone: no reactor, no store, no sockets; each case cites its MQTT 5 clause."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from mqtt_proxy.codec import Properties, ReasonCode, Will
from mqtt_proxy.codec.properties import decode_properties
from mqtt_proxy.codec.wire import PacketType
from mqtt_proxy.session_state import (NEVER_EXPIRES, DeleteInboundQos2, DeleteOutbound, DeleteReleased,
                                      GroupAcked, PeerError, PublishWill, PumpSoon, Resend, SaveInboundQos2,
                                      SaveOutbound, SaveReleased, ScheduleWill, SendPubRec, SendPubRel, SessionState,
                                      SessionStateError, SubOptions)


@dataclass
class Sub:
    """A subscription as a test names it: its key and the options it is made with."""

    key: str
    qos: int = 2
    no_local: bool = False
    retain_as_published: bool = False

    def options(self) -> SubOptions:
        return SubOptions(self.qos, self.no_local, self.retain_as_published)


def reoptioned(state: SessionState, key: str, qos: int = 1, no_local: bool = False,
               retain_as_published: bool = False) -> str:
    """Subscription ``key`` given these options through the event production feeds (a repeated SUBSCRIBE)."""
    state.resubscribed(key, qos, no_local, retain_as_published, 0)
    return key


@dataclass
class Rec:
    """The fields of a stored record the state machine reads."""

    qos: int = 1
    client_id: str = "publisher"
    properties: dict = field(default_factory=dict)
    retain: bool = False
    topic: str = "t/1"


@dataclass
class Msg:
    """A queue message as read: its position (opaque to the state machine, ints here) and its record."""

    position: int
    record: Rec


def read(*records: Rec, first: int = 10) -> list[Msg]:
    return [Msg(first + i, r) for i, r in enumerate(records)]


def connected(expiry: int = 0, max_inflight: int = 100, receive_maximum: int = 65535, will=None,
              max_packet_size: int = 0, alias_maximum: int = 0) -> tuple[SessionState, Sub]:
    """A session through the events production feeds it: CONNECT accepted, a QoS 2 subscription, the link bound."""
    state = SessionState(5, expiry, max_inflight)
    state.connect_accepted(expiry, will, receive_maximum, max_packet_size, alias_maximum)
    sub = Sub("t/#")
    state.subscribed(sub.key, sub.options())
    state.attach(5)
    return state, sub


def offer(state: SessionState, sub: Sub, position: int, qos: int, group: str | None = None) -> tuple[int | None, list]:
    """One message at ``position`` read for ``sub`` and sent at ``qos``, through ``messages_read`` as production
    reads: its packet id (None at QoS 0) and what to persist."""
    d = state.messages_read(sub.key, [Msg(position, Rec(qos=qos))], position + 1, "me", NOW, group)
    ((_, _, pid, _),) = d.sends
    return pid, d.actions


def will(delay: int | None = None) -> Will:
    return Will("w/t", b"gone", 1, False, Properties(will_delay_interval=delay))


def test_qos1_gets_unused_packet_ids_and_waits_for_puback():
    """MQTT-4.3.2-1/-3: each new QoS 1 message gets an unused packet id and stays in flight until its PUBACK."""
    state, sub = connected()
    first, _ = offer(state, sub, 10, 1)
    second, _ = offer(state, sub, 11, 1)
    assert first != second
    assert set(state.outbound) == {first, second}
    assert sorted(state.owed(sub.key)) == [10, 11]
    assert state.puback(first) == [PumpSoon()]
    assert set(state.outbound) == {second}
    assert state.owed(sub.key) == [11]


def test_qos0_takes_no_packet_id():
    """MQTT-2.2.1-2: a QoS 0 PUBLISH carries no packet id and takes no place in the window."""
    state, sub = connected()
    assert offer(state, sub, 5, 0) == (None, [])
    assert state.outbound == {}


def test_puback_for_unknown_or_qos2_id_is_refused():
    """MQTT-4.3.2-3: only a PUBACK for a QoS 1 id in flight completes it; others are reported as unknown."""
    state, sub = connected()
    pid, _ = offer(state, sub, 1, 2)
    for unknown in (pid, pid + 1):
        with pytest.raises(PeerError):
            state.puback(unknown)
    assert pid in state.outbound


def test_persistent_qos1_is_persisted_and_deleted_on_puback():
    """MQTT-4.1.0-1: a persistent session keeps unacknowledged QoS 1 messages: saved when sent, deleted on PUBACK."""
    state, sub = connected(expiry=60)
    pid, actions = offer(state, sub, 7, 1)
    assert actions == [SaveOutbound(pid, "t/#", 7, 1)]
    assert state.puback(pid) == [DeleteOutbound(pid), PumpSoon()]


def test_a_run_of_pubacks_completes_each_and_pumps_once():
    """MQTT-4.3.2-5: a read's run of PUBACKs frees each QoS 1 id in flight (persisted ones deleted), passes over
    ids not in flight as QoS 1, as ``puback`` refuses them, and asks for one pump after them all."""
    state, sub = connected(expiry=60)
    first, _ = offer(state, sub, 1, 1)
    second, _ = offer(state, sub, 2, 1)
    qos2, _ = offer(state, sub, 3, 2)
    assert state.pubacks([first, qos2, 999, second]) == [DeleteOutbound(first), DeleteOutbound(second), PumpSoon()]
    assert set(state.outbound) == {qos2}
    assert state.pubacks([first, qos2]) == []  # nothing freed: no pump


def test_qos2_pubrec_sends_pubrel_and_pubcomp_completes():
    """MQTT-4.3.3-4/-5: PUBREC is answered with PUBREL, and the id stays in use until PUBCOMP."""
    state, sub = connected(expiry=60)
    pid, _ = offer(state, sub, 3, 2)
    with pytest.raises(PeerError):
        state.pubcomp(pid)  # PUBCOMP before PUBREC: not released yet
    assert state.pubrec(pid, failed=False) == [DeleteOutbound(pid), SaveReleased(pid), SendPubRel(pid)]
    assert state.owed(sub.key) == []  # the client has the message: its position is no longer owed
    assert state.window == 99  # ... but the packet id is still taken
    assert state.pubcomp(pid) == [DeleteReleased(pid), PumpSoon()]
    assert state.outbound == {}


def test_duplicate_pubrec_resends_pubrel_only():
    """MQTT-4.3.3-4: a repeated PUBREC gets PUBREL again without persisting anything twice."""
    state, sub = connected(expiry=60)
    pid, _ = offer(state, sub, 3, 2)
    state.pubrec(pid, failed=False)
    assert state.pubrec(pid, failed=False) == [SendPubRel(pid)]


def test_pubrec_with_error_code_frees_the_id():
    """MQTT-4.3.3-4 / 4.9: a PUBREC with a reason code of 0x80 or more ends the exchange; no PUBREL."""
    state, sub = connected(expiry=60)
    pid, _ = offer(state, sub, 3, 2)
    assert state.pubrec(pid, failed=True) == [DeleteOutbound(pid), PumpSoon()]
    assert state.outbound == {} and state.owed(sub.key) == []


def test_receive_maximum_bounds_the_window():
    """MQTT-3.3.4-9: never more unacknowledged QoS 1/2 PUBLISHes than the client's Receive Maximum."""
    state, sub = connected(receive_maximum=2)
    offer(state, sub, 1, 1)
    pid, _ = offer(state, sub, 2, 2)
    assert state.window == 0
    state.pubrec(pid, failed=False)
    assert state.window == 0  # a released QoS 2 still counts until PUBCOMP
    state.pubcomp(pid)
    assert state.window == 1


def test_server_cap_bounds_the_window_below_receive_maximum():
    """MQTT-3.3.4-9: the window is the smaller of the client's Receive Maximum and the server's own cap."""
    state, _ = connected(max_inflight=3, receive_maximum=10)
    assert state.window == 3


def test_packet_ids_wrap_and_skip_ids_in_use():
    """MQTT-2.2.1-3: a new packet id is one not in use; ids wrap from 65535 back to 1."""
    state, sub = connected(max_inflight=70000)

    def acknowledged(count: int) -> None:  # the next ``count`` ids go out and come back
        for position in range(count):
            state.puback(offer(state, sub, position, 1)[0])

    acknowledged(65534)  # ids 1..65534: the next is 65535
    a, _ = offer(state, sub, 1, 1)
    b, _ = offer(state, sub, 2, 1)
    assert (a, b) == (65535, 1)
    acknowledged(65533)  # ids 2..65534: the next is 65535 again, and 65535 and 1 are still in flight
    c, _ = offer(state, sub, 3, 1)
    assert c == 2


def test_all_packet_ids_in_use_is_an_api_error():
    """MQTT-2.2.1-3: with all 65535 ids in flight no id can be given: the caller is told, not the peer."""
    state, sub = connected(max_inflight=70000)
    for offset in range(65535):
        offer(state, sub, offset, 1)
    # The window (at most the client's Receive Maximum, 65535) stops every event first: the guard is the
    # allocator's own.
    with pytest.raises(SessionStateError):
        state._allocate_pid()


def test_reconnect_resends_publish_and_pubrel_with_their_ids():
    """MQTT-4.4.0-1 / MQTT-4.3.3-6: on return, unacknowledged PUBLISHes are resent and released ids get PUBREL only."""
    state, sub = connected(expiry=60)
    p1, _ = offer(state, sub, 1, 1)
    p2, _ = offer(state, sub, 2, 2)
    state.pubrec(p2, failed=False)
    state.detach(publish_will=True)
    state.attach(5)
    assert state.resend_plan() == [Resend(p1, "t/#", 1), SendPubRel(p2)]


def test_takeover_keeps_in_flight_but_forgets_group_and_retained_sends():
    """MQTT-3.1.4-3 / MQTT-4.4.0-1: a taken-over session keeps its queue messages in flight; shared-group and
    retained sends of the old link are not resent by this session."""
    state, sub = connected(expiry=60)
    own, _ = offer(state, sub, 1, 1)
    offer(state, sub, 9, 1, group="g")
    state.retained_read(sub.key, Rec(qos=1))
    state.detach(publish_will=True)
    assert list(state.outbound) == [own]
    state.attach(5)
    assert state.resend_plan() == [Resend(own, "t/#", 1)]


def test_resend_of_unsubscribed_message_completes_it():
    """MQTT-4.4.0-1: a message whose subscription is gone is not resent; its packet id is freed."""
    state, sub = connected(expiry=60)
    pid, _ = offer(state, sub, 1, 1)
    state.unsubscribed(sub.key)
    assert state.resend_plan() == [DeleteOutbound(pid)]
    assert state.outbound == {}


def test_group_message_is_acked_to_the_group_at_pubcomp():
    """MQTT-4.3.3-5 / 4.8.2: a shared group's QoS 2 message counts as done at PUBCOMP."""
    state, sub = connected(expiry=60)
    pid, _ = offer(state, sub, 9, 2, group="g")
    assert state.pubrec(pid, failed=False) == [SendPubRel(pid)]
    assert state.pubcomp(pid) == [GroupAcked("g", 9), PumpSoon()]


def test_will_is_published_on_unexpected_close():
    """MQTT-3.1.2-8: the will is published when the connection closes without a normal DISCONNECT."""
    state, _ = connected(will=(w := will()))
    assert state.detach(publish_will=True) == [PublishWill(w)]
    assert state.will is None


def test_normal_disconnect_discards_the_will():
    """MQTT-3.1.2-10: after a DISCONNECT with reason 0x00 the will is removed, not published."""
    state, _ = connected(will=will())
    assert state.detach(publish_will=False) == []
    assert state.will is None


def test_will_delay_is_scheduled_and_capped_by_session_expiry():
    """MQTT-3.1.3-9 / 3.1.3.2.2: a delayed will waits its delay, but no longer than the session lives."""
    state, _ = connected(expiry=30, will=(w := will(delay=100)))
    assert state.detach(publish_will=True) == [ScheduleWill(w, 30)]
    assert state.pending_will is w


def test_will_delay_on_a_non_persistent_session_publishes_at_once():
    """MQTT-3.1.3-9 / 3.1.3.2.2: a session that ends with its connection sends its will at once."""
    state, _ = connected(expiry=0, will=(w := will(delay=100)))
    assert state.detach(publish_will=True) == [PublishWill(w)]


def test_return_before_will_delay_cancels_the_will():
    """MQTT-3.1.3-9: a new connection to the session before the delay passes means no will."""
    state, _ = connected(expiry=60, will=will(delay=10))
    state.detach(publish_will=True)
    state.attach(5)
    assert state.pending_will is None
    assert state.expired() == []


def test_session_expiry_publishes_a_pending_will_first():
    """3.1.3.2.2 / MQTT-3.1.2-23: when the session expires before the will delay, the will goes out then."""
    state, _ = connected(expiry=5, will=(w := will(delay=100)))
    state.detach(publish_will=True)
    assert state.expired() == [PublishWill(w)]
    assert state.expired() == []


def test_expiry_deadline():
    """MQTT-3.1.2-23 / 3.1.2.11.2: a session is kept Expiry Interval seconds after disconnect; 0xFFFFFFFF: forever."""
    state, _ = connected(expiry=30)
    assert state.expiry_deadline_ms(1_000) is None  # connected: no deadline
    state.detach(publish_will=False)
    assert state.expiry_deadline_ms(1_000) == 31_000
    state.attach(5)
    state.disconnect_received(NEVER_EXPIRES, NEVER_EXPIRES)  # the client's DISCONNECT asks for forever
    state.detach(publish_will=False)
    assert state.expiry_deadline_ms(1_000) is None


def test_disconnect_cannot_make_a_non_persistent_session_persistent():
    """MQTT-3.14.2-2: a Session Expiry Interval on DISCONNECT after 0 at CONNECT is the client's protocol error."""
    state, _ = connected(expiry=0)
    with pytest.raises(PeerError) as caught:
        state.disconnect_received(60, 3600)
    assert caught.value.reason_code == ReasonCode.PROTOCOL_ERROR and state.expiry == 0
    assert state.disconnect_received(None, 3600) == () and state.expiry == 0


def test_disconnect_expiry_replaces_the_connects_within_the_servers_cap():
    """3.14.2.2.2: DISCONNECT may change a persistent session's expiry; the server's maximum still bounds it."""
    state, _ = connected(expiry=60)
    state.disconnect_received(100_000, 3600)
    assert state.expiry == 3600
    state.disconnect_received(0, 3600)
    assert state.expiry == 0 and not state.persistent


def test_a_repeated_subscribe_replaces_the_options_and_keeps_what_is_owed():
    """MQTT-3.8.4-3: a SUBSCRIBE for an existing filter replaces its options; messages in flight stay owed, and the
    next read goes by the new maximum QoS."""
    state, sub = connected(expiry=60)
    offer(state, sub, 1, 1)
    state.resubscribed(sub.key, 0, False, True, 0)
    assert state.owed(sub.key) == [1]
    d = state.messages_read(sub.key, read(Rec(qos=1, retain=True)), 11, "me", NOW)
    assert [(qos, pid, retain) for _, qos, pid, retain in d.sends] == [(0, None, True)]


def test_a_restored_session_resends_what_it_had_in_flight():
    """MQTT-4.4.0-1 / MQTT-4.3.3-9: after a restart, stored in-flight messages go out again and received QoS 2 ids
    are still held (a resend is not stored twice)."""
    from store.api import OutboundState
    state = SessionState(5, 60, 100)
    state.subscribed("t/#", Sub("t/#").options())
    state.restored([OutboundState(4, "t/#", 40, 1)], [5], [9])
    state.attach(5)
    assert state.resend_plan() == [Resend(4, "t/#", 40), SendPubRel(5)]
    assert 9 in state.inbound_qos2 and state.window == 98


def test_an_ended_session_holds_nothing():
    """MQTT-3.1.2-4 / 4.1: a session that ends (clean start, expiry) keeps no subscription or message in flight."""
    state, sub = connected(expiry=60)
    offer(state, sub, 1, 1)
    state.ended()
    assert not state.subs and not state.outbound and state.resend_plan() == []


# -- inbound PUBLISH: flow control, the client's topic aliases, exactly once --------------------------------------

def test_inbound_past_receive_maximum_is_the_peers_error():
    """3.3.4 (0x93): a QoS 1/2 PUBLISH beyond the server's Receive Maximum unacknowledged is a protocol error; a
    stored one makes room again."""
    state, _ = connected()
    assert state.inbound_room(2) == 2
    for pid in (1, 2):
        assert state.publish_received(pid, 1, 2) == ()
        state.publish_accepted(1, None)
    with pytest.raises(PeerError) as caught:
        state.publish_received(3, 1, 2)
    assert caught.value.reason_code == ReasonCode.RECEIVE_MAXIMUM_EXCEEDED
    assert state.publish_stored(1, 1) == () and state.inbound_room(2) == 1
    state.publishes_accepted(1)  # the fast path's count of a read's plain QoS 1 PUBLISHes
    assert state.inbound_room(2) == 0


def test_inbound_qos2_is_held_until_pubrel_and_a_resend_is_not_stored_again():
    """MQTT-4.3.3-9/-10/-11: until PUBREL a resend of a stored QoS 2 id is answered with PUBREC only; a persistent
    session persists the id; after PUBREL (answered with PUBCOMP) the id is new again."""
    state, _ = connected(expiry=60)
    state.publish_received(7, 2, 10)
    state.publish_accepted(2, None)
    assert state.publish_stored(7, 2) == (SaveInboundQos2(7),)
    assert state.publish_received(7, 2, 10) == (SendPubRec(7),)
    assert state.pubrel_received(7) == (DeleteInboundQos2(7),)
    assert state.publish_received(7, 2, 10) == () and state.inbound_room(10) == 10


def test_pubrel_for_an_id_not_held_is_answered_with_0x92():
    """MQTT-4.3.3-10 / 3.7.2.1: a PUBREL for a packet id not held gets PUBCOMP with Packet Identifier Not Found."""
    state, _ = connected()
    with pytest.raises(PeerError) as caught:
        state.pubrel_received(5)
    assert caught.value.reason_code == ReasonCode.PACKET_IDENTIFIER_NOT_FOUND


def test_a_failed_store_frees_the_slot_and_the_qos2_hold():
    """MQTT-4.3.3-9: a QoS 2 id that could not be made durable is not held (never promise exactly once without it)."""
    state, _ = connected(expiry=60)
    state.publish_accepted(2, None)
    state.publish_stored(4, 2)
    state.publish_failed(4, 2)
    assert 4 not in state.inbound_qos2 and state.inbound_room(10) == 10


def test_the_clients_topic_aliases_and_flow_control_are_its_connections():
    """MQTT-3.3.2-12: the client's topic aliases hold for its connection only; a new one starts with none, and with
    nothing unacknowledged."""
    state, _ = connected(expiry=60)
    state.publish_accepted(1, (1, "a/b"))
    assert state.inbound_aliases == {1: "a/b"} and state.inbound_room(10) == 9
    state.detach(publish_will=False)
    state.attach(5)
    assert state.inbound_aliases is None and state.inbound_room(10) == 10


def test_topic_aliases_are_bounded_and_reset_per_connection():
    """MQTT-3.1.2-26 / MQTT-3.3.2-7: no alias above the client's Topic Alias Maximum; none carried to a new link."""
    state, _ = connected(alias_maximum=2)
    assert state.alias_for("a") == (1, False)
    assert state.alias_for("a") == (1, True)
    assert state.alias_for("b") == (2, False)
    assert state.alias_for("c") is None
    state.detach(publish_will=False)
    state.attach(5)
    assert state.alias_for("c") == (1, False)


def test_no_aliases_when_the_client_accepts_none():
    """MQTT-3.1.2-26: with Topic Alias Maximum 0 (or absent) the server sends no Topic Alias."""
    state, _ = connected()
    assert state.alias_for("a") is None


# -- the delivery pump's decisions: messages read at a position in, what to send and where to go on out ----------

NOW = 1_000_000


def test_read_messages_go_out_at_the_lower_qos_with_fresh_packet_ids():
    """MQTT-3.8.4-8 / MQTT-2.2.1-2/-3: each message goes at the lower of its QoS and the subscription's; QoS>0 gets
    an unused packet id, QoS 0 none; the position moves past the read."""
    state, _ = connected()
    sub = reoptioned(state, "t/#", qos=1)
    d = state.messages_read(sub, read(Rec(qos=0), Rec(qos=1), Rec(qos=2)), 13, "me", NOW)
    assert [(m.position, qos) for m, qos, _, _ in d.sends] == [(10, 0), (11, 1), (12, 1)]
    pids = [pid for _, _, pid, _ in d.sends]
    assert pids[0] is None and pids[1] != pids[2] and set(state.outbound) == set(pids[1:])
    assert d.position == 13 and not d.stopped and d.actions == [] and d.expired == 0


def test_read_stops_at_a_full_window_and_keeps_order():
    """MQTT-3.3.4-9 / MQTT-4.6.0-6: no more QoS 1 messages in flight than Receive Maximum; the first that does not
    fit, and every message after it (QoS 0 too), waits, and the next read starts there."""
    state, _ = connected(receive_maximum=2)
    d = state.messages_read("t/#", read(Rec(), Rec(), Rec(), Rec(qos=0)), 14, "me", NOW)
    assert [m.position for m, *_ in d.sends] == [10, 11]
    assert d.position == 12 and d.stopped and state.window == 0


def test_read_skips_the_subscribers_own_messages_with_no_local():
    """MQTT-3.8.3-3: with No Local set, a message is not sent back to the connection that published it."""
    state, _ = connected()
    sub = reoptioned(state, "t/#", no_local=True)
    d = state.messages_read(sub, read(Rec(client_id="me"), Rec(client_id="other")), 12, "me", NOW)
    assert [m.position for m, *_ in d.sends] == [11] and d.position == 12 and len(state.outbound) == 1


def test_read_skips_and_counts_expired_messages():
    """MQTT-3.3.2-5: a message whose Message Expiry Interval has passed is not delivered; it is counted."""
    from store.record import EXPIRES_AT
    state, _ = connected()
    old, fresh = Rec(properties={EXPIRES_AT: str(NOW - 1)}), Rec(properties={EXPIRES_AT: str(NOW + 5000)})
    d = state.messages_read("t/#", read(old, fresh), 12, "me", NOW)
    assert [m.position for m, *_ in d.sends] == [11] and d.expired == 1 and d.position == 12


def test_read_sets_retain_only_as_published_when_asked():
    """MQTT-3.3.1-12/-13: RETAIN is cleared on forwarded messages unless the subscription has Retain As Published."""
    state, _ = connected()
    cleared = state.messages_read("t/#", read(Rec(retain=True)), 11, "me", NOW)
    kept = state.messages_read(reoptioned(state, "t/#", retain_as_published=True), read(Rec(retain=True)), 11,
                               "me", NOW)
    assert cleared.sends[0][3] is False and kept.sends[0][3] is True


def test_read_in_a_persistent_session_persists_what_goes_in_flight():
    """MQTT-4.1.0-1 / MQTT-4.4.0-1: a persistent session saves each QoS 1/2 message it sends, to resend it later."""
    state, sub = connected(expiry=60)
    d = state.messages_read(reoptioned(state, sub.key), read(Rec(), Rec(qos=0)), 12, "me", NOW)
    (pid,) = [p for _, _, p, _ in d.sends if p is not None]
    assert d.actions == [SaveOutbound(pid, sub.key, 10, 1)]


def test_unsent_messages_free_their_ids_and_are_read_again():
    """MQTT-4.6.0-6 / MQTT-4.1.0-1: when the connection fills mid-read, what was not written keeps its order: the
    position goes back to it, its packet ids are free (a persisted one is deleted), expired ones are not counted."""
    from store.record import EXPIRES_AT
    state, sub = connected(expiry=60)
    gone = Rec(properties={EXPIRES_AT: str(NOW - 1)})
    d = state.messages_read(reoptioned(state, sub.key), read(Rec(), Rec(), gone, Rec()), 14, "me", NOW)
    pids = [p for _, _, p, _ in d.sends]
    d = state.unsent(d, 1)
    assert sorted(d.actions, key=lambda a: a.packet_id) == [DeleteOutbound(pids[1]), DeleteOutbound(pids[2])]
    assert list(state.outbound) == [pids[0]] and [m.position for m, *_ in d.sends] == [10]
    assert d.position == 11 and d.stopped and d.expired == 0


def test_publish_properties_carry_a_topic_alias_then_an_empty_topic():
    """3.3.2.3.4 / MQTT-3.3.2-7: the first PUBLISH on a topic names it and sets the alias; later ones send only the
    alias (an empty topic name)."""
    state, _ = connected(alias_maximum=5)
    form = state.publish_properties(Rec(topic="a/b"), 0, NOW)
    topic, block, assigned = form.topic, form.properties, form.assigned_alias
    props, _ = decode_properties(block, 0, len(block), PacketType.PUBLISH)
    assert (topic, assigned, props.topic_alias) == ("a/b", "a/b", 1)
    form = state.publish_properties(Rec(topic="a/b"), 0, NOW)
    topic, block, assigned = form.topic, form.properties, form.assigned_alias
    assert (topic, assigned) == ("", None)


def test_publish_properties_carry_remaining_expiry_and_subscription_id():
    """MQTT-3.3.2-6 / MQTT-3.3.4-3: the Message Expiry Interval sent is what remains; the Subscription Identifier goes
    along; with nothing to add, a v5 PUBLISH goes without properties, and a 3.1.1 one never has any."""
    from store.record import EXPIRES_AT
    state, _ = connected()
    form = state.publish_properties(Rec(properties={EXPIRES_AT: str(NOW + 4500)}), 7, NOW)
    topic, block, _ = form.topic, form.properties, form.assigned_alias
    props, _ = decode_properties(block, 0, len(block), PacketType.PUBLISH)
    assert (topic, props.message_expiry_interval, tuple(props.subscription_identifiers)) == ("t/1", 5, (7,))
    assert state.publish_properties(Rec(), 0, NOW) is None
    state.attach(4)
    assert state.publish_properties(Rec(properties={EXPIRES_AT: str(NOW + 4500)}), 7, NOW) is None


def test_too_large_publish_is_dropped_as_if_delivered_and_its_alias_withdrawn():
    """MQTT-3.1.2-24/-25: nothing over the client's Maximum Packet Size is sent; it is discarded as if delivered
    (its packet id completes), and an alias it would have set is not used later, since the client never saw it."""
    state, sub = connected(expiry=60, max_packet_size=100, alias_maximum=5)
    assert not state.too_large(100) and state.too_large(101)
    d = state.messages_read(reoptioned(state, sub.key), read(Rec(topic="big")), 11, "me", NOW)
    (_, _, pid, _) = d.sends[0]
    form = state.publish_properties(Rec(topic="big"), 0, NOW)
    _, _, assigned = form.topic, form.properties, form.assigned_alias
    assert state.dropped_too_large(pid, assigned) == [DeleteOutbound(pid)]
    assert state.outbound == {} and state.window == 100
    form = state.publish_properties(Rec(topic="big"), 0, NOW)
    topic, _, assigned = form.topic, form.properties, form.assigned_alias
    assert (topic, assigned) == ("big", "big")


# -- shared subscriptions: one ShareCursor per broker group, no I/O --------------------------------------------

def _positions(n: int):
    from store.api import QueuePosition
    first = QueuePosition("%LMQ%s/#", "g1", 100)
    out = [first]
    for _ in range(n - 1):
        out.append(out[-1].next())
    return out


def test_share_cursor_commits_the_lowest_message_still_owed():
    """MQTT 4.8.2: a shared message counts as delivered only once acknowledged; the committed position waits for it."""
    from mqtt_proxy.shared import ShareCursor
    p = _positions(4)
    cursor = ShareCursor(p[0])
    cursor.inflight = {p[0]: "s1", p[1]: "s2"}
    cursor.next = p[2]
    assert cursor.commit() is None  # p[0] still owed: nothing moves
    del cursor.inflight[p[0]]
    assert cursor.commit() == p[1] and cursor.committed == p[1]
    del cursor.inflight[p[1]]
    assert cursor.commit() == p[2]


def test_share_cursor_takes_back_what_a_leaving_member_had_in_flight():
    """MQTT 4.8.2: when a member's session ends before it acknowledged, its messages go to another member, oldest first."""
    from mqtt_proxy.shared import ShareCursor
    p = _positions(4)
    cursor = ShareCursor(p[0])
    cursor.inflight = {p[2]: "gone", p[0]: "gone", p[1]: "stays"}
    cursor.next = p[3]
    assert cursor.take_back("gone") == 2
    assert cursor.redeliver == [p[0], p[2]] and cursor.inflight == {p[1]: "stays"}
    assert cursor.commit() is None  # p[0] is owed again: the committed position holds


def test_idle_sessions_share_one_empty_mapping_until_they_hold_something():
    """A new session owns no subscription or in-flight dict; adding to the shared one is refused, own_* makes one."""
    a, b = SessionState(5, 0, 100), SessionState(5, 0, 100)
    assert a.subs is b.subs and a.outbound is b.outbound and not a.subs
    with pytest.raises(TypeError):
        a.subs["t/#"] = Sub("t/#").options()
    a.subscribed("t/#", Sub("t/#").options())
    assert list(a.subs) == ["t/#"] and not b.subs
    a.own_outbound()[1] = "x"
    assert a.outbound == {1: "x"} and not b.outbound


# -- the connection's phase: CONNECT first, CONNACK, then closing; no way back ------------------------------------

def test_connection_phases_follow_connect_connack_close():
    """MQTT-3.1.0-1/-2: a connection reads CONNECT first and only once, is connected after CONNACK, and once closing
    stays closing; an event a phase does not take is the adapter's error, not the peer's."""
    from mqtt_proxy.session_state import Phase, PhaseEvent
    phase = Phase.AWAITING_CONNECT.after(PhaseEvent.CONNECT)
    assert phase is Phase.CONNECTING
    assert phase.after(PhaseEvent.CONNACK) is Phase.CONNECTED
    assert Phase.CONNECTED.after(PhaseEvent.CLOSE).after(PhaseEvent.CLOSE) is Phase.CLOSING
    assert Phase.AWAITING_CONNECT.after(PhaseEvent.CLOSE) is Phase.CLOSING
    for phase, event in [(Phase.CONNECTED, PhaseEvent.CONNECT), (Phase.AWAITING_CONNECT, PhaseEvent.CONNACK),
                         (Phase.CLOSING, PhaseEvent.CONNACK), (Phase.CLOSING, PhaseEvent.CONNECT)]:
        with pytest.raises(SessionStateError):
            phase.after(event)
