"""Unit tests of the timer: due times, rolls, delete markers, idempotent enqueue, recovery.

The clock is the ``now_ms`` argument: nothing sleeps.
"""

import os

import pytest

from store.timer import EnqueueStatus, Timer, TimerCheckpoint, TimerConfigError
from store.timer_log import UNIT_SIZE, UnitFlag
from store.timer_wheel import PREVIOUS_SUFFIX, WHEEL_FILE

P = 10  # precision (ms) used by most tests
N = 16  # slots: a 160 ms window, so rolls are cheap to provoke


def _timer(path, cp=None, **kw):
    kw.setdefault("slot_count", N)
    kw.setdefault("precision_ms", P)
    return Timer(str(path), cp, **kw)


def _crash(timer):
    """Drop the timer as a kill -9 would: buffered units are lost, nothing is flushed."""
    log = timer.log
    os.close(log._write_fd)
    for fd in log._read_fds.values():
        os.close(fd)


def _run(timer, until, step=1, start=None):
    """Advance one ``step`` at a time; return ``{cl_offset: now at which it came out}``."""
    out = {}
    now = timer.read_time_ms if start is None else start
    while now <= until:
        for e in timer.advance(now):
            assert e.cl_offset not in out, f"{e.cl_offset} handed out twice"
            assert e.deliver_at_ms <= now, f"{e.cl_offset} handed out early"
            out[e.cl_offset] = now
        now += step
    return out


def _ceil(t):
    return -(-t // P) * P


@pytest.mark.parametrize("deliver_at", [0, 1, 9, 10, 11, 55, 100, 150])
def test_entry_comes_out_at_the_first_advance_at_or_after_its_slot(tmp_path, deliver_at):
    """An entry for t is handed out by advance(t') for the first t' >= ceil_p(t), never earlier."""
    t = _timer(tmp_path)
    assert t.enqueue(deliver_at, 1, 10, "a", now_ms=0) is EnqueueStatus.PUT_OK
    assert _run(t, 400) == {1: _ceil(deliver_at)}


def test_overdue_entry_comes_out_at_the_next_advance(tmp_path):
    """An entry enqueued for a time the wheel has passed is due in the next slot, not lost."""
    t = _timer(tmp_path)
    t.advance(100)
    t.enqueue(50, 1, 10, "a", now_ms=105)
    assert t.advance(105) == []
    assert [e.cl_offset for e in t.advance(110)] == [1]


def test_many_entries_in_one_slot_come_out_in_time_order(tmp_path):
    """A thousand entries in one slot come out once each, ordered by time, ties oldest first."""
    t = _timer(tmp_path)
    times = [41 + (i * 7) % 9 for i in range(1000)]
    for i, at in enumerate(times):
        t.enqueue(at, i, 1, "a", now_ms=0)
    assert t.advance(49) == []
    out = t.advance(50)
    assert [(e.deliver_at_ms, e.cl_offset) for e in out] == sorted((at, i) for i, at in enumerate(times))


def test_wheel_wraps_around_many_times(tmp_path):
    """Entries scheduled over ten windows, enqueued as time passes, each come out at their slot."""
    t = _timer(tmp_path)
    due, out, off = {}, {}, 0
    for now in range(0, 10 * N * P):
        if now % 3 == 0:
            at = now + (now * 37) % (N * P - P)  # within the window: no roll
            assert t.enqueue(at, off, 1, "a", now_ms=now) is EnqueueStatus.PUT_OK
            due[off] = _ceil(at)
            off += 1
        for e in t.advance(now):
            out[e.cl_offset] = now
    out.update(_run(t, 12 * N * P, start=now + 1))
    assert out == due


def test_long_delay_rolls_several_times(tmp_path):
    """A delay of five windows is parked and re-placed several times, then comes out on time."""
    t = _timer(tmp_path)
    at = 5 * N * P + 3
    assert t.enqueue(at, 7, 10, "a", now_ms=0) is EnqueueStatus.PUT_ROLLED
    assert _run(t, at + 100) == {7: _ceil(at)}
    units = [u for _, u in t.log.iter_units(0)]
    rolls = [u for u in units if u.flags & UnitFlag.ROLL]
    assert len(rolls) >= 5
    assert all(u.slot_time < u.write_time + N * P for u in units)  # never beyond the wheel
    assert units[-1].flags == UnitFlag.REQUEUE and units[-1].slot_time == _ceil(at)


def test_delete_marker_cancels_entry(tmp_path):
    """cancel() hides a normal entry and a rolled one; the others in their slots still come out."""
    t = _timer(tmp_path)
    t.enqueue(55, 1, 1, "a", now_ms=0)
    t.enqueue(55, 2, 1, "a", now_ms=0)
    t.enqueue(900, 3, 1, "a", now_ms=0)  # rolled
    t.enqueue(901, 4, 1, "a", now_ms=0)  # rolled
    t.cancel(1, 55, now_ms=0)
    t.advance(300)
    t.cancel(3, 900, now_ms=300)  # the entry is parked; so is the marker, elsewhere
    assert _run(t, 1000, start=301) | {} == {4: 910}
    t2 = _timer(tmp_path / "b")
    t2.enqueue(55, 1, 1, "a", now_ms=0)
    t2.enqueue(55, 2, 1, "a", now_ms=0)
    t2.cancel(1, 55, now_ms=0)
    assert [e.cl_offset for e in t2.advance(60)] == [2]


def test_cancel_after_delivery_is_a_no_op(tmp_path):
    """A delete marker for an entry already handed out changes nothing."""
    t = _timer(tmp_path)
    t.enqueue(20, 1, 1, "a", now_ms=0)
    assert [e.cl_offset for e in t.advance(20)] == [1]
    t.cancel(1, 20, now_ms=25)
    t.enqueue(40, 2, 1, "a", now_ms=25)
    assert _run(t, 100, start=26) == {2: 40}


def test_enqueue_is_idempotent_for_replayed_offsets(tmp_path):
    """A commit-log offset at or below the last one enqueued is ignored."""
    t = _timer(tmp_path)
    assert t.enqueue(30, 5, 1, "a", now_ms=0) is EnqueueStatus.PUT_OK
    assert t.enqueue(30, 5, 1, "a", now_ms=0) is EnqueueStatus.DUPLICATE
    assert t.enqueue(40, 3, 1, "a", now_ms=0) is EnqueueStatus.DUPLICATE
    assert t.last_cl_offset == 5
    assert _run(t, 100) == {5: 30}


# -- recovery ------------------------------------------------------------------------


class _Store:
    """A stand-in for the store: a commit log of TIMER records it replays into the timer."""

    def __init__(self):
        self.records = []  # (cl_offset, deliver_at)

    def put(self, timer, deliver_at, now):
        off = len(self.records) * 100
        self.records.append((off, deliver_at))
        timer.enqueue(deliver_at, off, 100, "t", now_ms=now)
        return off

    def replay(self, timer, now):
        for off, at in self.records:
            timer.enqueue(at, off, 100, "t", now_ms=now)


def _save(timer):
    cp = timer.checkpoint()
    timer.flush()
    timer.checkpoint_saved(cp)
    return TimerCheckpoint.from_json(cp.to_json())


def test_clean_restart_resumes_where_it_stopped(tmp_path):
    """After a checkpoint and close, a new timer hands out exactly what was still pending."""
    store, t = _Store(), _timer(tmp_path)
    for i in range(50):
        store.put(t, 7 * i, now=0)  # 0..343 ms: some roll
    first = _run(t, 100, start=0)
    cp = _save(t)
    t.close()
    t = _timer(tmp_path, cp)
    assert t.recovery.snapshot.endswith(WHEEL_FILE) and t.recovery.units_rechained == 0
    rest = _run(t, 500, start=101)
    assert sorted(first) + sorted(rest) == [i * 100 for i in range(50)]


@pytest.mark.parametrize("wheel", ["stale", "missing", "ahead"])
def test_kill_after_unflushed_work_loses_nothing(tmp_path, wheel):
    """After a kill -9 with a stale, missing or too new wheel and a torn log tail, every entry comes out once.

    Entries handed out before the checkpoint do not come out again; the owner
    replays the commit log after ``last_cl_offset``.
    """
    store, t = _Store(), _timer(tmp_path)
    for i in range(40):
        store.put(t, 3 + 11 * i, now=0)  # up to 432 ms: several roll
    t.flush()  # the wheel snapshot is now behind what follows
    delivered = _run(t, 60, start=0)
    for i in range(40, 80):
        store.put(t, 70 + 5 * i, now=60)
    cp = t.checkpoint()  # saved by the owner without a flush: the wheel on disk is stale
    delivered_before_cp = dict(delivered)
    if wheel == "ahead":
        delivered.update(_run(t, 80, start=61))
        t.flush()
        t.flush()  # both snapshots are now newer than the checkpoint
    for i in range(80, 90):
        store.put(t, 100 + i, now=80)  # after the checkpoint: cut on recovery, replayed
    t.log.write_out()
    _crash(t)
    seg = os.path.join(tmp_path, "log", sorted(os.listdir(tmp_path / "log"))[-1])
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00<\xff\xff")  # a torn unit
    if wheel == "missing":
        os.remove(tmp_path / WHEEL_FILE)
        os.remove(tmp_path / (WHEEL_FILE + PREVIOUS_SUFFIX)) if os.path.exists(
            tmp_path / (WHEEL_FILE + PREVIOUS_SUFFIX)) else None

    t = _timer(tmp_path, cp)
    r = t.recovery
    assert r.torn_bytes == 6 and r.rolled_back_bytes > 0
    assert r.snapshot is None if wheel != "stale" else r.snapshot.endswith(WHEEL_FILE)
    assert r.units_rechained > 0 and r.units_revised == 0
    assert t.last_cl_offset == 79 * 100 and t.read_time_ms == 70
    store.replay(t, now=cp.read_time_ms)
    after = _run(t, 2000, start=cp.read_time_ms)
    assert set(after).isdisjoint(delivered_before_cp)
    assert sorted(list(delivered_before_cp) + list(after)) == [i * 100 for i in range(90)]


def test_log_shorter_than_checkpoint_asks_for_an_earlier_replay(tmp_path):
    """If the log lost units the checkpoint names, last_cl_offset drops so the owner replays them."""
    store, t = _Store(), _timer(tmp_path)
    for i in range(10):
        store.put(t, 50 + i, now=0)
    cp = _save(t)
    t.close()
    seg = os.path.join(tmp_path, "log", os.listdir(tmp_path / "log")[0])
    os.truncate(seg, 6 * UNIT_SIZE)
    t = _timer(tmp_path, cp)
    assert t.recovery.missing_bytes == 4 * UNIT_SIZE and t.last_cl_offset == 500
    store.replay(t, now=0)
    assert sorted(_run(t, 200, start=0)) == [i * 100 for i in range(10)]


def test_changed_geometry_is_refused(tmp_path):
    """A checkpoint taken with another precision or slot count is refused with a clear error."""
    t = _timer(tmp_path)
    t.enqueue(5, 1, 1, "a", now_ms=0)
    cp = _save(t)
    t.close()
    with pytest.raises(TimerConfigError, match="slots"):
        _timer(tmp_path, cp, precision_ms=100)


def test_consumed_segments_are_deleted_once_a_checkpoint_is_saved(tmp_path):
    """checkpoint_saved() drops timer-log segments whose every unit is consumed, and recovery still works."""
    t = _timer(tmp_path, segment_units=8)
    for i in range(40):
        t.enqueue(i * 5, i, 1, "a", now_ms=0)  # rolls beyond 160 ms
    out = _run(t, 150, start=0)
    assert len(t.log.segments()) > 2
    cp = _save(t)
    assert t.log.start > 0
    t.close()
    t = _timer(tmp_path, cp, segment_units=8)
    out.update(_run(t, 400, start=151))
    assert sorted(out) == list(range(40))


def test_advance_with_a_budget_stops_after_a_whole_slot_and_resumes(tmp_path):
    """advance(now, max_units) reads whole slots until the budget is spent; the next call goes on, none lost."""
    t = _timer(tmp_path)
    offsets = iter(range(1, 100))
    for slot_time, count in ((10, 3), (20, 4), (30, 2)):
        for _ in range(count):
            t.enqueue(slot_time, next(offsets), 100, "a", now_ms=0)
    first = t.advance(40, max_units=5)  # slot 10 (3) is under budget, slot 20 (4) spends it
    assert [e.deliver_at_ms for e in first] == [10] * 3 + [20] * 4
    assert t.read_time_ms == 30
    rest = t.advance(40, max_units=5)
    assert [e.cl_offset for e in rest] == [8, 9]
    assert t.read_time_ms == 50
    t.close()
