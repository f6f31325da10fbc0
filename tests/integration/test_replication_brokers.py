"""Two real broker processes, a master and its slave on the ``ha`` port: what the master stores reaches the slave's
commit log byte for byte, the slave refuses writes, and a fake slave without the secret is refused and logged."""

from __future__ import annotations

import os
import socket

import pytest

from cluster.remote import codec as store_codec
from cluster.rpc.frames import Result
from store import ha_codec as codec
from store.reader import list_segments
from tests.integration.node import NodeProcess
from tests.integration.test_rpc_broker import Peer, log_of
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

SECRET = "replication-test-secret"


def _config(path, node_id):
    conf = path / f"{node_id}.toml"
    conf.write_text(f'[store]\nsegment_size = {1 << 20}\n[cluster]\ncluster_id = "c-ha"\ngroup = "g1"\n'
                    f'secret = "{SECRET}"\nha_max_time_slave_not_catchup = 3.0\n')
    return str(conf)


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    path = tmp_path_factory.mktemp("ha-group")
    master = NodeProcess(str(path / "b1"), listeners=("rpc", "http", "ha"), role="broker",
                         extra_args=["--config", _config(path, "b1"), "--node-id", "b1"]).start()
    slave = NodeProcess(str(path / "b2"), listeners=("rpc", "http", "ha"), role="broker",
                        extra_args=["--config", _config(path, "b2"), "--node-id", "b2",
                                    "--ha-master", f"tcp:127.0.0.1:{master.port('ha')}"])
    try:
        slave.start()
        yield master, slave
    finally:
        slave.stop()
        master.stop()


def _log_bytes(data_dir: str) -> bytes:
    out = b""
    for seg in list_segments(os.path.join(data_dir, "commitlog")):
        with open(seg.path, "rb") as f:
            out += f.read()
    return out


def _native(broker, request: dict) -> dict:
    peer = Peer(broker, cluster_id="c-ha", secret=SECRET)
    peer.next_event()  # the handshake
    try:
        result = peer.call("store.native_request", store_codec.pack_call("native_request", (request, None)))
        assert isinstance(result, Result), result
        return store_codec.unpack_result("native_request", result.body)
    finally:
        peer.sock.close()


def test_records_reach_the_slave_byte_identical(group):
    """Messages produced on the master appear in the slave's commit log with the same bytes at the same offsets."""
    master, slave = group
    wait_until(lambda: "ha_slave_connected slave=b2" in log_of(master), 15, what="the slave's handshake")
    for i in range(30):
        assert _native(master, {"action": "produce", "queue": "jobs", "data": f"job {i}" * 10})["code"] == 0
    want = _log_bytes(master.data_dir)
    assert want
    wait_until(lambda: _log_bytes(slave.data_dir) == want, 15, what="the slave's log to equal the master's")
    wait_until(lambda: "ha_sync_state_set epoch=1 members=['b1', 'b2']" in log_of(master), 15,
               what="the slave to join the SyncStateSet")
    with open(os.path.join(slave.data_dir, "epochs")) as f:
        assert f.read().splitlines()[1:] == ["1 0"]


def test_brokers_epoch_answers_each_brokers_epochs_and_role(group):
    """GET cluster/brokers/{id}/epoch on a broker's http listener (twistmq-admin brokers epoch ID): the same epoch
    entries on master and slave, each its role; another broker's id is a 404 naming this one."""
    import json
    import urllib.error
    import urllib.request
    from tests.integration.admin_support import validate

    def epoch(node, broker):
        url = f"http://127.0.0.1:{node.port('http')}/api/v1/cluster/brokers/{broker}/epoch"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    master, slave = group
    status, answer = epoch(master, "b1")
    assert status == 200, answer
    validate("BrokerEpoch", answer)
    assert answer["role"] == "master" and answer["epochs"] == [{"epoch": 1, "start_offset": 0}]
    status, answer = epoch(slave, "b2")
    assert status == 200 and answer["role"] == "slave" and answer["epochs"] == [{"epoch": 1, "start_offset": 0}]
    status, answer = epoch(slave, "b1")
    assert status == 404 and "b2" in answer["message"]


def test_the_slave_refuses_writes(group):
    """A produce sent to the slave is refused and its log does not grow."""
    _master, slave = group
    before = _log_bytes(slave.data_dir)
    reply = _native(slave, {"action": "produce", "queue": "jobs", "data": "to the wrong broker"})
    assert reply["code"] == -1 and "slave" in reply["reason"], reply
    assert _log_bytes(slave.data_dir) == before


def test_a_fake_slave_without_the_secret_is_refused_and_logged(group):
    """A peer that cannot prove the secret gets a refusal, not the log, and the master logs it."""
    master, _slave = group
    with socket.create_connection(("127.0.0.1", master.port("ha")), timeout=10) as s:
        s.sendall(codec.encode(codec.Hello("intruder", b"n" * 16)))
        dec = codec.FrameDecoder()
        frames = []
        while not frames:
            frames = dec.feed(s.recv(65536))
        assert isinstance(frames[0], codec.Challenge)
        s.sendall(codec.encode(codec.Proof(b"\x00" * 32, 0)))
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    assert codec.FrameDecoder().feed(got) == [codec.Refused("slave 'intruder' failed the cluster secret")]
    wait_until(lambda: "ha_refused peer=intruder" in log_of(master), 10, what="the refusal in the master's log")


def test_old_master_relaunched_as_slave_truncates_what_the_new_master_never_had(tmp_path):
    """b1 masters epoch 1 with b2 as its slave; b2 stops, b1 stores five more and is SIGKILLed; b2 restarts as
    master (epoch 2) and stores three; b1 restarts as b2's slave: it truncates its five to where epoch 2 began
    and ends with b2's log, byte for byte."""
    def broker(node_id, master_port=None):
        extra = ["--config", _config(tmp_path, node_id), "--node-id", node_id]
        if master_port is not None:
            extra += ["--ha-master", f"tcp:127.0.0.1:{master_port}"]
        return NodeProcess(str(tmp_path / node_id), listeners=("rpc", "http", "ha"), role="broker",
                           extra_args=extra)

    procs = []
    try:
        b1 = broker("b1").start()
        procs.append(b1)
        b2 = broker("b2", b1.port("ha")).start()
        procs.append(b2)
        for i in range(10):
            assert _native(b1, {"action": "produce", "queue": "jobs", "data": f"shared {i}"})["code"] == 0
        shared = _log_bytes(b1.data_dir)
        wait_until(lambda: _log_bytes(b2.data_dir) == shared, 15, what="b2 to hold epoch 1")
        b2.stop()
        for i in range(5):
            assert _native(b1, {"action": "produce", "queue": "jobs", "data": f"lost {i}"})["code"] == 0
        assert b"lost 4" in _log_bytes(b1.data_dir)
        b1.kill()
        b2 = broker("b2").start()  # now the master: a new epoch where its log ends
        procs.append(b2)
        for i in range(3):
            assert _native(b2, {"action": "produce", "queue": "jobs", "data": f"new {i}"})["code"] == 0
        b1 = broker("b1", b2.port("ha")).start()
        procs.append(b1)
        want = _log_bytes(b2.data_dir)
        wait_until(lambda: _log_bytes(b1.data_dir) == want, 15, what="b1 to hold b2's log")
        assert b"lost" not in _log_bytes(b1.data_dir)
        assert f"ha_truncated offset={len(shared)}" in log_of(b1)
        with open(os.path.join(b1.data_dir, "epochs")) as f:
            assert f.read().splitlines()[1:] == ["1 0", f"2 {len(shared)}"]
        reply = _native(b1, {"action": "produce", "queue": "jobs", "data": "to the old master"})
        assert reply["code"] == -1 and "slave" in reply["reason"]
    finally:
        for p in reversed(procs):
            p.stop()
