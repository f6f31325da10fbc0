"""Crash test: SIGKILL a process appending to the store, 20 times, and check what survives."""

import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest
from twisted.internet import task

import lightqueue
from store.config import StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore

CHILD = os.path.join(os.path.dirname(__file__), "store_crash_child.py")
KILLS = 20


def _open(data_dir):
    clock = task.Clock()
    clock.advance(time.time())
    store = MessageStore(data_dir, StoreConfig(segment_size=256 * 1024), clock, SynchronousExecutor())
    index = lightqueue.attach(store)
    store.open()
    return store, index


def _queue_contents(index):
    contents = {name: [e.cl_offset for e in _all_entries(index, name)] for name in index.queue_names()}
    return {name: offsets for name, offsets in contents.items() if offsets}  # empty queues are interest, not data


def _all_entries(index, name):
    out, off = [], index.min_offset(name)
    while True:
        batch = index.entries(name, off, 1000)
        if not batch:
            return out
        out.extend(batch)
        off = batch[-1].queue_offset + 1


def _run_child_until_killed(data_dir, run_id, rng):
    proc = subprocess.Popen([sys.executable, CHILD, data_dir, str(run_id)], stdout=subprocess.PIPE)
    fd = proc.stdout.fileno()
    buf = b""
    start = time.monotonic()
    while b"READY\n" not in buf and time.monotonic() - start < 60:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, "child exited before it was ready"
            buf += chunk
    deadline = time.monotonic() + rng.uniform(0.2, 1.2)
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            buf += os.read(fd, 1 << 20)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    while True:  # what the child wrote before it died is still in the pipe
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        buf += chunk
    proc.stdout.close()
    acked = []
    for line in buf.decode().splitlines():
        if line.startswith("ACK ") and line.count(" ") == 2:
            _, key, offset = line.split()
            acked.append((key, int(offset)))
    return acked


@pytest.mark.slow
def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path):
    """Every acknowledged append survives SIGKILL, and the index equals a full rebuild from the log."""
    rng = random.Random(int(os.environ.get("CRASH_SEED", "7")))
    data_dir = str(tmp_path / "node")
    acked_all: dict[str, int] = {}
    for run in range(KILLS):
        acked = _run_child_until_killed(data_dir, run, rng)
        assert acked, f"run {run}: the child acknowledged nothing before the kill"
        acked_all.update(acked)

        store, index = _open(data_dir)
        bodies = {}
        last = -1
        for r in store.commit_log.iterate(0):
            assert r.offset > last, "commit-log offsets must keep increasing"
            last = r.offset
            key = r.body.decode()
            assert key not in bodies, f"record {key} appended twice"
            bodies[key] = r.offset
        missing = [k for k in acked_all if k not in bodies]
        assert not missing, f"run {run}: {len(missing)} acknowledged records lost, e.g. {missing[:3]}"
        assert all(bodies[k] == off for k, off in acked_all.items())
        live = _queue_contents(index)
        store.close()

        rebuild_dir = str(tmp_path / f"rebuild{run}")
        os.makedirs(rebuild_dir)
        shutil.copytree(os.path.join(data_dir, "commitlog"), os.path.join(rebuild_dir, "commitlog"))
        rebuilt_store, rebuilt_index = _open(rebuild_dir)
        rebuilt = _queue_contents(rebuilt_index)
        rebuilt_store.close()
        shutil.rmtree(rebuild_dir)
        assert live == rebuilt, f"run {run}: index after recovery differs from a rebuild from the log"
        for name, offsets in live.items():
            assert offsets == sorted(set(offsets)), f"run {run}: duplicate or unordered entries in {name}"
        many = live.get("%LMQ%crash/many/#", [])
        assert many, "topics matching 20 filters must be indexed"
