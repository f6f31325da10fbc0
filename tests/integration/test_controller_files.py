"""A controller whose Raft files are unreadable refuses to start, in one line naming the file.

A real controller process writes its journal and a snapshot (compaction every 0.3 s here) while a
member registers, then is stopped; each test corrupts one file of a copy of that data dir and
starts the controller on it again. pysyncobj alone would log a traceback and start with empty
metadata (forgetting members and worker ids), or fail deep inside its journal reader.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.request

import msgpack
import pytest

from cluster.rpc import frames
from cluster.rpc.connection import Connection, Opened
from cluster.rpc.frames import RPC_VERSION, Hello, Result
from tests.integration.node import NodeProcess
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

CLUSTER = "c-files"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _register(port: int, node_id: str) -> dict | None:
    """Register a member over RPC (as a broker's agent does); the controller's answer, None before it leads."""
    conn = Connection(Hello(CLUSTER, node_id, "proxy", RPC_VERSION), True, 1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(conn.data_to_send())
        record = {"cluster_id": CLUSTER, "node_id": node_id, "node_type": "proxy"}
        for _ in range(100):
            data = sock.recv(65536)
            assert data, "controller closed the connection"
            events = conn.receive(data)
            sock.sendall(conn.data_to_send())  # the handshake's answers (CHALLENGE -> PROOF) go out as they come
            for event in events:
                if isinstance(event, Opened):
                    conn.call("controller.register", msgpack.packb({"member": record}))
                    sock.sendall(conn.data_to_send())
                elif isinstance(event, Result):
                    return msgpack.unpackb(event.body, raw=False)
                elif isinstance(event, frames.Error):
                    assert event.code == "not_leader", event
                    return None
    raise AssertionError("no answer to register")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A controller data dir with a journal, its meta file and a snapshot that list member m1."""
    path = tmp_path_factory.mktemp("ctl-files")
    conf = path / "controller.toml"
    conf.write_text(f'[cluster]\ncluster_id = "{CLUSTER}"\n[controller]\ncompaction_seconds = 0.3\n'
                    "compaction_entries = 10\n")
    raft = f"127.0.0.1:{_free_port()}"
    node = NodeProcess(str(path / "ctl"), listeners=("rpc", "http"), role="controller",
                       extra_args=["--config", str(conf), "--raft", raft]).start()
    try:
        for member in ("m1", "m2"):
            wait_until(lambda: _register(node.port("rpc"), member), timeout=15, what=f"{member} registered")
        files = path / "ctl" / "raft"
        wait_until(lambda: (files / "raft.snapshot").exists() and (files / "raft.journal.meta").exists(),
                   timeout=15, what="a snapshot and the meta file")
    finally:
        node.stop()
    return path, conf, raft


def _start_on_copy(written, tmp_path, corrupt) -> subprocess.CompletedProcess:
    path, conf, raft = written
    data = tmp_path / "ctl"
    shutil.copytree(path / "ctl", data)
    corrupt(data / "raft")
    args = NodeProcess(str(data), listeners=("rpc", "http"), role="controller",
                       extra_args=["--config", str(conf), "--raft", raft]).args()
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=20, cwd="/")
    except subprocess.TimeoutExpired as exc:  # run() killed it: it started instead of refusing
        pytest.fail(f"the controller started on the corrupted files: {(exc.stderr or b'')[-1500:]!r}")


def _refused(done: subprocess.CompletedProcess, name: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.startswith("twistmq:")]
    assert len(lines) == 1 and name in lines[0] and "unreadable" in lines[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "twistmq ready" not in done.stdout


def _garble(name: str, at: int = 0, data: bytes = b"\xde\xad\xbe\xef" * 8):
    def corrupt(files):
        with open(files / name, "r+b") as f:
            f.seek(at)
            f.write(data)
    return corrupt


def test_a_garbled_snapshot_stops_the_start(written, tmp_path):
    """The snapshot's first bytes overwritten: exit 2, one line naming raft.snapshot, never ready."""
    _refused(_start_on_copy(written, tmp_path, _garble("raft.snapshot")), "raft.snapshot")


def test_a_truncated_snapshot_stops_the_start(written, tmp_path):
    """The snapshot cut in half: the same one line."""
    def cut(files):
        size = os.path.getsize(files / "raft.snapshot")
        os.truncate(files / "raft.snapshot", size // 2)
    _refused(_start_on_copy(written, tmp_path, cut), "raft.snapshot")


def test_a_journal_with_a_bad_record_stops_the_start(written, tmp_path):
    """A record's size field garbled in the journal: one line naming raft.journal."""
    _refused(_start_on_copy(written, tmp_path, _garble("raft.journal", at=40, data=b"\xff\xff\x00\x00")),
             "raft.journal")


def test_a_journal_without_its_header_stops_the_start(written, tmp_path):
    """The journal's header overwritten: one line naming raft.journal."""
    _refused(_start_on_copy(written, tmp_path, _garble("raft.journal")), "raft.journal")


def test_a_garbled_meta_file_stops_the_start(written, tmp_path):
    """The journal's meta file (term and vote) garbled: one line naming raft.journal.meta."""
    _refused(_start_on_copy(written, tmp_path, _garble("raft.journal.meta")), "raft.journal.meta")


def test_the_intact_files_start_with_the_members_they_hold(written, tmp_path):
    """The same copy left as it is starts (the check refuses only what is broken)."""
    path, conf, raft = written
    data = tmp_path / "ctl"
    shutil.copytree(path / "ctl", data)
    node = NodeProcess(str(data), listeners=("rpc", "http"), role="controller",
                       extra_args=["--config", str(conf), "--raft", raft]).start()
    try:
        def members():
            url = f"http://127.0.0.1:{node.port('http')}/api/v1/cluster/controllers/metadata"
            with urllib.request.urlopen(url, timeout=5) as r:
                return {m["node_id"] for m in json.loads(r.read())["members"]} >= {"m1", "m2"}
        wait_until(members, timeout=15, what="the members from the files")
    finally:
        node.stop()
