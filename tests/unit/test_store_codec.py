"""The msgpack mapping of the store interface: every call, result and error survives the round trip."""

from __future__ import annotations

import dataclasses
import enum
import typing

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.remote import codec
from store import api
from store.record import Message, Record, RecordKind

_NONE = type(None)


def strategy(hint) -> st.SearchStrategy:
    """Values of any type the interface uses, within what msgpack can carry (64-bit ints, no lone surrogates)."""
    if hint is None or hint is _NONE:
        return st.none()
    if hint is int:
        return st.integers(-(2**63), 2**64 - 1)
    if hint is str:
        return st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
    if hint is bytes:
        return st.binary(max_size=32)
    if hint is bool:
        return st.booleans()
    if hint is typing.Any:  # a native request or reply: JSON values (msgpack carries them as they are)
        text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)
        scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | text
        return st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                            max_leaves=6)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    if dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return st.builds(hint, *[strategy(hints[f.name]) for f in dataclasses.fields(hint)])
    if isinstance(hint, type) and issubclass(hint, tuple) and hasattr(hint, "_fields"):  # a named tuple
        hints = typing.get_type_hints(hint)
        return st.builds(hint, *[strategy(hints[f]) for f in hint._fields])
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if args[1:] == (Ellipsis,):
            return st.lists(strategy(args[0]), max_size=3).map(tuple)
        return st.tuples(*[strategy(a) for a in args])
    if origin is frozenset:
        return st.frozensets(strategy(args[0]), max_size=4)
    if origin in (dict, typing.Mapping.__origin__):
        return st.dictionaries(strategy(args[0]), strategy(args[1]), max_size=3)
    if len(args) == 2 and _NONE in args:
        return st.none() | strategy(next(a for a in args if a is not _NONE))
    raise AssertionError(f"no strategy for {hint!r}")


def _call_strategy():
    """(name, wire arguments, local arguments): callbacks come last in the interface's signatures."""
    ops = sorted(codec.OPERATIONS.values(), key=lambda op: op.name)
    return st.one_of([st.tuples(st.just(op.name), st.tuples(*[strategy(h) for _p, h in op.wire]),
                                st.just(tuple(print for _ in op.local))) for op in ops])


def _result_strategy():
    ops = sorted(codec.OPERATIONS.values(), key=lambda op: op.name)
    return st.one_of([st.tuples(st.just(op.name), strategy(op.returns)) for op in ops])


def test_every_interface_operation_has_a_schema():
    """The codec's table holds every public operation of store.api.Store, callbacks kept local."""
    public = {name for name in dir(api.Store) if not name.startswith("_")}
    assert set(codec.OPERATIONS) == public
    assert codec.OPERATIONS["watch_queue"].local == ("callback",)
    assert all(not op.local for name, op in codec.OPERATIONS.items() if name != "watch_queue")


@settings(max_examples=300)
@given(_call_strategy())
def test_calls_round_trip(call):
    """Any call's arguments come out of the frame equal to what went in."""
    name, args, local = call
    assert codec.unpack_call(codec.pack_call(name, args + local)) == (name, args)


@settings(max_examples=300)
@given(_result_strategy())
def test_results_round_trip(result):
    """Any operation's result comes out of the frame equal to what went in (tuples, frozensets, enums, records)."""
    name, value = result
    assert codec.unpack_result(name, codec.pack_result(name, value)) == value


@given(strategy(Record), strategy(Message))
def test_records_and_messages_keep_their_kind_type(record, message):
    """A record's kind comes back as a RecordKind, its properties as a dict."""
    r = codec.unpack(codec.pack(record, Record), Record)
    m = codec.unpack(codec.pack(message, Message), Message)
    assert type(r.kind) is RecordKind and type(m.kind) is RecordKind and type(r.properties) is dict


@given(st.binary(max_size=64))
def test_garbage_is_a_codec_error(data):
    """Bytes that are no frame raise CodecError and nothing else."""
    for unpack in (codec.unpack_call, codec.unpack_error, lambda d: codec.unpack_result("read_queue", d)):
        try:
            unpack(data)
        except codec.CodecError:
            pass


def test_defaults_are_applied_and_sent():
    """Parameters left out travel with their declared defaults; keyword arguments are bound by name."""
    request = {"action": "pop", "queue": "q", "seq": [1, "two"]}
    assert codec.unpack_call(codec.pack_call("native_request", (request,))) == ("native_request", (request, None))
    assert codec.unpack_call(codec.pack_call("add_filter", ("a/#",), {"restoring": True})) == \
        ("add_filter", ("a/#", True))


def test_calls_with_every_argument_in_order_pack_as_when_bound():
    """A call given every argument positionally packs the frame binding by name would; a wrong count is refused."""
    position = api.QueuePosition("q", "g", 3)
    bound = codec.pack_call("read_queue", (position,), {"max_count": 10})
    assert codec.pack_call("read_queue", (position, 10)) == bound
    assert codec.unpack_call(codec.pack_call("read_queue", (position, 10))) == ("read_queue", (position, 10))
    with pytest.raises(codec.CodecError, match="argument max_count"):
        codec.pack_call("read_queue", (position, "ten"))
    with pytest.raises(codec.CodecError):
        codec.pack_call("read_queue", (position, 10, 11))


@pytest.mark.parametrize("value, hint", [
    (True, int),  # a bool is no int here
    (1, bool),
    (2**64, int),  # past 64 bits
    (-(2**63) - 1, int),
    ("\udc80", str),  # a lone surrogate cannot be UTF-8
    ([1], tuple[str, ...]),
    ((api.QueuePosition("q", "g", 0),), api.QueuePosition),
    (("q", "g", 0), api.QueuePosition),
    (RecordKind.MQTT_PUBLISH, int),  # an IntEnum where a plain int is declared
    ("PUT_OK", api.AppendStatus),
])
def test_values_off_their_type_are_refused(value, hint):
    """Packing a value that is not of its declared type raises CodecError."""
    with pytest.raises(codec.CodecError):
        codec.pack(value, hint)


@pytest.mark.parametrize("frame", [
    ["append", []],  # too few arguments
    ["append", [1]],  # not a Message
    ["no_such_operation", []],
    ["append"],
    "append",
])
def test_call_frames_off_the_schema_are_refused(frame):
    """A well-formed msgpack frame that does not fit an operation raises CodecError."""
    with pytest.raises(codec.CodecError):
        codec.unpack_call(msgpack.packb(frame))


def test_wrong_argument_is_named():
    """The error names the operation and the argument."""
    with pytest.raises(codec.CodecError, match=r"read_queue: argument position: expected QueuePosition, got str"):
        codec.pack_call("read_queue", ("q", 10))


def test_sets_have_one_encoding():
    """A frozenset packs the same whatever its iteration order (canonical frames)."""
    a, b = frozenset([3, 1, 2, 70000]), frozenset([70000, 2, 3, 1])
    assert codec.pack(a, frozenset[int]) == codec.pack(b, frozenset[int])


@pytest.mark.parametrize("cls", [api.StoreError, api.InvalidArgument, api.NotFound, api.WrongGroup,
                                 api.QuotaExceeded, api.Unavailable, api.Fenced, api.InternalError])
def test_store_errors_keep_their_type_and_message(cls):
    """Every StoreError subclass crosses as itself, with its message."""
    err = codec.unpack_error(codec.pack_error(cls("it broke: details")))
    assert type(err) is cls and str(err) == "it broke: details"


def test_other_exceptions_cross_as_internal_errors_on_one_line():
    """Any other exception becomes InternalError naming its type, on one line."""
    err = codec.unpack_error(codec.pack_error(RuntimeError("disk\n  on fire")))
    assert type(err) is api.InternalError and str(err) == "RuntimeError: disk on fire"


def test_an_unknown_error_code_is_a_plain_store_error():
    """An error code this side does not know (a newer peer) arrives as StoreError naming the code."""
    err = codec.unpack_error(msgpack.packb(["brand_new", "what happened"]))
    assert type(err) is api.StoreError and str(err) == "brand_new: what happened"


@st.composite
def _one_queue_reads(draw):
    """A ReadResult as a broker answers one read: every message in next's queue and group."""
    queue, group = draw(strategy(str)), draw(strategy(str))
    offsets = draw(st.lists(st.integers(0, 2**62), max_size=5))
    records = [draw(strategy(Record)) for _ in offsets]
    messages = tuple(api.QueuedMessage(api.QueuePosition(queue, group, o), r) for o, r in zip(offsets, records))
    return api.ReadResult(messages, api.QueuePosition(queue, group, draw(st.integers(0, 2**62))),
                          draw(st.integers(0, 2**31)))


@given(_one_queue_reads())
def test_a_read_of_one_queue_goes_compact_and_round_trips(result):
    """read_queue's result names its queue and group once (6 fields on the wire) and comes back equal."""
    data = codec.encode(result, api.ReadResult)
    assert len(data) == 6 and data[:2] == [result.next.queue, result.next.group]
    back = codec.unpack_result("read_queue", codec.pack_result("read_queue", result))
    assert back == result and all(type(m.record.kind) is RecordKind for m in back.messages)


def _compact(record_fields, offsets=(7,)):
    return msgpack.packb(["q", "g", 9, 0, list(offsets), [record_fields]], use_bin_type=True)


_GOOD = [7, 40, 1, 1, False, 5, 4, "t/1", "c", {"k": "v"}, b"body"]


@pytest.mark.parametrize("fields, why", [
    (_GOOD[:10], "a field missing"),
    ([*_GOOD[:2], 99, *_GOOD[3:]], "an unknown kind"),
    ([*_GOOD[:3], True, *_GOOD[4:]], "qos as a bool"),
    ([*_GOOD[:7], b"t/1", *_GOOD[8:]], "topic as bytes"),
    ([*_GOOD[:9], {"k": 1}, _GOOD[10]], "a property value not a string"),
    ([*_GOOD[:10], "body"], "body as text"),
])
def test_a_compact_read_off_its_shape_is_refused(fields, why):
    """Each record of a compact read is checked field by field: anything off the shape is a CodecError."""
    assert codec.unpack_result("read_queue", _compact(_GOOD)).messages[0].record.topic == "t/1"
    with pytest.raises(codec.CodecError):
        codec.unpack_result("read_queue", _compact(fields))
    with pytest.raises(codec.CodecError):
        codec.unpack_result("read_queue", _compact(_GOOD, offsets=(7, 8)))


def test_append_results_name_each_queue_set_once():
    """append_batch's result sends each distinct tuple of queues once, then columns, and comes back equal."""
    ok = api.AppendStatus.PUT_OK
    results = tuple(api.AppendResult(ok, 100 + i, ("t/a", "%LMQ%t/+")) for i in range(3)) + \
        (api.AppendResult(api.AppendStatus.MESSAGE_ILLEGAL, -1, (), "too big"),)
    assert codec.encode(results, tuple[api.AppendResult, ...]) == [
        [["t/a", "%LMQ%t/+"], []], [100, 101, 102, -1], [0, 0, 0, 1],
        ["PUT_OK", "PUT_OK", "PUT_OK", "MESSAGE_ILLEGAL"], ["", "", "", "too big"]]
    back = codec.unpack_result("append_batch", codec.pack_result("append_batch", results))
    assert back == results and all(type(r) is api.AppendResult and type(r.queues) is tuple for r in back)


def test_a_batch_all_stored_sends_no_status_or_reason():
    """A batch whose every message was stored (nearly every one) sends only queue sets, offsets and set indexes."""
    ok = api.AppendStatus.PUT_OK
    results = (api.AppendResult(ok, 7, ("t/a",)), api.AppendResult(ok, 90, ("t/b", "%LMQ%t/+")),
               api.AppendResult(ok, 150, ("t/a",)))
    assert codec.encode(results, tuple[api.AppendResult, ...]) == [
        [["t/a"], ["t/b", "%LMQ%t/+"]], [7, 90, 150], [0, 1, 0]]
    back = codec.unpack_result("append_batch", codec.pack_result("append_batch", results))
    assert back == results and all(type(r) is api.AppendResult and r.status is ok for r in back)
    assert codec.unpack_result("append_batch", codec.pack_result("append_batch", ())) == ()


def test_append_results_off_their_types_are_converted_or_refused():
    """An append result with a list of queues is converted before it is packed; one with a bool offset is refused."""
    loose = (api.AppendResult(api.AppendStatus.PUT_OK, 3, ["q"], ""),)
    assert codec.unpack_result("append_batch", codec.pack_result("append_batch", loose)) == \
        (api.AppendResult(api.AppendStatus.PUT_OK, 3, ("q",), ""),)
    with pytest.raises(codec.CodecError):
        codec.pack_result("append_batch", (api.AppendResult(api.AppendStatus.PUT_OK, True, ("q",), ""),))


@pytest.mark.parametrize("frame, why", [
    ([[["q"]], [1], [1]], "a queue set index past the sets"),
    ([[["q"]], [1], [-1]], "a negative queue set index"),
    ([[["q"]], [1, 2], [0]], "columns of different lengths"),
    ([[["q"]], [1], [0], ["NO_SUCH"], [""]], "an unknown status"),
    ([[["q"]], [True], [0]], "offset as a bool"),
    ([[["q"]], [1], [0], ["PUT_OK"]], "four columns"),
    ([[["q"]], [1], [0], ["PUT_OK"], [None]], "a reason not a string"),
    ([[[1]], [1], [0]], "a queue name not a string"),
    ([[["q"]], ["PUT_OK", 1, 0, ""]], "the version 6 form"),
    ([["PUT_OK", 1, ["q"], ""]], "the generic form"),
])
def test_compact_append_results_off_their_shape_are_refused(frame, why):
    """Each column and queue set of a compact append_batch result is checked: anything off the shape is a CodecError."""
    assert codec.unpack_result("append_batch", msgpack.packb([[["q"]], [1], [0]])) == \
        (api.AppendResult(api.AppendStatus.PUT_OK, 1, ("q",), ""),)
    assert codec.unpack_result("append_batch", msgpack.packb([[["q"]], [1], [0], ["OS_ERROR"], ["disk"]])) == \
        (api.AppendResult(api.AppendStatus.OS_ERROR, 1, ("q",), "disk"),)
    with pytest.raises(codec.CodecError):
        codec.unpack_result("append_batch", msgpack.packb(frame))


def test_a_message_batch_off_its_types_is_converted_or_refused():
    """append_batch's messages take the checked fast path; a bytearray body is converted, a bool qos refused."""
    m = Message("t/a", b"x", RecordKind.MQTT_PUBLISH, 1, False, "c", 5, {"k": "v"})
    assert codec.unpack_call(codec.pack_call("append_batch", ((m,),))) == ("append_batch", ((m,),))
    loose = Message("t/a", bytearray(b"x"), RecordKind.MQTT_PUBLISH, 1, False, "c", 5, {"k": "v"})
    assert codec.unpack_call(codec.pack_call("append_batch", ((loose,),)))[1][0][0].body == b"x"
    with pytest.raises(codec.CodecError):
        codec.pack_call("append_batch", ((Message("t/a", b"x", qos=True),),))
    with pytest.raises(codec.CodecError):
        codec.unpack_call(msgpack.packb(["append_batch", [[["t/a", b"x", 1, True, False, "c", 5, {}]]]],
                                        use_bin_type=True))


def test_a_field_off_its_type_in_any_row_of_a_batch_is_refused():
    """Batches are checked a column at a time: one bad field in the last row of many is still a CodecError."""
    rows = [["t/a", b"x", 1, 1, False, "c", 5, {}] for _ in range(5)]
    assert len(codec.unpack_call(msgpack.packb(["append_batch", [rows]], use_bin_type=True))[1][0]) == 5
    for bad in ([*rows[0][:6], 5.0, {}], [*rows[0][:7], {"k": 1}], [*rows[0][:2], 99, *rows[0][3:]], rows[0][:7]):
        with pytest.raises(codec.CodecError):
            codec.unpack_call(msgpack.packb(["append_batch", [rows[:4] + [bad]]], use_bin_type=True))
    records = [_GOOD] * 4
    assert len(codec.unpack_result("read_queue", _compact_rows(records, range(4))).messages) == 4
    for bad in ([*_GOOD[:10], "body"], [*_GOOD[:9], {"k": 1}, _GOOD[10]], [*_GOOD[:3], True, *_GOOD[4:]]):
        with pytest.raises(codec.CodecError):
            codec.unpack_result("read_queue", _compact_rows(records[:3] + [bad], range(4)))


def _compact_rows(records, offsets):
    return msgpack.packb(["q", "g", 9, 0, list(offsets), records], use_bin_type=True)


def test_batches_of_mixed_kinds_and_properties_keep_each_message_its_own():
    """A batch of several kinds, properties on some messages only, comes back message for message."""
    messages = (Message("t/a", b"1", RecordKind.MQTT_PUBLISH, 1, False, "c", 5, {}),
                Message("q1", b"2", RecordKind.NATIVE_MESSAGE, 0, True, "", 6, {"k": "v"}),
                Message("t/b", b"3", RecordKind.MQTT_PUBLISH, 0, False, "d", 7, {}))
    back = codec.unpack_call(codec.pack_call("append_batch", (messages,)))[1][0]
    assert back == messages and [type(m.kind) for m in back] == [RecordKind] * 3
    records = tuple(Record(10 * i, 10, m.kind, m.qos, m.retain, 1, m.born_ts, m.topic, m.client_id, m.properties,
                           m.body) for i, m in enumerate(messages))
    read = api.ReadResult(tuple(api.QueuedMessage(api.QueuePosition("q", "g", i), r) for i, r in enumerate(records)),
                          api.QueuePosition("q", "g", 3), 0)
    again = codec.unpack_result("read_queue", codec.pack_result("read_queue", read))
    assert again == read and [m.record.kind for m in again.messages] == [m.kind for m in messages]
    assert hash(again.messages[1].position) == hash(api.QueuePosition("q", "g", 1))


def test_an_append_answer_carries_where_the_records_went():
    """append_batch's answer may end with [group, store time, sizes, firsts]; it round-trips, and the plain
    result decoder still reads an answer without it."""
    ok = api.AppendStatus.PUT_OK
    results = (api.AppendResult(ok, 7, ("t/a", "%LMQ%t/+")), api.AppendResult(ok, 60, ("t/a", "%LMQ%t/+")))
    indexed = api.IndexedAppend("g1", 1234, (53, 53), {"%LMQ%t/+": 40})
    assert codec.unpack_append_answer(codec.pack_append_answer(results, indexed)) == (results, indexed)
    assert codec.unpack_append_answer(codec.pack_append_answer(results, None)) == (results, None)
    assert codec.unpack_append_answer(codec.pack_result("append_batch", results)) == (results, None)
    with pytest.raises(codec.CodecError):
        codec.pack_append_answer(results, indexed._replace(sizes=(53,)))


@pytest.mark.parametrize("extra, why", [
    (["g1", 5, [1], {"q": 0}, "more"], "five fields"),
    ([1, 5, [1], {"q": 0}], "a group not a string"),
    (["g1", 5, [True], {"q": 0}], "a size as a bool"),
    (["g1", 5, [1, 2], {"q": 0}], "a size per result, not more"),
    (["g1", 5, [1], {"q": "0"}], "a first offset not an int"),
    (["g1", 5, [1], [["q", 0]]], "firsts not a map"),
])
def test_where_the_records_went_off_its_shape_is_refused(extra, why):
    """Each field of the told entries is checked: anything off the shape is a CodecError, not a wrong delivery."""
    good = ["g1", 5, [1], {"q": 0}]
    assert codec.unpack_append_answer(msgpack.packb([[["q"]], [1], [0], good]))[1] == \
        api.IndexedAppend("g1", 5, (1,), {"q": 0})
    with pytest.raises(codec.CodecError):
        codec.unpack_append_answer(msgpack.packb([[["q"]], [1], [0], extra]))


def _runs_batch():
    topics, clients = ["dev/a/temp", "dev/b/temp"], ["pub-a", "pub-b"]
    return tuple(Message(topics[i // 8], b"%d" % i, RecordKind.MQTT_PUBLISH, 1, False, clients[i // 8], 100 + i, {})
                 for i in range(16))


def test_a_batch_of_long_runs_goes_as_runs_and_round_trips():
    """A few devices' runs of one topic and client id cross as runs (each says its fields once) and come back
    message for message, each with a dict of its own; a batch of many topics goes as rows."""
    batch = _runs_batch()
    packed = codec.encode(batch, tuple[Message, ...])
    assert packed == {"runs": [["dev/a/temp", "pub-a", RecordKind.MQTT_PUBLISH, 1, False,
                                [b"%d" % i for i in range(8)], list(range(100, 108))],
                               ["dev/b/temp", "pub-b", RecordKind.MQTT_PUBLISH, 1, False,
                                [b"%d" % i for i in range(8, 16)], list(range(108, 116))]]}
    back = codec.unpack_call(codec.pack_call("append_batch", (batch,)))[1][0]
    assert back == batch and len({id(m.properties) for m in back}) == 16
    scattered = tuple(Message(f"dev/{i}/temp", b"x", RecordKind.MQTT_PUBLISH, 1, False, f"c{i}", 5, {})
                      for i in range(16))
    assert type(codec.encode(scattered, tuple[Message, ...])) is list
    assert codec.unpack_call(codec.pack_call("append_batch", (scattered,)))[1][0] == scattered


def test_runs_with_a_message_off_its_types_go_as_rows_or_are_refused():
    """A run broken by properties, a bool qos or a bytearray body leaves the runs form: converted, or refused."""
    batch = list(_runs_batch())
    with_props = batch[:3] + [Message("dev/a/temp", b"p", RecordKind.MQTT_PUBLISH, 1, False, "pub-a", 5, {"k": "v"})]
    assert codec.unpack_call(codec.pack_call("append_batch", (tuple(with_props),)))[1][0] == tuple(with_props)
    loose = batch[:15] + [Message("dev/b/temp", bytearray(b"z"), RecordKind.MQTT_PUBLISH, 1, False, "pub-b", 5, {})]
    assert codec.unpack_call(codec.pack_call("append_batch", (tuple(loose),)))[1][0][-1].body == b"z"
    with pytest.raises(codec.CodecError):
        codec.pack_call("append_batch", (tuple(batch[:15] + [Message("dev/b/temp", b"z", qos=True)]),))


@pytest.mark.parametrize("run, why", [
    (["t/a", "c", 1, 1, False, [b"x"], [5, 6]], "born times and bodies of different lengths"),
    (["t/a", "c", 1, 1, False, [], []], "an empty run"),
    (["t/a", "c", 99, 1, False, [b"x"], [5]], "an unknown kind"),
    (["t/a", "c", 1, True, False, [b"x"], [5]], "qos as a bool"),
    (["t/a", "c", 1, 1, False, ["x"], [5]], "a body as text"),
    (["t/a", "c", 1, 1, False, [b"x"], [True]], "a born time as a bool"),
    (["t/a", "c", 1, 1, False, [b"x"]], "a field missing"),
])
def test_a_run_off_its_shape_is_refused(run, why):
    """Each run of a batch is checked: anything off its shape is a CodecError."""
    good = ["t/a", "c", 1, 1, False, [b"x"], [5]]
    frame = lambda r: msgpack.packb(["append_batch", [{"runs": [good, r]}]], use_bin_type=True)  # noqa: E731
    assert len(codec.unpack_call(frame(good))[1][0]) == 2
    with pytest.raises(codec.CodecError):
        codec.unpack_call(frame(run))
    with pytest.raises(codec.CodecError):
        codec.unpack_call(msgpack.packb(["append_batch", [{"runs": [good], "more": []}]], use_bin_type=True))
