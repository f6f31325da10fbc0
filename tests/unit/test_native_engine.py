"""Clock-driven unit tests of the native engine: produce/consume/confirm, retry, ttl, delay, POP, restart.

A real MessageStore and DurableKV in a tmp dir, a task.Clock, blocking work inline.
"""

import json
import struct
import os
import shutil

import pytest
from twisted.internet import task

import lightqueue
from cluster.local.native_service import NativeService
from mqtt_proxy.native import codec
from store.config import NativeConfig, StoreConfig
from store.executor import SynchronousExecutor
from store.record import Message, RecordKind
from store.timer_service import TimerService

T0 = 1_800_000_000.0


class Node:
    """Store + light queues + timer + native service, restartable as after kill -9."""

    def __init__(self, path, clock=None, **cfg):
        self.path = str(path)
        self.clock = clock or task.Clock()
        if clock is None:
            self.clock.advance(T0)
        self.cfg = cfg
        self.store = MessageStore_(self.path, self.clock)
        self.index = lightqueue.attach(self.store)
        self.timers = TimerService(self.store, os.path.join(self.path, "timer"), self.clock, 100, slot_count=600)
        self.native = NativeService(self.store, self.path, NativeConfig(**cfg), self.clock, self.timers)
        self.store.open()  # after the native service: its state log replays as a dispatcher
        self.timers.start()
        self.native.open()

    def call(self, **request):
        """One request through the codec and engine; returns the reply once it fired."""
        raw = json.dumps(request).encode()
        try:
            req = codec.parse_request(raw, self.native.config)
        except codec.RequestError as exc:
            return codec.error_reply(exc.reason, exc.echo)
        out = []
        self.native.engine.handle(req).addCallback(out.append)
        for _ in range(3):
            if out:
                break
            self.clock.advance(0)
        assert out, "no reply"
        return out[0]

    def run_for(self, seconds, step=0.1):
        for _ in range(int(round(seconds / step))):
            self.clock.advance(step)

    def restart(self, lose_native_kv=False):
        """kill -9: nothing closed or flushed except what the OS already has, then start again (without the
        native KV's directory if ``lose_native_kv``)."""
        tl = self.timers.timer.log
        os.close(tl._write_fd)
        for fd in tl._read_fds.values():
            os.close(fd)
        self.timers._closed = True
        self.native.kv._db.close()
        self.index.close()
        self.store.commit_log.close()
        os.close(self.store._lock_fd)
        if lose_native_kv:
            shutil.rmtree(os.path.join(self.path, "native"))
        clock = task.Clock()
        clock.advance(self.clock.seconds())
        return Node(self.path, clock=clock, **self.cfg)


def MessageStore_(path, clock):
    from store.message_store import MessageStore
    return MessageStore(path, StoreConfig(segment_size=1 << 20), clock, SynchronousExecutor())


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_produce_then_consume_at_most_once(node):
    """retry=0: a consumed message is gone; the next consume answers with no data."""
    r = node.call(action=1, queue="q", data="hello", seq=7)
    assert r["code"] == 0 and r["seq"] == 7 and r["queue"] == "q" and r["action"] == 1
    c = node.call(action=2, queue="q")
    assert (c["code"], c["msg_id"], c["data"]) == (0, r["msg_id"], "hello")
    assert node.call(action=2, queue="q") == {"action": 2, "queue": "q", "code": 0}
    node.run_for(100, step=1)
    assert "data" not in node.call(action=2, queue="q")


def test_fifo_order(node):
    """Messages come out in produce order."""
    for i in range(5):
        node.call(action=1, queue="f", data=str(i))
    assert [node.call(action=2, queue="f")["data"] for _ in range(5)] == ["0", "1", "2", "3", "4"]


def test_retry_comes_back_after_invisible_time_unless_confirmed(node):
    """retry=5: invisible for 5 s after consume, then delivered again; confirm ends it."""
    node.call(action=1, queue="r", data="job", retry=5)
    first = node.call(action=2, queue="r")
    assert first["data"] == "job"
    node.run_for(4.9)
    assert "data" not in node.call(action=2, queue="r")
    node.run_for(0.2)
    again = node.call(action=2, queue="r")
    assert again["msg_id"] == first["msg_id"] and again["attempts"] == 2
    assert node.call(action=3, queue="r", msg_id=first["msg_id"])["code"] == 0
    node.run_for(10)
    assert "data" not in node.call(action=2, queue="r")


def test_retry_stops_when_ttl_runs_out(node):
    """A message never confirmed stops coming back once its ttl has passed."""
    node.call(action=1, queue="t", data="x", retry=3, ttl=7)
    got = 0
    for _ in range(20):
        if "data" in node.call(action=2, queue="t"):
            got += 1
        node.run_for(1)
    assert got == 3  # at 0 s, 3 s, 6 s; expired at 7 s


def test_expired_message_is_never_delivered(node):
    """A message whose ttl passed before anyone consumed it is skipped."""
    node.call(action=1, queue="e", data="old", ttl=2)
    node.call(action=1, queue="e", data="new", ttl=100)
    node.run_for(2.5)
    assert node.call(action=2, queue="e")["data"] == "new"
    assert node.native.stats()["native_expired_total"] == 1


def test_delay_holds_message_back(node):
    """delay=3: nothing before 3 s, the message right after; msg_id is the one produce returned."""
    r = node.call(action=1, queue="d", data="later", delay=3)
    node.run_for(2.8)
    assert "data" not in node.call(action=2, queue="d")
    node.run_for(0.4)
    c = node.call(action=2, queue="d")
    assert c["data"] == "later" and c["msg_id"] == r["msg_id"]


def test_delay_and_ttl_count_from_produce(node):
    """ttl counts from the produce, not from the end of the delay."""
    node.call(action=1, queue="dt", data="x", delay=2, ttl=3)
    node.run_for(3.2)
    assert "data" not in node.call(action=2, queue="dt")


def test_confirm_unknown_msg_id_is_an_error(node):
    """Confirming a message that is not in flight answers code -1 with a reason."""
    r = node.call(action=3, queue="q", msg_id=12345)
    assert r["code"] == -1 and "not in flight" in r["reason"]


def test_full_queue_refuses_produce(tmp_path):
    """Once ready + in-flight messages reach max_queue_size, produce answers an error."""
    n = Node(tmp_path, max_queue_size=3)
    for i in range(3):
        assert n.call(action=1, queue="s", data=str(i))["code"] == 0
    r = n.call(action=1, queue="s", data="x")
    assert r["code"] == -1 and "full" in r["reason"]
    n.call(action=2, queue="s")
    assert n.call(action=1, queue="s", data="y")["code"] == 0


def test_virtual_queue_writes_each_real_queue(tmp_path):
    """A produce to a virtual queue is stored once and read from every real queue; it takes no reads."""
    n = Node(tmp_path, virtual_queues={"v": ["a", "b"]})
    r = n.call(action=1, queue="v", data="fan")
    assert n.call(action=2, queue="a")["msg_id"] == r["msg_id"]
    assert n.call(action=2, queue="b")["data"] == "fan"
    bad = n.call(action=2, queue="v")
    assert bad["code"] == -1 and "virtual" in bad["reason"]
    assert len(list(n.store.commit_log.iterate(0))) == 1


def test_monitor_and_lists(node):
    """monitor reports size and max_id; the queue lists name the queue; node monitor answers."""
    for i in range(3):
        last = node.call(action=1, queue="m", data=str(i), retry=10)
    node.call(action=2, queue="m")
    mon = node.call(action=4, queue="m")
    assert (mon["size"], mon["inflight"], mon["max_id"], mon["wait_status"]) == (3, 1, last["msg_id"], 0)
    for action in (7, 107):
        lst = node.call(action=action)
        assert [q["queue"] for q in lst["queues"]] == ["m"]
    nm = node.call(action=104)
    assert nm["code"] == 0 and nm["queue_count"] == 1 and nm["inflight"] == 1


def test_pop_balances_across_consumers_and_redelivers(node):
    """Two POP consumers of a group get alternate messages; an un-acked one comes back after invisible_time."""
    for i in range(4):
        node.call(action=1, queue="p", data=str(i))
    a1 = node.call(action="pop", queue="p", group="g", invisible_time=5)
    b1 = node.call(action="pop", queue="p", group="g", invisible_time=5)
    a2 = node.call(action="pop", queue="p", group="g", invisible_time=5)
    b2 = node.call(action="pop", queue="p", group="g", invisible_time=5)
    assert [a1["data"], b1["data"], a2["data"], b2["data"]] == ["0", "1", "2", "3"]
    for m in (a1, b1, a2):
        assert node.call(action="ack", queue="p", group="g", msg_id=m["msg_id"])["code"] == 0
    node.run_for(5.1)
    back = node.call(action="pop", queue="p", group="g")
    assert back["msg_id"] == b2["msg_id"] and back["attempts"] == 2


def test_change_invisible_time(node):
    """change_invisible_time brings a popped message back sooner (or later)."""
    node.call(action=1, queue="c", data="x")
    m = node.call(action=11, queue="c", invisible_time=60)
    assert node.call(action=13, queue="c", msg_id=m["msg_id"], invisible_time=1)["code"] == 0
    node.run_for(1.1)
    assert node.call(action=11, queue="c")["msg_id"] == m["msg_id"]


def test_groups_are_independent(node):
    """Each group has its own cursor: both see every message."""
    node.call(action=1, queue="g", data="x")
    assert node.call(action=2, queue="g", group="one")["data"] == "x"
    assert node.call(action=2, queue="g", group="two")["data"] == "x"


def test_topic_produce_is_an_mqtt_publish(node):
    """produce with topic stores an MQTT publish (qos 1 by default) in the topic consume queue."""
    r = node.call(action=1, topic="dev/7/cmd", data="reboot")
    assert r["code"] == 0
    (rec,) = [x for x in node.store.commit_log.iterate(0)]
    assert (rec.kind, rec.topic, rec.qos, rec.body) == (RecordKind.MQTT_PUBLISH, "dev/7/cmd", 1, b"reboot")


def test_topic_consume_reads_device_publishes_per_group(node):
    """consume with topic reads the first-level topic queue of MQTT publishes, one offset per group."""
    node.store.put(Message("dev/1/temp", b"21.5", qos=1, client_id="dev1"))
    node.store.put(Message("dev/2/temp", b"\xff\x00", qos=0, client_id="dev2"))
    node.clock.advance(0)
    a = node.call(action=2, topic="dev", group="analytics")
    assert (a["data"], a["msg_topic"], a["client_id"], a["qos"]) == ("21.5", "dev/1/temp", "dev1", 1)
    b = node.call(action=2, topic="dev/#x", group="analytics")
    assert b["code"] == -1  # wildcards are not topic names
    b = node.call(action=2, topic="dev/anything", group="analytics")
    assert (b["data"], b["encoding"]) == ("/wA=", "base64")
    assert node.call(action=2, topic="dev", group="other")["data"] == "21.5"


def test_batch_produce_stores_one_record_each(node):
    """A batch is one request, one record per message, ids in order."""
    r = node.call(action=1, queue="b", batch=["a", {"data": "b", "retry": 5}, "c"], ttl=100)
    assert r["code"] == 0 and r["count"] == 3 and len(r["msg_ids"]) == 3
    assert [node.call(action=2, queue="b")["data"] for _ in range(3)] == ["a", "b", "c"]


def test_state_survives_kill(tmp_path):
    """Offsets and in-flight messages survive kill -9: consumed stays consumed, unconfirmed comes back."""
    n = Node(tmp_path)
    for i in range(3):
        n.call(action=1, queue="k", data=str(i), retry=5)
    first = n.call(action=2, queue="k")
    second = n.call(action=2, queue="k")
    n.call(action=3, queue="k", msg_id=first["msg_id"])
    n.call(action=1, queue="k", data="late", delay=2)
    n = n.restart()
    assert n.call(action=2, queue="k")["data"] == "2"
    n.run_for(5.1)
    back = n.call(action=2, queue="k")
    assert back["msg_id"] == second["msg_id"]
    assert n.call(action=2, queue="k")["data"] == "2"  # consumed after the restart, not confirmed either
    assert n.call(action=2, queue="k")["data"] == "late"
    assert "data" not in n.call(action=2, queue="k")
    assert [q["queue"] for q in n.call(action=7)["queues"]] == ["k"]


def test_duplicate_from_timer_redelivery_is_skipped_while_in_flight(node):
    """Two records with one ORIGIN (a timer redelivery after a crash) give one in-flight message."""
    for _ in range(2):
        node.store.put(Message("dup", b"x", RecordKind.NATIVE_MESSAGE, properties={"ORIGIN": "42", "retry": "9"}))
    node.clock.advance(0)
    assert node.call(action=2, queue="dup")["msg_id"] == 42
    assert "data" not in node.call(action=2, queue="dup")


def test_udp_budget_keeps_big_message_for_tcp(node):
    """A consume with a reply budget refuses a message that would not fit, and leaves it in the queue."""
    node.call(action=1, queue="big", data="x" * 5000)
    req = codec.parse_request(b'{"action":2,"queue":"big"}', node.native.config)
    out = []
    node.native.engine.handle(req, max_data_bytes=1000).addCallback(out.append)
    assert out[0]["code"] == -1 and "TCP" in out[0]["reason"]
    assert node.call(action=2, queue="big")["data"] == "x" * 5000


def test_stats_are_floats(node):
    """stats() returns a flat dict of floats for Prometheus."""
    node.call(action=1, queue="s", data="x")
    stats = node.native.stats()
    assert stats["native_produced_total"] == 1.0
    assert all(isinstance(v, float) for v in stats.values())


def test_reads_soon_only_for_queues_with_a_consumer_near_the_tail(node):
    """The store keeps an append in memory for a native queue whose consumer is caught up, not for a backlog."""
    from lightqueue.native_engine import READ_SOON_LAG

    engine = node.native.engine
    assert node.call(action=1, queue="live", data="x")["code"] == 0
    assert not engine.reads_soon(("%QUEUE%live",)), "nobody reads it yet"
    assert node.call(action=2, queue="live")["data"] == "x"
    assert engine.reads_soon(("%QUEUE%live",)) and engine.reads_soon(("%LMQ%a", "%QUEUE%live"))
    for i in range(READ_SOON_LAG + 1):
        node.store.put(Message("live", b"y", RecordKind.NATIVE_MESSAGE, 0, False, "", 0, {}))
    node.clock.advance(0)
    assert not engine.reads_soon(("%QUEUE%live",)), "a backlog stays on disk"


def test_native_state_is_rebuilt_from_the_log_when_its_kv_is_lost(node):
    """Cursors and messages in flight reach the commit log within position_log_s: a lost native KV comes back."""
    for i in range(4):
        node.call(action=1, queue="j", data=str(i), retry=30)
    assert node.call(action=2, queue="j")["data"] == "0"
    taken = node.call(action=2, queue="j")
    assert taken["data"] == "1"
    confirmed = node.call(action=3, queue="j", msg_id=node.call(action=2, queue="j")["msg_id"])
    assert confirmed["code"] == 0
    node.run_for(1.2)  # a position round: the state of this moment goes to the log
    node = node.restart(lose_native_kv=True)
    got = [node.call(action=2, queue="j").get("data") for _ in range(2)]
    assert got == ["3", None]  # the cursor came back: "0", "1" in flight (retry 30 s), "2" confirmed
    node.run_for(31)
    assert sorted(node.call(action=2, queue="j").get("data") for _ in range(2)) == ["0", "1"]


def test_a_reload_takes_the_cursors_the_kv_holds_now(node):
    """A slave's engine keeps the cursors it loaded while its KV follows the master's: after reload (on becoming
    master) a consume resumes at the KV's cursor (what the old master logged), not at the one first loaded."""
    for i in range(3):
        node.call(action=1, queue="fo", data=str(i))
    assert node.call(action=2, queue="fo")["data"] == "0"
    node.clock.advance(0)
    ((key, value),) = [(k, v) for k, v in node.native.kv.scan(b"o|") if b"fo" in k]
    node.native.kv.put(key, struct.pack(">Q", struct.unpack(">Q", value)[0] + 2))  # as replication applies it
    node.clock.advance(0)
    node.native.engine.reload()
    assert "data" not in node.call(action=2, queue="fo")
