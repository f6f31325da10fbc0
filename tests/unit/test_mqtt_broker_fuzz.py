"""Fuzzing the broker through its protocol: hostile bytes never raise out of dataReceived or hurt others."""

from __future__ import annotations

import logging

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mqtt_proxy.codec import Connect, Publish, Subscribe, Subscription, encode
from tests.unit.test_mqtt_broker import Harness, published
from tests.unit.test_mqtt_codec_fuzz import _mutate, mutations
from tests.unit.test_mqtt_codec_strategies import client_packets

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    harness = Harness(tmp_path_factory.mktemp("fuzz"))
    watcher = harness.connect("fuzz-watcher")
    watcher.send(Subscribe(1, (Subscription("canary"),)))
    watcher.received()
    harness.watcher = watcher
    harness.errors = _ErrorLog()
    logging.getLogger("twistmq").addHandler(harness.errors)
    yield harness
    logging.getLogger("twistmq").removeHandler(harness.errors)
    harness.close()


class _ErrorLog(logging.Handler):
    """Collects ERROR records: a handler failing on hostile input is a broker bug even if nothing crashed."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record) -> None:
        self.records.append(record.getMessage())


def _feed(h, stream: bytes, split: int) -> None:
    proto = h.factory.buildProtocol(None)
    from twisted.internet.testing import StringTransport
    proto.makeConnection(StringTransport())
    for i in range(0, len(stream), split):
        proto.dataReceived(stream[i:i + split])  # must never raise
        h.tick()
    proto.connectionLost(None)
    h.tick()


def _still_serving(h) -> None:
    assert h.errors.records == [], h.errors.records[:1]
    pub = h.connect("fuzz-canary")
    pub.send(Publish("canary", b"alive"))
    assert [p.payload for p in published(h.watcher)][-1:] == [b"alive"]
    pub.lose()


@pytest.mark.parametrize("level", [4, 5])
@FUZZ
@given(data=st.data(), edits=mutations, split=st.integers(1, 64))
def test_mutated_sessions_never_crash_the_broker(h, level, data, edits, split):
    """A CONNECT then valid packets, with bytes mutated, leaves the broker serving other clients."""
    packets = data.draw(st.lists(client_packets(level), min_size=1, max_size=5))
    stream = encode(Connect(client_id="fuzzed", protocol_level=level, keep_alive=0), level) + \
        b"".join(encode(p, level) for p in packets)
    _feed(h, _mutate(stream, edits), split)
    _still_serving(h)


@FUZZ
@given(data=st.binary(max_size=400), split=st.integers(1, 64))
def test_random_bytes_after_connect_never_crash_the_broker(h, data, split):
    """Random bytes after a valid CONNECT close that connection at most."""
    _feed(h, encode(Connect(client_id="noise", protocol_level=5), 5) + data, split)
    _still_serving(h)
