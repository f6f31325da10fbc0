"""Fuzzing the parser: arbitrary and mutated input raises ProtocolError and nothing else."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mqtt_proxy.codec import Connect, MQTTParser, ProtocolError, encode
from tests.unit.test_mqtt_codec_strategies import client_packets, server_packets

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ_STREAMS = settings(FUZZ, max_examples=250)

PARSERS = {
    "server-fresh": lambda: MQTTParser(max_packet_size=4096),
    "server-v311": lambda: MQTTParser(max_packet_size=4096, protocol_level=4),
    "server-v5": lambda: MQTTParser(max_packet_size=4096, protocol_level=5),
    "client-v311": lambda: MQTTParser(max_packet_size=4096, server_side=False, protocol_level=4),
    "client-v5": lambda: MQTTParser(max_packet_size=4096, server_side=False, protocol_level=5),
}


def _feed_all(parser, chunks):
    """Feed every chunk; return the packets, or the ProtocolError raised (any other exception fails the test)."""
    out = []
    try:
        for chunk in chunks:
            out += parser.feed(chunk)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError):  # a dead parser stays dead
            parser.feed(b"\xc0\x00")
        return exc
    return out


@pytest.mark.parametrize("kind", list(PARSERS))
@FUZZ
@given(data=st.binary(max_size=300), cut=st.integers(0, 300))
def test_random_bytes_raise_only_protocol_error(kind, data, cut):
    """Arbitrary bytes, in two chunks, produce packets or ProtocolError, never another exception."""
    _feed_all(PARSERS[kind](), [data[:cut], data[cut:]])


def _packet_stream(level, server_side):
    packets = st.lists(server_packets(level) if not server_side else client_packets(level), min_size=1, max_size=4)
    if server_side:
        head = encode(Connect("fuzz", level), level)
        return packets.map(lambda ps: head + b"".join(encode(p, level) for p in ps))
    return packets.map(lambda ps: b"".join(encode(p, level) for p in ps))


mutations = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0, 10_000),
                               st.integers(0, 255)), min_size=1, max_size=4)


def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for op, at, value in edits:
        if not buf:
            break
        at %= len(buf)
        if op == "flip":
            buf[at] ^= 1 << (value % 8)
        elif op == "set":
            buf[at] = value
        elif op == "insert":
            buf.insert(at, value)
        else:
            del buf[at]
    return bytes(buf)


@pytest.mark.parametrize("level", [4, 5])
@pytest.mark.parametrize("server_side", [True, False], ids=["server", "client"])
@FUZZ_STREAMS
@given(data=st.data(), edits=mutations, split=st.integers(1, 64))
def test_mutated_valid_streams_raise_only_protocol_error(level, server_side, data, edits, split):
    """Valid packet streams with bytes flipped, replaced, inserted or deleted raise only ProtocolError."""
    stream = _mutate(data.draw(_packet_stream(level, server_side)), edits)
    parser = (MQTTParser(max_packet_size=4096) if server_side
              else MQTTParser(max_packet_size=4096, server_side=False, protocol_level=level))
    _feed_all(parser, [stream[i:i + split] for i in range(0, len(stream), split)])


@pytest.mark.parametrize("level", [4, 5])
@settings(FUZZ, max_examples=120)
@given(data=st.data(), cut=st.integers(0, 10_000))
def test_truncated_stream_never_yields_a_partial_packet(level, data, cut):
    """A stream cut anywhere yields a prefix of its packets and holds the rest, without raising."""
    packets = data.draw(st.lists(client_packets(level), min_size=1, max_size=4))
    stream = b"".join(encode(p, level) for p in packets)
    cut %= len(stream) + 1
    out = MQTTParser(protocol_level=level).feed(stream[:cut])
    assert out == packets[:len(out)]
