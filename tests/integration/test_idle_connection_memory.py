"""What an idle MQTT connection costs a node: its Twisted transport keeps no dict of its own.

CPython keeps an object's attributes beside it while their names are in its
class's shared key table, which stops growing after a few dozen objects: a
transport given a name after that (its first write sets ``offset``) makes a
dict of its own, 832 bytes, more than a third of an idle connection. The node
runs in a fresh process (``idle_connection_child.py``) so the table starts
empty, as in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "idle_connection_child.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COUNT = 200

pytestmark = pytest.mark.skipif(sys.implementation.name != "cpython", reason="CPython's shared-key instance dicts")


def test_idle_connections_transports_share_their_attribute_names(tmp_path):
    """After CONNACK, none of 200 idle clients' TCP transports holds its own __dict__ (shared keys only)."""
    out = subprocess.run([sys.executable, CHILD, str(tmp_path), str(COUNT)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    assert result["transports"] == COUNT
    assert result["with_dict"] == 0, result
