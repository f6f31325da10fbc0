"""Unit tests of the replication connection state machines, the SyncStateSet and the confirm waiters."""

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from store import ha_codec as codec
from store import record as rec
from store.ha_codec import HAState
from store.ha_connection import (Append, Close, ConfirmAdvanced, MasterConnection, NewEpoch, Send, SlaveAcked,
                                 SlaveConnection, SlaveReady, Truncate)
from store.ha_epochs import EpochEntry as E
from store.ha_sync import ConfirmWaiters, SyncStateSet

SECRET = "s3cret"


class MemLog:
    """A log in memory: the master's LogSource, and what a slave's adapter applies events to."""

    def __init__(self, epochs=(), data=b"", min_offset=0):
        self.data = bytearray(data)
        self.min_offset = min_offset
        self.epoch_list = list(epochs)

    @property
    def max_offset(self):
        return self.min_offset + len(self.data)

    def epochs(self):
        return list(self.epoch_list)

    def read_raw(self, offset, max_bytes):
        pos = offset - self.min_offset
        return bytes(self.data[pos:pos + max_bytes])

    def write(self, *records):
        self.data += b"".join(records)

    def apply(self, events):
        """What the slave's adapter does with the machine's events; returns the bytes to send."""
        out = []
        for ev in events:
            if isinstance(ev, Truncate):
                del self.data[ev.offset - self.min_offset:]
                self.epoch_list = [e for e in self.epoch_list if ev.keep_epoch is not None and e.epoch <= ev.keep_epoch]
            elif isinstance(ev, NewEpoch):
                self.epoch_list.append(ev.entry)
            elif isinstance(ev, Append):
                assert ev.offset == self.max_offset
                self.data += ev.data
            elif isinstance(ev, Send):
                out.append(ev.data)
        return b"".join(out)


def _rec(i, size=20):
    return rec.encode(rec.Message(topic=f"t/{i}", body=bytes([i % 256]) * size), store_ts=1000 + i)


def _nonces():
    counter = itertools.count()
    return lambda n: next(counter).to_bytes(n, "big")


def _sends(events):
    return b"".join(e.data for e in events if isinstance(e, Send))


class Pair:
    """A master and a slave machine joined back to back, as the adapters join them over a socket."""

    def __init__(self, master_log, slave_log, slave_secret=SECRET, master_secret=SECRET, confirm=0, **kw):
        self.mlog, self.slog = master_log, slave_log
        self.master = MasterConnection(master_log, master_secret, nonce=_nonces(), **kw)
        self.slave = SlaveConnection("b2", slave_secret, nonce=_nonces())
        self.now = 0.0
        self.master_events, self.slave_events = [], []
        self.master.connection_made(self.now)
        hello = self.slave.connection_made(self.now, slave_log.max_offset, slave_log.min_offset,
                                           slave_log.epochs(), confirm)
        self.deliver_to_master(_sends(hello))

    def deliver_to_master(self, data):
        while data:
            evs = self.master.receive(data, self.now)
            self.master_events += evs
            data = _sends(evs)
            if not data:
                return
            data = self.deliver_to_slave(data)

    def deliver_to_slave(self, data):
        evs = self.slave.receive(data, self.now)
        self.slave_events += evs
        return self.slog.apply(evs)

    def pump(self, confirm=0):
        for _ in range(1000):
            evs = self.master.pump(self.now, confirm)
            self.master_events += evs
            data = _sends(evs)
            if not data:
                return
            self.deliver_to_master(self.deliver_to_slave(data))
        raise AssertionError("pump did not settle")


def test_handshake_then_records_arrive_byte_identical():
    """After the handshake the slave's log becomes the master's, byte for byte, and acks drive caught-up."""
    m = MemLog([E(1, 0)])
    m.write(*[_rec(i) for i in range(50)])
    p = Pair(m, MemLog(), max_body=300)
    assert p.master.state is HAState.TRANSFER and p.slave.state is HAState.TRANSFER
    assert SlaveReady("b2", 0, False) in p.master_events
    p.now = 1.0
    p.pump(confirm=0)
    assert bytes(p.slog.data) == bytes(m.data)
    assert p.slog.epoch_list == [E(1, 0)]
    assert p.master.acked_offset == m.max_offset
    assert p.master.caught_up_at == 1.0
    acks = [e for e in p.master_events if isinstance(e, SlaveAcked)]
    assert acks[-1].offset == m.max_offset


def test_confirm_offset_reaches_the_slave_capped_at_its_end():
    """The master's confirm offset travels in the header; the slave never claims more than it holds."""
    m = MemLog([E(1, 0)])
    m.write(*[_rec(i) for i in range(5)])
    p = Pair(m, MemLog())
    p.pump(confirm=10**9)
    adv = [e.offset for e in p.slave_events if isinstance(e, ConfirmAdvanced)]
    assert adv and adv[-1] == m.max_offset


def test_new_epoch_in_the_stream_lands_in_the_slave_epoch_file():
    """A transfer in a newer epoch starting at the slave's end is recorded before its records."""
    m = MemLog([E(1, 0)])
    m.write(_rec(1), _rec(2))
    p = Pair(m, MemLog())
    p.pump()
    m.epoch_list.append(E(2, m.max_offset))
    m.write(_rec(3))
    p.now = 2.0
    p.pump()
    assert p.slog.epoch_list == [E(1, 0), E(2, m.max_offset - len(_rec(3)))]
    assert bytes(p.slog.data) == bytes(m.data)


def test_old_master_rejoins_and_truncates_what_the_new_master_never_had():
    """RIP-44 case 2: the slave's extra tail of the old epoch is cut to where the new epoch began."""
    shared = [_rec(i) for i in range(4)]
    old_master = MemLog([E(1, 0)])
    old_master.write(*shared, _rec(90), _rec(91))  # written, never replicated
    new_master = MemLog([E(1, 0)])
    new_master.write(*shared)
    cut = new_master.max_offset
    new_master.epoch_list.append(E(2, cut))
    new_master.write(_rec(10), _rec(11))
    p = Pair(new_master, old_master)
    assert Truncate(cut, 1) in p.slave_events
    p.pump()
    assert bytes(old_master.data) == bytes(new_master.data)
    assert old_master.epoch_list == [E(1, 0), E(2, cut)]


def test_wrong_secret_on_the_slave_is_refused_by_the_master():
    """A fake slave gets no EPOCHS and no records: the master refuses its proof."""
    m = MemLog([E(1, 0)])
    m.write(_rec(1))
    p = Pair(m, MemLog(), slave_secret="guess")
    # The slave also finds the master's proof wrong under its own secret, and refuses first.
    assert p.slave.state is HAState.SHUTDOWN
    assert any(isinstance(e, Close) and e.refused and "failed the cluster secret" in e.reason
               for e in p.slave_events)
    assert not any(isinstance(e, (Append, Truncate)) for e in p.slave_events)


def test_fake_slave_with_a_guessed_proof_is_refused():
    """A peer that sends a PROOF without knowing the secret is refused before any log byte goes out."""
    m = MemLog([E(1, 0)])
    m.write(_rec(1))
    master = MasterConnection(m, SECRET, nonce=_nonces())
    master.connection_made(0.0)
    out = master.receive(codec.encode(codec.Hello("evil", b"n" * 16)), 0.0)
    assert isinstance(codec.FrameDecoder().feed(_sends(out))[0], codec.Challenge)
    out = master.receive(codec.encode(codec.Proof(b"x" * 32, 0)), 0.0)
    frames = codec.FrameDecoder().feed(_sends(out))
    assert frames == [codec.Refused("slave 'evil' failed the cluster secret")]
    assert master.state is HAState.SHUTDOWN
    assert master.pump(1.0, 0) == []


def test_fake_master_cannot_make_a_slave_truncate():
    """A master without the secret is refused at its CHALLENGE; its EPOCHS never reach the walk."""
    slave = SlaveConnection("b2", SECRET, nonce=_nonces())
    slave.connection_made(0.0, 1000, 0, [E(1, 0)])
    out = slave.receive(codec.encode(codec.Challenge(b"m" * 16, b"z" * 32)), 0.0)
    out += slave.receive(codec.encode(codec.Epochs(0, 0, (E(9, 0),))), 0.0)
    assert not any(isinstance(e, Truncate) for e in out)
    assert any(isinstance(e, Close) and e.refused for e in out)


def _transferring_slave(max_offset=0, epochs=(), confirm=0):
    """A slave past its handshake with a master of epochs ``epochs`` (returns the slave and the master nonce)."""
    slave = SlaveConnection("b2", SECRET, nonce=_nonces())
    hello = codec.FrameDecoder().feed(_sends(slave.connection_made(0.0, max_offset, 0, list(epochs), confirm)))[0]
    mn = b"m" * 16
    slave.receive(codec.encode(codec.Challenge(mn, codec.master_mac(SECRET, hello.nonce, mn))), 0.0)
    evs = slave.receive(codec.encode(codec.Epochs(max_offset, 0, tuple(epochs) or (E(1, 0),))), 0.0)
    assert slave.state is HAState.TRANSFER, evs
    return slave


@pytest.mark.parametrize("frame,reason", [
    (codec.Transfer(500, 1, 0, 0, _rec(1)), "beyond this log's end"),
    (codec.Transfer(100, 1, 0, 0, _rec(1)), "behind this log's end"),
    (codec.Transfer(200, 0, 0, 0, _rec(1)), "older than this log's epoch"),
    (codec.Transfer(200, 1, 50, 0, _rec(1)), "starts at 50 for the master"),
    (codec.Transfer(200, 2, 150, 0, _rec(1)), "cannot begin a transfer"),
    (codec.Transfer(200, 1, 0, 0, _rec(1)[:-1] + b"\x00"), "corrupt body"),
    (codec.Transfer(200, 1, 0, 0, _rec(1)[:-3]), "corrupt body"),
])
def test_bad_transfers_are_refused_and_append_nothing(frame, reason):
    """Wrong offsets, wrong epochs and corrupt bodies are refused: nothing is appended or truncated."""
    slave = _transferring_slave(200, [E(1, 0)])
    out = slave.receive(codec.encode(frame), 1.0)
    assert not any(isinstance(e, (Append, Truncate, NewEpoch)) for e in out)
    closes = [e for e in out if isinstance(e, Close)]
    assert closes and closes[0].refused and reason in closes[0].reason
    assert slave.epochs == [E(1, 0)] and slave.max_offset == 200


def test_handshake_never_truncates_below_the_confirm_offset():
    """A master whose epochs would cut confirmed records is refused, and the slave keeps its log."""
    slave = SlaveConnection("b2", SECRET, nonce=_nonces())
    hello = codec.FrameDecoder().feed(_sends(slave.connection_made(0.0, 1000, 0, [E(1, 0)], confirm_offset=800)))[0]
    mn = b"m" * 16
    slave.receive(codec.encode(codec.Challenge(mn, codec.master_mac(SECRET, hello.nonce, mn))), 0.0)
    out = slave.receive(codec.encode(codec.Epochs(2000, 0, (E(1, 0), E(2, 500)))), 0.0)
    assert not any(isinstance(e, Truncate) for e in out)
    assert any(isinstance(e, Close) and "below the confirm offset 800" in e.reason for e in out)


def test_no_common_epoch_is_refused_not_guessed():
    """Logs that never shared a master are not replicated over each other."""
    slave = _handshaking_slave(1000, [E(3, 0)])
    out = slave.receive(codec.encode(codec.Epochs(2000, 0, (E(4, 0),))), 0.0)
    assert not any(isinstance(e, Truncate) for e in out)
    assert any(isinstance(e, Close) and "no common epoch" in e.reason for e in out)


def test_an_empty_slave_drops_epochs_the_master_never_saw():
    """An old master relaunched over an empty log whose epoch the new master never heard of (none of its records
    reached it) drops that epoch and replicates: it holds nothing to lose."""
    slave = _handshaking_slave(0, [E(1, 0)])
    out = slave.receive(codec.encode(codec.Epochs(0, 0, (E(2, 0),))), 0.0)
    assert not any(isinstance(e, Close) for e in out)
    assert [e for e in out if isinstance(e, Truncate)] == [Truncate(0, None)]
    assert slave.state == HAState.TRANSFER and slave.epochs == []


def _handshaking_slave(max_offset, epochs):
    slave = SlaveConnection("b2", SECRET, nonce=_nonces())
    hello = codec.FrameDecoder().feed(_sends(slave.connection_made(0.0, max_offset, 0, epochs)))[0]
    mn = b"m" * 16
    slave.receive(codec.encode(codec.Challenge(mn, codec.master_mac(SECRET, hello.nonce, mn))), 0.0)
    return slave


def test_master_refuses_an_ack_beyond_its_end():
    """A slave that claims a log longer than the master's is refused (it must not be counted as confirmed)."""
    m = MemLog([E(1, 0)])
    m.write(_rec(1))
    master = MasterConnection(m, SECRET, nonce=_nonces())
    master.connection_made(0.0)
    ch = codec.FrameDecoder().feed(_sends(master.receive(codec.encode(codec.Hello("b2", b"n" * 16)), 0.0)))[0]
    master.receive(codec.encode(codec.Proof(codec.slave_mac(SECRET, b"n" * 16, ch.nonce), 0)), 0.0)
    out = master.receive(codec.encode(codec.Ack(m.max_offset + 1)), 0.0)
    assert any(isinstance(e, Close) and "beyond this master's end" in e.reason for e in out)


def test_window_bounds_what_is_in_flight():
    """The master stops sending once ``window`` bytes are unacknowledged."""
    m = MemLog([E(1, 0)])
    m.write(*[_rec(i, 100) for i in range(100)])
    p = Pair(m, MemLog(), max_body=200, window=1000)
    evs = p.master.pump(1.0, 0)
    sent = sum(len(codec.FrameDecoder().feed(e.data)[0].body) for e in evs if isinstance(e, Send))
    assert 1000 <= sent < 1000 + 200


def test_a_slave_behind_what_retention_kept_is_refused_not_crashed():
    """If retention deletes what a slave still needs, the master refuses it with the reason instead of reading."""
    m = MemLog([E(1, 0)])
    m.write(*[_rec(i) for i in range(10)])
    p = Pair(m, MemLog(), window=100, max_body=60)
    p.master.pump(1.0, 0)  # sends some, then waits for acks that never come
    m.min_offset += 200  # retention: the first bytes go
    del m.data[:200]
    p.master.acked_offset = p.master.transfer_offset = 0
    out = p.master.pump(2.0, 0)
    assert any(isinstance(e, Close) and "retention deleted" in e.reason for e in out)


def test_a_record_larger_than_max_body_goes_alone():
    """One record bigger than the body cap is still sent, whole, in a frame of its own."""
    m = MemLog([E(1, 0)])
    m.write(_rec(1, 5000), _rec(2))
    p = Pair(m, MemLog(), max_body=100)
    p.pump()
    assert bytes(p.slog.data) == bytes(m.data)


def test_heartbeats_keep_both_sides_alive_and_silence_closes():
    """An idle master sends empty transfers each heartbeat; a peer silent past the timeout is closed."""
    m = MemLog([E(1, 0)])
    p = Pair(m, MemLog(), heartbeat_s=1.0, timeout_s=3.0)
    for t in range(1, 10):
        p.now = float(t)
        p.pump()
        assert p.master.tick(p.now) == [] and p.slave.tick(p.now) == []
    assert p.slave.tick(20.0) == [Close("no frame from the peer for 5 s")]
    assert p.master.tick(20.0) and p.master.state is HAState.SHUTDOWN


def test_suspend_holds_records_but_not_heartbeats():
    """A suspended connection sends only heartbeats until resumed."""
    m = MemLog([E(1, 0)])
    p = Pair(m, MemLog(), heartbeat_s=1.0)
    p.master.suspend()
    m.write(_rec(1))
    p.now = 5.0
    p.pump()
    assert p.master.state is HAState.SUSPEND and len(p.slog.data) == 0
    p.master.resume()
    p.pump()
    assert bytes(p.slog.data) == bytes(m.data)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=30), st.integers(1, 40), st.integers(60, 2000))
def test_any_split_of_the_stream_replicates_the_same_bytes(sizes, step, max_body):
    """However the socket splits the bytes, the slave ends with the master's log."""
    m = MemLog([E(1, 0)])
    m.write(*[_rec(i, n) for i, n in enumerate(sizes)])
    master = MasterConnection(m, SECRET, nonce=_nonces(), max_body=max_body)
    slave = SlaveConnection("b2", SECRET, nonce=_nonces())
    slog = MemLog()
    master.connection_made(0.0)
    to_master = _sends(slave.connection_made(0.0, 0, 0, []))
    to_slave = b""
    # bounded by what it moves: one byte a step (step=1) over up to 30 records of 300 B with their framing
    for _ in range(200_000):
        if to_master:
            chunk, to_master = to_master[:step], to_master[step:]
            to_slave += _sends(master.receive(chunk, 0.0))
        elif to_slave:
            chunk, to_slave = to_slave[:step], to_slave[step:]
            to_master += slog.apply(slave.receive(chunk, 0.0))
        else:
            to_slave += _sends(master.pump(0.0, 0))
            if not to_slave:
                break
    assert bytes(slog.data) == bytes(m.data)


# -- SyncStateSet and confirm waiters ---------------------------------------------------------------

def test_confirm_offset_is_the_smallest_max_offset_in_the_set():
    """Only members count; the confirm offset never goes back."""
    s = SyncStateSet("b1", {"b1", "b2", "b3"})
    s.connected("b2", 0, False, 0.0)
    s.connected("b3", 0, False, 0.0)
    s.acked("b2", 500, 1.0)
    s.acked("b3", 300, 1.0)
    assert s.confirm_offset(1000) == 300
    s.connected("b4", 0, False, 0.0)  # not a member: does not hold the confirm offset back
    assert s.confirm_offset(1000) == 300
    s.apply(frozenset({"b1", "b2"}), 1)
    assert s.confirm_offset(1000) == 500
    s.apply(frozenset({"b1", "b2", "b3"}), 2)
    assert s.confirm_offset(1000) == 500


def test_shrink_a_slave_not_caught_up_in_time_or_disconnected():
    """A member not caught up for the allowed time, or gone, is proposed out; the master stays."""
    s = SyncStateSet("b1", {"b1", "b2", "b3"}, max_time_not_caught_up_s=15.0)
    s.connected("b2", 0, False, 0.0)
    s.connected("b3", 0, False, 0.0)
    s.acked("b2", 100, 10.0)
    s.acked("b3", 100, 10.0)
    assert s.proposal(20.0, 100) is None
    s.acked("b2", 200, 20.0)
    assert s.proposal(26.0, 200) == frozenset({"b1", "b2"})  # b3 last caught up at 10 s
    s.disconnected("b2")
    assert s.proposal(26.0, 200) == frozenset({"b1"})


def test_expand_a_slave_whose_ack_reaches_the_confirm_offset():
    """A connected slave joins once its ack reaches the confirm offset; an async learner never does."""
    s = SyncStateSet("b1", {"b1"})
    s.connected("b2", 0, False, 0.0)
    s.connected("b3", 0, True, 0.0)
    s.acked("b3", 1000, 1.0)
    assert s.proposal(1.0, 1000) is None  # confirm 1000 (a group of one): b2 at 0 is behind
    s.acked("b2", 1000, 1.0)
    assert s.proposal(1.0, 1000) == frozenset({"b1", "b2"})


def test_confirm_waiters_fire_in_order_once_passed():
    """A waiter fires when the confirm offset reaches its offset, not before."""
    w = ConfirmWaiters()
    fired = []
    for off in (300, 100, 200):
        w.wait(off).addCallback(lambda c, off=off: fired.append((off, c)))
    w.advance(150)
    assert fired == [(100, 150)]
    w.advance(300)
    assert fired == [(100, 150), (200, 300), (300, 300)]
    d = w.wait(50)
    assert d.called and len(w) == 0


def test_confirm_offset_file_keeps_the_last_offset_and_reads_garbage_as_none(tmp_path):
    """The file holds the last offset written; a missing or damaged one reads as None, never as a number."""
    from store.ha_sync import ConfirmOffsetFile

    f = ConfirmOffsetFile(str(tmp_path))
    assert f.read() is None
    assert f.write(123) and not f.write(123)
    assert ConfirmOffsetFile(str(tmp_path)).read() == 123
    (tmp_path / "confirm_offset").write_bytes(b"12x\n")
    assert f.read() is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=80), st.sampled_from([
    codec.encode(codec.Transfer(200, 1, 0, 0, _rec(1))), codec.encode(codec.Transfer(0, 9, 0, 10**9, b"")),
    codec.encode(codec.Epochs(0, 0, (E(7, 0),))), codec.encode(codec.Ack(5)), codec.encode(codec.Refused("x")),
])), max_size=8))
def test_garbage_after_the_handshake_never_crashes_or_truncates(chunks):
    """Whatever bytes follow the handshake, the slave answers with events (a refusal at worst), never an exception,
    never a Truncate, and its log only grows at its end."""
    slave = _transferring_slave(200, [E(1, 0)], confirm=200)
    for chunk in chunks:
        for ev in slave.receive(chunk, 1.0):
            assert not isinstance(ev, Truncate)
            if isinstance(ev, Append):
                assert ev.offset == 200
    assert slave.max_offset >= 200


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=8))
def test_garbage_from_a_slave_never_crashes_the_master(chunks):
    """Random bytes at the master's ha port give events (a refusal at worst), never an exception, never records."""
    m = MemLog([E(1, 0)])
    m.write(_rec(1))
    master = MasterConnection(m, SECRET, nonce=_nonces())
    master.connection_made(0.0)
    for chunk in chunks:
        master.receive(chunk, 0.0)
    assert master.state in (HAState.HANDSHAKE, HAState.SHUTDOWN)
    assert not any(isinstance(e, Send) for e in master.pump(1.0, 0))


def test_a_slave_keeping_up_under_steady_load_counts_as_caught_up():
    """With records arriving all the time, each ack trails the newest frame; the slave is caught up as of the
    frame its ack covers, so a healthy slave is never taken for one that fell behind."""
    m = MemLog([E(1, 0)])
    p = Pair(m, MemLog(), heartbeat_s=100.0)
    pending = b""
    for t in range(1, 40):
        p.now = float(t)
        m.write(_rec(t))
        sent = _sends(p.master.pump(p.now, 0))  # this second's frame goes out ...
        if pending:
            p.deliver_to_master(p.deliver_to_slave(pending))  # ... while the previous one's ack comes back
        pending = sent
    assert p.master.caught_up_at >= 37.0


def test_a_slave_that_keeps_up_under_load_joins_though_the_master_moved_on():
    """Under steady load the master's end moves every tick: a slave whose acks show it had all of the master's
    log a moment ago joins; one far behind (a reconnect's grace is not an ack) does not."""
    s = SyncStateSet("b1", {"b1"})
    s.connected("b2", 0, False, 10.0)
    s.connected("b3", 0, False, 10.0)  # connected now, far behind: no join on the connect alone
    s.acked("b2", 5000, 10.0)  # it acked what the master sent at 10.0, its whole log then
    assert s.proposal(10.1, 5200) == frozenset({"b1", "b2"})  # the master appended 200 meanwhile
    s.acked("b3", 100, 0.0)
    assert "b3" not in (s.proposal(10.1, 5200) or ())
