"""RPC framing: varint lengths, the frame vocabulary, and refusing what is not a frame (cluster/rpc/frames.py)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.rpc import frames
from cluster.rpc.frames import (
    Call,
    Challenge,
    Error,
    Event,
    FrameDecoder,
    FrameError,
    Goodbye,
    Heartbeat,
    Hello,
    HelloOk,
    Proof,
    Result,
)

SAMPLES = [
    Hello("c", "n1", "proxy", 1, True, b"n" * 16),
    Hello("c", "n1", "proxy", 1, True, b"n" * 16, boot="5f3a"),
    Challenge("c", "b1", "broker", 1, False, b"m" * 16, b"h" * 32),
    Proof(b"p" * 32),
    HelloOk(),
    Call(7, "store.append", b"\x92\x00"),
    Result(7, b"\xc0"),
    Error(7, "not_found", "no such watch"),
    Event("queue", b"\xa3abc"),
    Heartbeat(False),
    Goodbye("stopping"),
]


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, 2**31])
def test_varint_lengths_are_read_back(n):
    """A length survives the varint encoding, in the fewest bytes (checked by the cap's message)."""
    data = frames.encode_varint(n)
    assert len(data) == max(1, (n.bit_length() + 6) // 7)
    if n == 0:
        assert data == b"\x00"
        return
    with pytest.raises(FrameError, match=f"frame of {n} bytes"):
        FrameDecoder(max_frame=n - 1).feed(data)


def test_every_frame_round_trips_fed_one_byte_at_a_time():
    """Each frame type decodes to what was encoded, however the stream is split."""
    stream = b"".join(frames.encode(f) for f in SAMPLES)
    decoder = FrameDecoder(max_frame=1024)
    got = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i:i + 1])
    assert got == SAMPLES


def test_an_oversized_frame_is_refused_on_its_length_prefix():
    """A frame longer than the cap is refused as soon as its length is read, before its payload arrives."""
    decoder = FrameDecoder(max_frame=100)
    with pytest.raises(FrameError, match="over the limit of 100"):
        decoder.feed(frames.encode_varint(101))


def test_a_length_prefix_that_never_ends_is_refused():
    """Five continuation bytes is no length any cap allows."""
    with pytest.raises(FrameError, match="prefix too long"):
        FrameDecoder(max_frame=2**40).feed(b"\xff" * 5)


@pytest.mark.parametrize("array, why", [
    ([99, 0], "unknown frame type"),
    ([2, 1, "store.append"], "malformed CALL"),
    ([2, 1, 5, b""], "malformed CALL"),
    ([6, 0, 1], "malformed HEARTBEAT"),
    ({"a": 1}, "array"),
    ([2, -1, "x", b""], "request id"),
])
def test_arrays_of_the_wrong_shape_are_refused(array, why):
    """A msgpack value that is not one of the frame arrays is a FrameError naming what is wrong."""
    payload = msgpack.packb(array, use_bin_type=True)
    with pytest.raises(FrameError, match=why):
        FrameDecoder(1024).feed(frames.encode_varint(len(payload)) + payload)


def test_bytes_that_are_not_msgpack_are_refused():
    """A payload msgpack cannot read is a FrameError, not a crash."""
    with pytest.raises(FrameError, match="not a msgpack frame"):
        FrameDecoder(1024).feed(b"\x03\x92\xc1\xc1")


def test_garbage_is_refused_at_its_first_byte():
    """An HTTP request is refused at once, not after waiting for the bytes its first byte seems to promise."""
    with pytest.raises(FrameError, match="msgpack array"):
        FrameDecoder(1024).feed(b"GET / HTTP/1.1\r\n")


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64), st.integers(1, 8))
def test_fuzz_any_bytes_decode_to_frames_or_frame_error(data, chunk):
    """Whatever bytes arrive, in whatever pieces, the decoder yields frames or raises FrameError, nothing else."""
    decoder = FrameDecoder(max_frame=32)
    try:
        for i in range(0, len(data), chunk):
            for frame in decoder.feed(data[i:i + chunk]):
                assert isinstance(frame, (Hello, Proof, HelloOk, Call, Result, Error, Event, Heartbeat, Goodbye))
    except FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(SAMPLES), max_size=6), st.binary(max_size=16))
def test_fuzz_valid_frames_then_garbage(prefix, garbage):
    """Valid frames before garbage are all delivered; the garbage then fails only as a FrameError."""
    decoder = FrameDecoder(max_frame=128)
    assert decoder.feed(b"".join(frames.encode(f) for f in prefix)) == prefix
    try:
        decoder.feed(garbage)
    except FrameError:
        pass
