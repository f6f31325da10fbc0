"""Native msg_ids across 2 broker groups behind one proxy (``./dev cluster up``'s processes, the native client).

Each group's commit log starts at offset 0, so before msg_ids carried their group the first
message of each group had the same id, and a timer cancel by id could reach the wrong group.
"""

from __future__ import annotations

import pytest

from cluster.routing import SlotTable
from cluster.tools import launcher
from mqtt_proxy.native.client import BlockingClient

pytestmark = pytest.mark.slow

BASE = """
[mqtt]
allow_anonymous = true
"""


@pytest.fixture(scope="module")
def proxy_port(tmp_path_factory):
    """Two broker groups (g1, g2) and one proxy, no controllers; the proxy's native port."""
    root = tmp_path_factory.mktemp("ids")
    base = root / "base.toml"
    base.write_text(BASE)
    doc = launcher.up(str(root / "c"), groups=2, proxies=1, controllers=0, base_config=str(base))
    try:
        yield next(p for p in doc["processes"] if p["role"] == "proxy")["ports"]["native"]
    finally:
        launcher.down(str(root / "c"))


def _queues(group: str, n: int) -> list[str]:
    table = SlotTable.build(("g1", "g2"))
    out = [f"ids-{i}" for i in range(500) if table.group_of_queue(f"ids-{i}") == group][:n]
    assert len(out) == n
    return out


def test_ids_from_both_groups_never_collide(proxy_port):
    """20 produces to queues of each group through one proxy: 40 distinct ids, consumed back under the same ids."""
    with BlockingClient("127.0.0.1", proxy_port) as c:
        produced = {}
        for group in ("g1", "g2"):
            for queue in _queues(group, 4):
                for n in range(5):
                    reply = c.request({"action": "produce", "queue": queue, "data": f"{queue}/{n}"})
                    assert reply["code"] == 0, reply
                    produced[reply["msg_id"]] = (queue, f"{queue}/{n}")
        assert len(produced) == 40
        consumed = {}
        for queue in sorted({q for q, _ in produced.values()}):
            for _ in range(5):
                reply = c.request({"action": "consume", "queue": queue})
                assert reply["code"] == 0 and "data" in reply, reply
                consumed[reply["msg_id"]] = (queue, reply["data"])
        assert consumed == produced


def test_ack_and_cancel_by_id_reach_the_right_group(proxy_port):
    """In each group: a confirm of a consumed id takes it out of flight (a second confirm is refused), a POP
    ack by id works, and a cancel_timer with only the delayed produce's id cancels it."""
    with BlockingClient("127.0.0.1", proxy_port) as c:
        for group in ("g1", "g2"):
            queue = _queues(group, 5)[4]  # a queue of its own: the other test's queues are its first four
            assert c.request({"action": "produce", "queue": queue, "data": "c", "retry": 30})["code"] == 0
            got = c.request({"action": "consume", "queue": queue})
            assert got["data"] == "c", got
            done = c.request({"action": "confirm", "queue": queue, "msg_id": got["msg_id"]})
            assert done["code"] == 0 and done["msg_id"] == got["msg_id"], done
            assert c.request({"action": "confirm", "queue": queue, "msg_id": got["msg_id"]})["code"] == -1
            popq = _queues(group, 6)[5]
            assert c.request({"action": "produce", "queue": popq, "data": "p"})["code"] == 0
            popped = c.request({"action": "pop", "queue": popq, "group": "workers", "invisible_time": 30})
            assert popped["data"] == "p", popped
            acked = c.request({"action": "ack", "queue": popq, "group": "workers", "msg_id": popped["msg_id"]})
            assert acked["code"] == 0 and acked["msg_id"] == popped["msg_id"], acked
            assert c.request({"action": "ack", "queue": popq, "group": "workers", "msg_id": popped["msg_id"]})["code"] == -1
            delayed = c.request({"action": "produce", "queue": queue, "data": "later", "delay": 600})
            assert delayed["code"] == 0, delayed
            cancelled = c.request({"action": "cancel_timer", "msg_id": delayed["msg_id"]})
            assert cancelled["code"] == 0 and cancelled["cancelled"] is True, (group, cancelled)
