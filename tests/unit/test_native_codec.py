"""Unit tests of the native request codec: validation, echo, replies, line framing, and a hypothesis fuzz."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqtt_proxy.native import codec
from mqtt_proxy.native.codec import LINE_TOO_LONG, LineBuffer, RequestError, parse_request
from store.config import ConfigError, NativeConfig, from_mapping

CFG = NativeConfig()


def _err(raw):
    with pytest.raises(RequestError) as info:
        parse_request(raw if isinstance(raw, (bytes, str)) else json.dumps(raw), CFG)
    return info.value


def test_produce_defaults():
    """A bare produce gets delay 0, ttl 86400, retry 0 and echoes action/queue/seq."""
    req = parse_request(b'{"action":1,"queue":"q","data":"x","seq":5}', CFG)
    (item,) = req.items
    assert (item.data, item.delay, item.ttl, item.retry) == (b"x", 0, 86400, 0)
    assert req.echo == {"action": 1, "queue": "q", "seq": 5}


def test_action_by_name():
    """Actions may be given by name; the echo repeats what the client sent."""
    req = parse_request(b'{"action":"pop","queue":"q"}', CFG)
    assert req.action == codec.POP and req.invisible_time == 30 and req.echo["action"] == "pop"


@pytest.mark.parametrize("raw,needle", [
    (b"{not json", "malformed JSON"),
    (b"[1,2]", "JSON object"),
    (b"\xff\xfe", "UTF-8"),
    (b'{"action":1,"queue":"q","data":NaN}', "malformed JSON"),
    (b"[" * 100000 + b"]" * 100000, "malformed JSON"),
    (b'{"action":1,"queue":"q","data":"x","delay":' + b"9" * 5000 + b"}", "malformed JSON"),
])
def test_malformed_bytes(raw, needle):
    """Bytes that are not one JSON object are refused with a reason."""
    assert needle in _err(raw).reason


@pytest.mark.parametrize("obj,needle", [
    ({"queue": "q"}, "missing field action"),
    ({"action": 99}, "unknown action 99"),
    ({"action": "fly"}, "unknown action"),
    ({"action": True}, "action must be"),
    ({"action": 1, "data": "x"}, "exactly one of queue and topic"),
    ({"action": 1, "queue": "q", "topic": "t", "data": "x"}, "exactly one"),
    ({"action": 1, "queue": "q"}, "missing field data"),
    ({"action": 1, "queue": 5, "data": "x"}, "queue must be a string"),
    ({"action": 1, "queue": "", "data": "x"}, "empty"),
    ({"action": 1, "queue": "a,b", "data": "x"}, "','"),
    ({"action": 1, "queue": "q" * 300, "data": "x"}, "longer"),
    ({"action": 1, "queue": "q", "data": 5}, "data must be a string"),
    ({"action": 1, "queue": "q", "data": "x", "delay": "5"}, "delay must be an integer"),
    ({"action": 1, "queue": "q", "data": "x", "delay": 1.5}, "delay must be an integer"),
    ({"action": 1, "queue": "q", "data": "x", "delay": -1}, "delay must be between"),
    ({"action": 1, "queue": "q", "data": "x", "ttl": 10 ** 30}, "ttl must be between"),
    ({"action": 1, "queue": "q", "data": "x", "retry": True}, "retry must be an integer"),
    ({"action": 1, "queue": "q", "data": "x", "delay": 10, "ttl": 10}, "greater than delay"),
    ({"action": 1, "queue": "q", "data": "x", "qos": 1}, "qos is for topics"),
    ({"action": 1, "topic": "a/+", "data": "x"}, "bad topic"),
    ({"action": 1, "topic": "a", "data": "x", "qos": 3}, "qos must be between"),
    ({"action": 1, "topic": "a", "data": "x", "retain": "yes"}, "retain"),
    ({"action": 1, "queue": "q", "batch": []}, "non-empty"),
    ({"action": 1, "queue": "q", "batch": [5]}, "batch[0]"),
    ({"action": 1, "queue": "q", "batch": ["x"] * 1001}, "max_batch"),
    ({"action": 1, "queue": "q", "data": "x", "batch": ["y"]}, "either data or batch"),
    ({"action": 1, "queue": "q", "data": "!!", "encoding": "base64"}, "base64"),
    ({"action": 1, "queue": "q", "data": "x", "encoding": "rot13"}, "encoding"),
    ({"action": 3, "queue": "q"}, "missing field msg_id"),
    ({"action": 3, "queue": "q", "msg_id": "7"}, "msg_id must be an integer"),
    ({"action": 13, "queue": "q", "msg_id": 1}, "missing field invisible_time"),
    ({"action": 11, "queue": "q", "invisible_time": 0}, "invisible_time must be between"),
    ({"action": 2, "queue": "q", "group": 7}, "group must be a string"),
    ({"action": 2, "queue": "q", "seq": [1]}, "seq must be"),
])
def test_invalid_fields(obj, needle):
    """Missing, wrongly typed and out-of-range fields are named in the reason."""
    assert needle in _err(obj).reason


def test_error_echo_keeps_good_fields():
    """An invalid request still echoes the action, queue and seq it could read."""
    e = _err({"action": 1, "queue": "q", "seq": "abc", "delay": "x"})
    assert e.echo == {"action": 1, "queue": "q", "seq": "abc"}
    reply = codec.error_reply(e.reason, e.echo)
    assert reply["code"] == -1 and reply["seq"] == "abc"


def test_lone_surrogate_data_is_refused():
    """A JSON string with a lone surrogate cannot be stored as UTF-8 and is refused."""
    assert "UTF-8" in _err(b'{"action":1,"queue":"q","data":"\\ud800"}').reason


def test_base64_data():
    """encoding=base64 stores the decoded bytes; non-UTF-8 bodies come back base64."""
    req = parse_request(b'{"action":1,"queue":"q","data":"/wA=","encoding":"base64"}', CFG)
    assert req.items[0].data == b"\xff\x00"
    assert codec.encode_data(b"\xff\x00") == ("/wA=", "base64")
    assert codec.encode_data("é".encode()) == ("é", None)


def test_batch_items_inherit_top_level_fields():
    """Top-level delay/ttl/retry are defaults for batch items; an item may override them."""
    req = parse_request(json.dumps({"action": 1, "queue": "q", "retry": 3, "batch": ["a", {"data": "b", "retry": 0}]}),
                        CFG)
    assert [i.retry for i in req.items] == [3, 0] and req.batch


def test_reply_is_one_line():
    """Replies never contain a raw newline, whatever the data."""
    out = codec.encode_reply({"code": 0, "data": "a\nb\u2028"})
    assert b"\n" not in out and json.loads(out)["data"] == "a\nb\u2028"


def test_line_buffer_splits_and_skips_long_lines():
    """Lines are split at newlines across feeds; an over-long line yields one marker and is skipped."""
    lb = LineBuffer(10)
    assert lb.feed(b'{"a":1}\r\n{"b"') == [b'{"a":1}']
    assert lb.feed(b":2}\n\n") == [b'{"b":2}']
    assert lb.feed(b"x" * 25) == [LINE_TOO_LONG]
    assert lb.feed(b"y" * 25) == []
    assert lb.feed(b"zz\nok\n") == [b"ok"]
    assert lb.feed(b"0123456789012\nok\n") == [LINE_TOO_LONG, b"ok"]


def test_config_names_bad_key():
    """from_mapping names an unknown or mistyped key of the native section."""
    with pytest.raises(ConfigError, match="native.max_queue_sise"):
        from_mapping(NativeConfig, "native", {"max_queue_sise": 5})
    with pytest.raises(ConfigError, match="native.virtual_queues"):
        from_mapping(NativeConfig, "native", {"virtual_queues": {"v": []}})
    cfg = from_mapping(NativeConfig, "native", {"virtual_queues": {"v": ["a", "b"]}, "max_queue_size": 5})
    assert cfg.virtual_queues == {"v": ["a", "b"]}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
_fields = st.fixed_dictionaries({}, optional={
    "action": st.sampled_from([1, 2, 3, 4, 7, 11, 12, 13, 104, 107, 0, -1, "pop", "ack", "x"]) | _json,
    "queue": st.text(max_size=12) | _json, "topic": st.text(max_size=12) | _json, "data": st.text() | _json,
    "delay": st.integers(-5, 10 ** 7) | _json, "ttl": st.integers(-5, 10 ** 7) | _json,
    "retry": st.integers(-5, 100) | _json, "seq": _json, "msg_id": st.integers(-1, 2 ** 64) | _json,
    "group": st.text(max_size=8) | _json, "invisible_time": st.integers(-1, 10 ** 6) | _json,
    "batch": st.lists(st.text(max_size=5) | _json, max_size=3) | _json, "qos": _json, "retain": _json,
    "encoding": st.sampled_from(["utf-8", "base64", "x"]) | _json,
})


@settings(max_examples=400, deadline=None)
@given(_fields)
def test_fuzz_structured_requests(obj):
    """Any JSON object either parses into a Request or raises RequestError; the reply encodes as one line."""
    try:
        req = parse_request(json.dumps(obj).encode(), CFG)
    except RequestError as exc:
        out = codec.encode_reply(codec.error_reply(exc.reason, exc.echo))
    else:
        out = codec.encode_reply(dict(req.echo, code=0))
    assert b"\n" not in out and isinstance(json.loads(out), dict)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_raw_bytes(raw):
    """Arbitrary bytes never raise anything but RequestError."""
    try:
        parse_request(raw, CFG)
    except RequestError:
        pass


@given(st.sampled_from([
    {"action": "produce", "queue": "q", "data": "hé", "delay": 3, "ttl": 60, "retry": 5, "seq": 7},
    {"action": 1, "queue": "q", "batch": ["a", {"data": "b", "delay": 2}], "seq": "s"},
    {"action": "produce", "topic": "t/1", "data": "AAE=", "encoding": "base64", "qos": 0, "retain": True},
    {"action": "consume", "queue": "q", "group": "g", "encoding": "base64"},
    {"action": "pop", "queue": "q", "invisible_time": 9},
    {"action": "ack", "queue": "q", "msg_id": 12},
    {"action": "queue_list", "seq": 1},
]))
def test_request_object_parses_back_to_the_same_request(obj):
    """A proxy forwards request_object(req): the broker parses exactly the request the proxy parsed."""
    config = NativeConfig()
    req = codec.parse_request(obj, config)
    assert codec.parse_request(codec.request_object(req), config) == req


def _stdlib_outcome(raw):
    """What the stdlib-only decoder makes of ``raw``: the object, or the RequestError reason."""
    try:
        return ("ok", codec._parse_json_stdlib(raw))
    except RequestError as exc:
        return ("error", exc.reason)


def _outcome(raw):
    try:
        return ("ok", codec.parse_json(raw))
    except RequestError as exc:
        return ("error", exc.reason)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_fields.map(lambda o: json.dumps(o, ensure_ascii=False).encode("utf-8", "surrogatepass")),
                 _fields.map(lambda o: json.dumps(o).encode()), st.binary(max_size=200)))
def test_fast_decoder_agrees_with_the_stdlib(raw):
    """orjson's decode gives what the stdlib decoder gives (object or error reason) for any bytes."""
    assert _outcome(raw) == _stdlib_outcome(raw)


@pytest.mark.parametrize("raw", [
    b'{"action":1,"queue":"q","data":"x","ttl":' + b"9" * 30 + b"}",  # past 64 bits: a float in orjson
    b'{"action":1,"queue":"q","batch":[{"data":"x","delay":' + b"9" * 25 + b"}]}",
    b'{"action":1,"queue":"q","data":"\\ud800"}',  # lone surrogate: orjson refuses, the stdlib reads it
    b'{"action":1,"queue":"","batch":[[-9223372036854775809]]}',  # past 64 bits, nested in a list (hypothesis)
    b'{"action":1,"queue":"q","data":"x","delay":1e400}',
])
def test_what_orjson_reads_differently_goes_the_stdlib_way(raw):
    """Inputs orjson refuses or reads differently decode exactly as the stdlib decodes them."""
    assert _outcome(raw) == _stdlib_outcome(raw)
    assert _outcome(raw)[0] == "ok"


@pytest.mark.parametrize("reply", [
    {"code": 0, "msg_id": 7, "data": "hé\u2028\x1f\"\\", "seq": "s"},
    {"code": 0, "data": "\ud800"},  # lone surrogate: orjson refuses, the ASCII encoder escapes it
    {"code": 0, "msg_id": 2 ** 70},
    {"code": -1, "reason": "x", "seq": 1, "queues": [{"queue": "q", "size": 0}]},
])
def test_encode_reply_matches_the_stdlib_encoding(reply):
    """Replies decode to the same object the stdlib would have written, on one line."""
    out = codec.encode_reply(reply)
    try:
        expected = json.dumps(reply, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        expected = json.dumps(reply, separators=(",", ":")).encode("ascii")
    assert out == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")), max_size=6),
       st.lists(st.integers(0, 200), max_size=5))
def test_line_buffer_same_lines_whatever_the_chunks(lines, cuts):
    """The lines out do not depend on how the stream is cut (whole single lines take a shortcut)."""
    stream = b"".join(line + b"\n" for line in lines)
    expected = [line for line in lines if line.strip() and len(line) <= 20]
    buf, got, start = LineBuffer(20), [], 0
    for cut in sorted(set(c for c in cuts if c < len(stream))) + [len(stream)]:
        got.extend(x for x in buf.feed(stream[start:cut]) if x is not LINE_TOO_LONG)
        start = cut
    assert got == expected
