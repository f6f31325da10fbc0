"""Snowflake ids made by two real processes that lease their worker ids from the same controller.

One controller process; two member processes (``snowflake_child.py``, the roles' member agent) register
at the same time, each gets a worker id from the controllers' metadata and makes 20,000 ids. The zone
field of every id is the number of ``[cluster] zone``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from cluster.discovery.ids import decode, zone_number
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow

COUNT = 20_000
ZONE = "eu-west-1"
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "snowflake_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """A running controller and the member config that points at it."""
    path = tmp_path_factory.mktemp("snowflake")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        raft = s.getsockname()[1]
    ctl_conf = path / "controller.toml"
    ctl_conf.write_text('[cluster]\ncluster_id = "c-ids"\n')
    controller = NodeProcess(str(path / "ctl"), listeners=("rpc", "http"), role="controller",
                             extra_args=["--config", str(ctl_conf), "--raft", f"127.0.0.1:{raft}"]).start()
    conf = path / "member.toml"
    conf.write_text(f'[cluster]\ncluster_id = "c-ids"\nzone = "{ZONE}"\n'
                    f'controllers = ["tcp:127.0.0.1:{controller.port("rpc")}"]\n'
                    "[discovery]\nheartbeat_interval = 0.2\nlease = 1.0\n")
    yield str(conf)
    controller.stop()


def test_two_processes_sharing_the_lease_space_never_collide(config):
    """Both processes lease different worker ids; their 40,000 ids are distinct, each process's increase,
    and every id carries its process's worker and the configured zone's number."""
    children = [subprocess.Popen([sys.executable, CHILD, config, f"ids-{n}", str(COUNT)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, cwd=ROOT, text=True) for n in (1, 2)]
    outputs = []
    try:
        for child in children:
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0 and out.startswith("WORKER "), (child.returncode, out[:200], err[-2000:])
            outputs.append(out.split())
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    workers = [int(o[1]) for o in outputs]
    assert workers[0] != workers[1]
    every = []
    for worker, out in zip(workers, outputs):
        ids = [int(i) for i in out[2:]]
        assert len(ids) == COUNT and ids == sorted(ids) and len(set(ids)) == COUNT
        assert {(decode(i).worker, decode(i).zone) for i in ids} == {(worker, zone_number(ZONE))}
        every += ids
    assert len(set(every)) == 2 * COUNT
