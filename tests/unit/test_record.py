"""Unit tests of the commit-log record codec."""

import pytest
from hypothesis import given, strategies as st

from store import record as rec


def _message(**kw):
    base = dict(topic="dev/1/temp", body=b"21.5", qos=1, retain=True, client_id="dev1",
                born_ts=5, properties={"k": "v"})
    base.update(kw)
    return rec.Message(**base)


def test_round_trip_keeps_every_field():
    """A record decodes to exactly what was encoded, queues included."""
    data = rec.encode(_message(), store_ts=42, queues=("dev/+/temp", "dev/#"))
    r = rec.decode(data, offset=1000)
    assert (r.offset, r.size, r.topic, r.body, r.qos, r.retain) == (1000, len(data), "dev/1/temp", b"21.5", 1, True)
    assert (r.client_id, r.store_ts, r.born_ts, r.kind) == ("dev1", 42, 5, rec.RecordKind.MQTT_PUBLISH)
    assert r.queues == ("dev/+/temp", "dev/#")
    assert r.properties["k"] == "v"


def test_truncated_buffer_is_a_torn_tail():
    """A buffer that ends inside a record raises TruncatedRecord, not CorruptRecord."""
    data = rec.encode(_message(), store_ts=1)
    for cut in (0, 5, rec.HEADER_SIZE, len(data) - 1):
        with pytest.raises(rec.TruncatedRecord):
            rec.decode(data[:cut])


def test_flipped_bit_fails_crc():
    """Any change to the bytes covered by the CRC is detected."""
    data = bytearray(rec.encode(_message(), store_ts=1))
    data[-1] ^= 1
    with pytest.raises(rec.CorruptRecord, match="CRC32C"):
        rec.decode(bytes(data))


def test_unknown_version_is_corrupt():
    """A record from an unknown format version is refused with a clear reason."""
    data = bytearray(rec.encode(_message(), store_ts=1))
    data[0] = 9
    with pytest.raises(rec.CorruptRecord, match="version 9"):
        rec.decode(bytes(data))


def test_bad_qos_is_refused_at_encode():
    """The encoder refuses a message it could not represent."""
    with pytest.raises(rec.RecordError):
        rec.encode(_message(qos=3), store_ts=1)


@given(st.binary(max_size=300))
def test_random_bytes_never_raise_anything_but_record_error(data):
    """Decoding arbitrary bytes raises only RecordError subclasses."""
    try:
        rec.decode(data)
    except rec.RecordError:
        pass


@given(st.text(max_size=40), st.binary(max_size=100), st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4))
def test_round_trip_property(topic, body, props):
    """Any encodable message survives a round trip."""
    try:
        data = rec.encode(_message(topic=topic, body=body, properties=props), store_ts=7)
    except rec.RecordError:
        return  # e.g. lone surrogates cannot be UTF-8
    r = rec.decode(data)
    assert (r.topic, r.body, dict(r.properties)) == (topic, body, props)


def test_cached_middle_is_keyed_by_topic_client_and_queues(monkeypatch):
    """Records of messages without properties equal a fresh encode whatever was encoded before them."""
    cases = [("a/1", "c1", ("q1",)), ("a/1", "c2", ("q1",)), ("a/1", "c1", ("q1", "q2")), ("a/2", "c1", ()),
             ("a/1", "c1", ("q1",))]
    warm = [rec.encode(_message(topic=t, client_id=c, properties={}), store_ts=9, queues=q) for t, c, q in cases]
    monkeypatch.setattr(rec, "_MIDDLES", {})
    monkeypatch.setattr(rec, "_ENCODED", {})
    cold = [rec.encode(_message(topic=t, client_id=c, properties={}), store_ts=9, queues=q) for t, c, q in cases]
    assert warm == cold
    for data, (t, c, q) in zip(warm, cases):
        r = rec.decode(data)
        assert (r.topic, r.client_id, r.queues, r.body) == (t, c, q, b"21.5")


def test_encode_many_is_encode_of_each_and_refuses_like_it():
    """encode_many gives the bytes encode gives each message (cached middle or not, properties, retain)."""
    rec._MIDDLES.clear()
    messages = [rec.Message("a/b", b"1", qos=1, client_id="c"), rec.Message("a/b", b"2", qos=1, client_id="c"),
                rec.Message("a/b", b"3", retain=True, properties={"k": "v"}), rec.Message("x", b"", qos=2)]
    queue_sets = [("%TOPIC%a", "%LMQ%a/+"), ("%TOPIC%a", "%LMQ%a/+"), ("%TOPIC%a",), ("%TOPIC%x",)]
    assert rec.encode_many(messages, 1_700_000_000_000, queue_sets) == [
        rec.encode(m, 1_700_000_000_000, q) for m, q in zip(messages, queue_sets)]
    with pytest.raises(rec.RecordError, match="qos"):
        rec.encode_many(messages + [rec.Message("a/b", b"4", qos=7)], 1, queue_sets + [("%TOPIC%a",)])


def test_encode_many_runs_of_one_topic_object_keep_each_messages_own_fields():
    """A run sharing topic, client id and queues objects reuses one cached middle, and a change in any ends the run."""
    rec._MIDDLES.clear()
    topic, qs = "dev/1/t", ("%TOPIC%dev", "%LMQ%dev/+/t")
    messages = [rec.Message(topic, b"%d" % i, qos=i % 2, client_id="c1") for i in range(4)]
    messages += [rec.Message(topic, b"4", client_id="c2"), rec.Message("dev/2/t", b"5", client_id="c2"),
                 rec.Message("dev/2/t", b"6", client_id="c2")]
    queue_sets = [qs] * 5 + [("%TOPIC%dev",)] * 2
    rec.encode_many(messages, 7, queue_sets)  # fills the middle cache
    got = [rec.decode(b) for b in rec.encode_many(messages, 8, queue_sets)]
    assert [(r.topic, r.client_id, r.queues, r.body, r.qos, r.store_ts) for r in got] == [
        (m.topic, m.client_id, q, m.body, m.qos, 8) for m, q in zip(messages, queue_sets)]
