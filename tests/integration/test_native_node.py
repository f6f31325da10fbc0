"""The native protocol against a real ``twistd -n twistmq node`` process: produce/consume, SIGKILL, restart.

Skipped until the node role wires the NativeService (``cluster/roles/node.py``).
"""

from __future__ import annotations

import json
import os
import socket

import pytest

from mqtt_proxy.native.client import BlockingClient
from tests.integration.node import ROOT, NodeProcess

_TAP = os.path.join(ROOT, "cluster", "node.py")
_WIRED = os.path.exists(_TAP) and "NativeService" in open(_TAP).read()

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _WIRED, reason="cluster/roles/node.py does not wire the NativeService yet")]


def _udp(port: int, obj: dict) -> dict:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(json.dumps(obj).encode(), ("127.0.0.1", port))
        return json.loads(s.recv(65536))


def test_native_state_survives_sigkill(tmp_path):
    """Produced, consumed, in-flight and delayed messages keep their fate across kill -9 and restart."""
    node = NodeProcess(str(tmp_path / "data"), listeners=("native", "native-udp")).start()
    try:
        with BlockingClient("127.0.0.1", node.port("native")) as c:
            ids = [c.produce("jobs", f"m{i}", retry=60) for i in range(5)]
            first = c.consume("jobs")
            c.confirm("jobs", first["msg_id"])
            second = c.consume("jobs")  # in flight, never confirmed
            c.produce("once", "gone")
            assert c.consume("once")["data"] == "gone"
            c.produce("later", "delayed", delay=2)
        assert _udp(node.port("native-udp"), {"action": 1, "queue": "udp", "data": "u"})["code"] == 0
        node.kill()
        node.start()
        with BlockingClient("127.0.0.1", node.port("native")) as c:
            rest = [c.consume("jobs")["msg_id"] for _ in range(3)]
            assert rest == ids[2:]
            assert "data" not in c.consume("once")
            mon = c.monitor("jobs")
            assert mon["inflight"] == 4  # the unconfirmed second one plus the three just taken
            assert second["msg_id"] in ids
            import time
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                r = c.consume("later")
                if "data" in r:
                    break
                time.sleep(0.2)
            assert r["data"] == "delayed"
        assert _udp(node.port("native-udp"), {"action": 2, "queue": "udp"})["data"] == "u"
    finally:
        node.stop_hard()
