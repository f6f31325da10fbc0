"""Upgrade: a data dir written by the code before session records (main at ``BASE``) starts with its sessions.

The old node runs from a ``git archive`` of ``BASE`` (this repository's history)
on this venv, as bench/cost_bench.py runs old code; a persistent session
subscribes there and messages are stored for it while it is offline. The new
node on the same data dir must upgrade it (the session KV appended to the log
once), resume the session (CONNACK session present) and deliver the messages;
and a session KV deleted afterwards is rebuilt from the log alone.
"""

import os
import shutil
import subprocess
import time

import pytest

from bench.brokers import free_port
from bench.stall_bench import extract, start_node, stop_node
from mqtt_proxy.codec import Properties, PubAck, Publish, SubAck, Subscribe, Subscription, SubscriptionOptions
from store import reader
from store.record import RecordKind
from tests.integration.mqtt_raw import RawClient
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow

BASE = "24d8f07"  # main before session state went into the commit log
PERSIST = Properties(session_expiry_interval=3600)
MESSAGES = 5


def _session_records(data_dir):
    return [r for r in reader.iter_records(os.path.join(data_dir, "commitlog")) if r.kind is RecordKind.SESSION]


def _resume_and_drain(port):
    """Reconnect the persistent session; (session present, payloads received) within a bounded wait."""
    c = RawClient(port, 5, timeout=5.0)
    try:
        ack = c.connect("upgraded", clean_start=False, properties=PERSIST)
        got = []
        deadline = time.monotonic() + 10
        while len(got) < MESSAGES and time.monotonic() < deadline:
            try:
                p = c.recv(0.5)
            except TimeoutError:
                continue
            if isinstance(p, Publish):
                got.append(p.payload.decode())
                c.send(PubAck(p.packet_id))
        return ack.session_present, got
    finally:
        c.close()


def test_data_dir_of_the_previous_code_is_upgraded(tmp_path):
    """Sessions and messages of a data dir from before the session log are there after the upgrade, and in the log."""
    old_src = tmp_path / "old-src"
    try:
        extract(BASE, old_src)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"commit {BASE} is not in this checkout's history: {exc}")
    work = tmp_path / "old"
    port = free_port()
    node = start_node("old", old_src, work, ["--mqtt", f"tcp:{port}:interface=127.0.0.1"],
                      samples=work / "lag.json", probe_ms=1000.0, config="")
    try:
        c = RawClient(port, 5)
        c.connect("upgraded", clean_start=False, properties=PERSIST)
        c.send(Subscribe(1, (Subscription("up/+/t", SubscriptionOptions(qos=1)),)))
        assert isinstance(c.recv_until(SubAck)[0], SubAck)
        c.close()
        pub = RawClient(port, 5)
        pub.connect("upgrade-pub")
        for i in range(MESSAGES):
            pub.send(Publish("up/x/t", f"m{i}".encode(), qos=1, packet_id=i + 1))
            assert isinstance(pub.recv_until(PubAck)[0], PubAck)
        pub.close()
    finally:
        stop_node(node)
    data_dir = str(work / "data")
    assert _session_records(data_dir) == []  # the old code kept sessions in the KV only

    new = NodeProcess(data_dir, listeners=("mqtt",))
    try:
        new.start()
        present, got = _resume_and_drain(new.port())
    finally:
        new.stop()
    assert present
    assert sorted(got) == [f"m{i}" for i in range(MESSAGES)]
    keys = {r.properties["SK"] for r in _session_records(data_dir)}
    assert "s/upgraded" in keys and "u/upgraded\x00up/+/t" in keys

    shutil.rmtree(os.path.join(data_dir, "sessions"))  # the KV is derived: the log alone brings the session back
    again = NodeProcess(data_dir, listeners=("mqtt",))
    try:
        again.start()
        present, _got = _resume_and_drain(again.port())
    finally:
        again.stop()
    assert present
