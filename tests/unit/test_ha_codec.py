"""Unit tests of the replication channel's frame codec."""

import pytest
from hypothesis import given, settings, strategies as st

from store import ha_codec as codec
from store.ha_epochs import EpochEntry

u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
nonce = st.binary(min_size=16, max_size=16)
mac = st.binary(min_size=32, max_size=32)

frames = st.one_of(
    st.builds(codec.Hello, st.text(max_size=40), nonce, st.booleans()),
    st.builds(codec.Challenge, nonce, mac),
    st.builds(codec.Proof, mac, u64),
    st.builds(codec.Epochs, u64, u64, st.lists(st.builds(EpochEntry, u32, u64), max_size=20).map(tuple)),
    st.builds(codec.Transfer, u64, u32, u64, u64, st.binary(max_size=600)),
    st.builds(codec.Ack, u64),
    st.builds(codec.Refused, st.text(max_size=80).filter(lambda t: len(t.encode()) <= 1024)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(frames, max_size=6), st.integers(1, 50))
def test_frames_round_trip_in_any_split(items, step):
    """Frames decode to what was encoded, however the bytes are split."""
    data = b"".join(codec.encode(f) for f in items)
    dec = codec.FrameDecoder()
    out = []
    for i in range(0, len(data), step):
        out += dec.feed(data[i:i + step])
    assert out == items and dec.buffered == 0


def test_transfer_header_layout():
    """The transfer header is state, kind, body size, offset, epoch, epoch start, confirm offset, big-endian."""
    data = codec.encode(codec.Transfer(offset=7, epoch=3, epoch_start=5, confirm_offset=6, body=b"xy"))
    assert codec.TRANSFER_HEADER_SIZE == 34
    assert data[:codec.TRANSFER_HEADER_SIZE] == bytes([2, 5]) + (2).to_bytes(4, "big") + (7).to_bytes(8, "big") \
        + (3).to_bytes(4, "big") + (5).to_bytes(8, "big") + (6).to_bytes(8, "big")
    assert data[codec.TRANSFER_HEADER_SIZE:] == b"xy"


def test_unknown_kind_is_refused():
    """A kind byte no frame has is a FrameError, not a crash."""
    with pytest.raises(codec.FrameError, match="unknown frame kind"):
        codec.FrameDecoder().feed(bytes([2, 99, 0, 0, 0, 0]))


def test_state_must_match_kind():
    """An ACK claiming the HANDSHAKE state is corrupt."""
    data = bytearray(codec.encode(codec.Ack(5)))
    data[0] = codec.HAState.HANDSHAKE
    with pytest.raises(codec.FrameError, match="ACK frame in state"):
        codec.FrameDecoder().feed(bytes(data))


def test_oversized_body_is_refused_before_it_is_buffered():
    """A body larger than the decoder allows is refused from its header alone."""
    dec = codec.FrameDecoder(max_body=10)
    header = codec.encode(codec.Transfer(0, 1, 0, 0, b"x" * 11))[:codec.TRANSFER_HEADER_SIZE]
    with pytest.raises(codec.FrameError, match="exceeds 10"):
        dec.feed(header)


@given(st.binary(max_size=200))
def test_random_bytes_never_crash_the_decoder(data):
    """Garbage gives frames or a FrameError, nothing else."""
    try:
        codec.FrameDecoder(max_body=1000).feed(data)
    except codec.FrameError:
        pass


def test_macs_differ_by_direction_and_secret():
    """The master's and slave's proofs over the same nonces differ, and depend on the secret."""
    a, b = b"a" * 16, b"b" * 16
    assert codec.master_mac("s", a, b) != codec.slave_mac("s", a, b)
    assert codec.master_mac("s", a, b) != codec.master_mac("t", a, b)
    assert codec.mac_ok(codec.slave_mac("s", a, b), codec.slave_mac("s", a, b))
