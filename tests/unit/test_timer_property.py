"""Property tests of the timer against a sorted-list model, including crashes and replay."""

import bisect
import os
import tempfile

from hypothesis import given, settings, strategies as st

from store.timer import Timer

P, N = 10, 8  # an 80 ms wheel: delays up to 600 ms roll up to ~15 times

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(-30, 600)),
        st.tuples(st.just("advance"), st.integers(0, 120)),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
    ),
    max_size=80,
)


class _Model:
    """Pending entries as a sorted list of (due slot, deliver_at, offset); its own read pointer."""

    def __init__(self):
        self.pending, self.read = [], 0

    def enqueue(self, at, off):
        bisect.insort(self.pending, (max(-(-at // P) * P, self.read), at, off))

    def advance(self, now):
        cut = bisect.bisect_right(self.pending, (now - now % P, float("inf"), 0))
        due, self.pending = self.pending[:cut], self.pending[cut:]
        self.read = max(self.read, now - now % P + P)
        return due


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_every_entry_comes_out_exactly_once_and_never_early(ops):
    """Random enqueues, cancels and advances: the timer hands out exactly what the model says, when it says."""
    with tempfile.TemporaryDirectory() as d:
        t, model, now, off = Timer(d, slot_count=N, precision_ms=P), _Model(), 0, 0
        t.advance(0)
        model.advance(0)
        for op, arg in ops:
            if op == "enqueue":
                t.enqueue(now + arg, off, 1, "t", now_ms=now)
                model.enqueue(now + arg, off)
                off += 1
            elif op == "cancel" and model.pending:
                _, at, victim = model.pending[arg % len(model.pending)]
                t.cancel(victim, at, now_ms=now)
                model.pending = [e for e in model.pending if e[2] != victim]
            elif op == "advance":
                now += arg
                got = t.advance(now)
                want = model.advance(now)
                assert all(e.deliver_at_ms <= now for e in got)
                assert sorted((e.deliver_at_ms, e.cl_offset) for e in got) == sorted((at, o) for _, at, o in want)
        now += 700
        assert sorted(e.cl_offset for e in t.advance(now)) == sorted(o for _, _, o in model.advance(now))
        t.close()


_crash_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(-30, 400)),
        st.tuples(st.just("advance"), st.integers(0, 60)),
        st.tuples(st.just("checkpoint"), st.just(0)),
        st.tuples(st.just("crash"), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=100, deadline=None)
@given(_crash_ops)
def test_crashes_lose_nothing_and_repeat_only_after_the_checkpoint(ops):
    """Kill -9 at random points, recover from the last saved checkpoint and replay the commit log:
    every entry comes out, never early, and only entries handed out after that checkpoint come out twice."""
    with tempfile.TemporaryDirectory() as d:
        records, delivered = [], {}  # commit log: (offset, deliver_at); offset -> times handed out
        t, now, saved, since_saved = Timer(d, slot_count=N, precision_ms=P), 0, None, set()
        may_repeat = set()  # handed out after the checkpoint in force when a crash happened

        def advance():
            for e in t.advance(now):
                assert e.deliver_at_ms <= now
                if delivered.get(e.cl_offset):
                    assert e.cl_offset in may_repeat, f"{e.cl_offset} repeated though checkpointed"
                    may_repeat.discard(e.cl_offset)
                delivered[e.cl_offset] = delivered.get(e.cl_offset, 0) + 1
                since_saved.add(e.cl_offset)

        for op, arg in ops:
            if op == "enqueue":
                records.append((len(records) * 10, now + arg))
                t.enqueue(now + arg, len(records) * 10 - 10, 1, "t", now_ms=now)
            elif op == "advance":
                now += arg
                advance()
            elif op == "checkpoint":
                cp = t.checkpoint()
                t.flush()
                saved, since_saved = cp, set()
                t.checkpoint_saved(cp)
            else:
                if arg:
                    t.log.write_out()  # else the write buffer dies with the process
                os.close(t.log._write_fd)
                for fd in t.log._read_fds.values():
                    os.close(fd)
                t = Timer(d, saved, slot_count=N, precision_ms=P)
                for o, at in records:  # the store replays its commit log
                    t.enqueue(at, o, 1, "t", now_ms=now)
                # what was handed out after the saved checkpoint may come out again
                # (everything, if none was saved: the timer starts over)
                may_repeat |= set(delivered) if saved is None else since_saved
                since_saved = set()
        now += 600
        advance()
        assert sorted(delivered) == [o for o, _ in records]
        t.close()
