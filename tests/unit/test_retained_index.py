"""The retained-message index: set, clear, wildcard lookup, limits, replay and retention."""

from __future__ import annotations

from lightqueue.retained_index import RetainedIndex
from store import record as rec
from store.dispatch import DispatchRequest


def req(offset, topic, body_size=5, retain=True, kind=rec.RecordKind.MQTT_PUBLISH):
    return DispatchRequest(offset, 100, 1000 + offset, kind, topic, (), {}, retain, body_size)


def topics(index, topic_filter):
    return sorted(t for t, _o, _s in index.lookup(topic_filter))


def test_set_replace_and_clear(tmp_path):
    """The last retained publish per topic wins; an empty payload clears it; non-retained ones are ignored."""
    ix = RetainedIndex(str(tmp_path))
    ix.dispatch([req(0, "a/b"), req(100, "a/b"), req(200, "a/c", retain=False), req(300, "x")])
    assert ix.get("a/b").cl_offset == 100 and ix.get("a/c") is None
    ix.dispatch([req(400, "x", body_size=0)])
    assert ix.get("x") is None and len(ix) == 1


def test_wildcard_lookup_and_dollar_topics(tmp_path):
    """'+' and '#' match retained topics; a leading wildcard does not match $SYS topics."""
    ix = RetainedIndex(str(tmp_path))
    ix.dispatch([req(i * 100, t) for i, t in enumerate(["dev/1/temp", "dev/2/temp", "dev/2/hum", "dev",
                                                         "$SYS/broker/uptime"])])
    assert topics(ix, "dev/+/temp") == ["dev/1/temp", "dev/2/temp"]
    assert topics(ix, "dev/#") == ["dev", "dev/1/temp", "dev/2/hum", "dev/2/temp"]
    assert topics(ix, "#") == ["dev", "dev/1/temp", "dev/2/hum", "dev/2/temp"]
    assert topics(ix, "$SYS/#") == ["$SYS/broker/uptime"]
    assert topics(ix, "+/broker/uptime") == []


def test_survives_reopen_and_ignores_replayed_requests(tmp_path):
    """After close and reopen the entries and checkpoint are back; requests below the checkpoint are skipped."""
    ix = RetainedIndex(str(tmp_path))
    ix.dispatch([req(0, "a"), req(100, "b")])
    ix.close()
    ix = RetainedIndex(str(tmp_path))
    assert ix.dispatched_offset == 200 and topics(ix, "#") == ["a", "b"]
    ix.dispatch([req(0, "a", body_size=0)])  # a replay of something already applied
    assert topics(ix, "#") == ["a", "b"]


def test_limits_and_retention(tmp_path):
    """would_exceed enforces message and byte limits; log_truncated forgets what retention deleted."""
    ix = RetainedIndex(str(tmp_path), max_messages=2, max_bytes=12)
    ix.dispatch([req(0, "a", body_size=5), req(100, "b", body_size=5)])
    assert ix.would_exceed("c", 1)  # a third topic
    assert not ix.would_exceed("a", 7)  # replacing a: 7 + 5 <= 12
    assert ix.would_exceed("a", 8)
    ix.log_truncated(100)
    assert topics(ix, "#") == ["b"]
