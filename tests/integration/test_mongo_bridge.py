"""The MongoDB bridge against a real wire-protocol server process: nothing acknowledged is lost, nothing is doubled,
through a database SIGKILL and a node SIGKILL."""

from __future__ import annotations

import json
import os
import time
import urllib.request

import paho.mqtt.client as mqtt
import pytest

from tests.integration.admin_support import validate
from tests.integration.node import NodeProcess
from tests.integration.waiting import metric_value, wait_until

pytestmark = pytest.mark.slow
pytest.importorskip("pymongo", reason="pymongo is not installed (the 'mongodb' extra)")

from cluster.bridges.documents import parse_document_id  # noqa: E402
from tests.mongo_server import MongoServer  # noqa: E402

MESSAGES = 10_000
DB_KILL_AT, DB_BACK_AT, NODE_KILL_AT = 2_500, 4_500, 7_000
DEADLINE_S = 300  # the whole publishing run; each publish waits for its PUBACK at most PUBACK_WAIT
PUBACK_WAIT = 5.0
COLLECTION = "telemetry"


def _config(path: str, uri: str) -> str:
    with open(path, "w") as f:
        f.write(f"""
[mongodb]
uri = "{uri}"
database = "bridged"
timeout = 1.0

[[bridge.mongodb]]
name = "telemetry"
filter = "dev/#"
collection = "{COLLECTION}"
batch_size = 200
retry_max = 1.0
""")
    return path


@pytest.fixture(scope="module")
def mongo(tmp_path_factory):
    """One secantusd-py process for the module, killed and removed in teardown."""
    server = MongoServer(str(tmp_path_factory.mktemp("mongo") / "db")).start()
    yield server
    server.remove()


@pytest.fixture(scope="module")
def setup(mongo, tmp_path_factory):
    """A node bridging dev/# into the server; killed in teardown."""
    root = tmp_path_factory.mktemp("bridge")
    node = NodeProcess(str(root / "node"), extra_args=["--config", _config(str(root / "twistmq.toml"), mongo.uri)])
    try:
        node.start()
        yield mongo, node
    finally:
        node.stop_hard()


class Publisher:
    """A paho client that publishes QoS 1 one at a time and remembers which sequence numbers were acknowledged."""

    def __init__(self, port: int, client_id: str) -> None:
        self.port = port
        self.client_id = client_id
        self.acked: set[int] = set()
        self.unacked: set[int] = set()
        self.client = None

    def connect(self) -> bool:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, clean_session=True)
        try:
            c.connect("127.0.0.1", self.port, keepalive=30)
        except OSError:
            return False
        c.loop_start()
        self.client = c
        return True

    def close(self) -> None:
        if self.client is not None:
            self.client.disconnect()
            self.client.loop_stop()
            self.client = None

    def publish(self, seq: int, topic: str | None = None) -> bool:
        """One message, waiting for its PUBACK; a message with no PUBACK is never sent again (a new seq follows)."""
        payload = json.dumps({"seq": seq, "temp": 20 + seq % 7}).encode()
        try:
            info = self.client.publish(topic or f"dev/{seq % 16}/telemetry", payload, qos=1)
            info.wait_for_publish(PUBACK_WAIT)
        except (RuntimeError, ValueError):
            info = None
        if info is not None and info.is_published():
            self.acked.add(seq)
            return True
        self.unacked.add(seq)
        self.close()  # a fresh connection: paho must not resend the unacknowledged one under another seq
        return False


def _api(node, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{node.port('http')}/api/v1/{path}", timeout=5) as resp:
        return json.loads(resp.read())


def test_every_acknowledged_message_once_through_database_and_node_kills(setup):
    """10,000 QoS 1 publishes, each waiting for its PUBACK, while the database is SIGKILLed and restarted and the
    node SIGKILLed and restarted: the collection holds every acknowledged message exactly once."""
    server, node = setup
    pub = Publisher(node.port(), "bridge-publisher")
    assert pub.connect()
    start = time.monotonic()
    events = []
    for seq in range(MESSAGES):
        assert time.monotonic() - start < DEADLINE_S, f"publishing took over {DEADLINE_S} s (at {seq})"
        if seq == DB_KILL_AT:
            server.kill()
            events.append(("db killed", seq))
        elif seq == DB_BACK_AT:
            wait_until(lambda: metric_value(node.port("http"), "twistmq_bridge_failed_batches_total") > 0, 30,
                       what="the bridge to notice the database is gone")
            server.start()
            events.append(("db back", seq))
        elif seq == NODE_KILL_AT:
            pub.close()
            node.kill()
            node.start()
            pub.port = node.port()  # the restarted node bound a new free port
            events.append(("node killed and restarted", seq))
        if pub.client is None:
            wait_until(pub.connect, 30, interval=0.2, what="a connection to the node")
        pub.publish(seq)
    pub.close()
    publish_s = time.monotonic() - start
    assert len(pub.acked) >= MESSAGES - 5, f"only {len(pub.acked)} acknowledged ({sorted(pub.unacked)[:10]})"

    client = server.client()
    try:
        coll = client["bridged"][COLLECTION]

        def caught_up():
            rows = _api(node, "bridges")["items"]
            return rows and rows[0]["lag"] == 0 and rows[0]["state"] == "idle"

        wait_until(caught_up, 120, interval=0.5, what="the bridge to catch up")
        docs = list(coll.find({}, {"payload.seq": 1, "topic": 1, "qos": 1}))
    finally:
        client.close()
    seqs = [d["payload"]["seq"] for d in docs]
    ids = [parse_document_id(d["_id"]) for d in docs]
    assert len(set(ids)) == len(ids)  # no (group, offset) twice
    assert len(set(seqs)) == len(seqs), "a message was inserted twice"
    missing = pub.acked - set(seqs)
    assert not missing, f"{len(missing)} acknowledged messages missing, e.g. {sorted(missing)[:10]}"
    assert set(seqs) <= pub.acked | pub.unacked
    assert {g for g, _ in ids} == {"g1"} and all(d["qos"] == 1 for d in docs)
    page = _api(node, "bridges")
    validate("BridgePage", page)
    row = page["items"][0]
    assert (row["name"], row["filter"], row["collection"], row["lost"]) == ("telemetry", "dev/#", COLLECTION, 0)
    assert metric_value(node.port("http"), "twistmq_bridge_lag_messages") == 0
    print(f"published {MESSAGES} in {publish_s:.1f} s; acked {len(pub.acked)}; documents {len(docs)}; "
          f"events {events}")


def test_position_survives_in_the_data_dir(setup):
    """The bridge's position is a file in DATA_DIR/bridges naming its queue and group."""
    _server, node = setup
    with open(os.path.join(node.data_dir, "bridges", "telemetry.json")) as f:
        saved = json.load(f)
    assert saved["queue"] == "%LMQ%dev/#" and saved["group"] == "g1" and saved["offset"] > 0


def test_a_filter_spanning_groups_is_bridged_by_each_group(mongo, tmp_path):
    """Two broker groups and a proxy (``./dev cluster up``): a filter whose topics live in both groups is bridged
    by the broker of each, each from its own light queue, and every acknowledged message arrives once."""
    from cluster.routing import SlotTable
    from cluster.tools import launcher

    base = tmp_path / "base.toml"
    base.write_text(f"""
[mqtt]
allow_anonymous = true

[mongodb]
uri = "{mongo.uri}"
database = "cluster"
timeout = 2.0

[[bridge.mongodb]]
name = "sites"
filter = "+/telemetry"
collection = "sites"
""")
    root = str(tmp_path / "c")
    doc = launcher.up(root, groups=2, proxies=1, controllers=0, base_config=str(base))
    try:
        proxy = next(p for p in doc["processes"] if p["role"] == "proxy")
        brokers = [p for p in doc["processes"] if p["role"] == "broker"]
        pub = Publisher(proxy["ports"]["mqtt"], "cluster-publisher")
        assert pub.connect()
        for seq in range(400):
            assert pub.publish(seq, topic=f"site{seq % 20}/telemetry"), f"no PUBACK for {seq}"
        pub.close()
        table = SlotTable.build(("g1", "g2"))
        expect: dict[str, set[int]] = {"g1": set(), "g2": set()}
        for seq in range(400):
            expect[table.group_of_topic(f"site{seq % 20}/telemetry")].add(seq)
        assert all(expect.values())  # the topics span both groups
        for broker in brokers:
            wait_until(lambda b=broker: metric_value(b["ports"]["http"], "twistmq_bridge_inserted_documents_total")
                       >= len(expect[b["group"]]), 60, what=f"the bridge of {broker['group']}")
        client = mongo.client()
        try:
            docs = list(client["cluster"]["sites"].find({}, {"payload.seq": 1}))
        finally:
            client.close()
        got: dict[str, set[int]] = {"g1": set(), "g2": set()}
        for d in docs:
            got[parse_document_id(d["_id"])[0]].add(d["payload"]["seq"])
        assert len(docs) == 400 and got == expect
    finally:
        launcher.down(root)


def test_what_a_disk_limit_forces_out_is_counted_and_logged(mongo, tmp_path):
    """Database down while a 1 MB disk quota deletes owed segments: the bridge's loss is counted (its lost count,
    retention's per-queue count) and logged naming the bridge; everything else arrives once when it is back."""
    count = 20_000
    cfg = tmp_path / "quota.toml"
    cfg.write_text(f"""
[store]
segment_size = 65536
retention_hours = {2 / 3600!r}
retention_check_s = 0.5
disk_quota_mb = 1
disk_max_used_ratio = 1.0

[mongodb]
uri = "{mongo.uri}"
database = "quota"
timeout = 1.0

[[bridge.mongodb]]
name = "quota"
filter = "q/#"
collection = "quota"
retry_max = 0.5
""")
    mongo.kill()
    node = NodeProcess(str(tmp_path / "node"), extra_args=["--config", str(cfg)]).start()
    try:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="quota-pub")
        c.max_inflight_messages_set(100)
        c.connect("127.0.0.1", node.port())
        c.loop_start()
        infos = [c.publish(f"q/{i % 8}", json.dumps({"seq": i, "pad": "x" * 80}), qos=1) for i in range(count)]
        for info in infos:
            info.wait_for_publish(30)
            assert info.is_published()
        c.disconnect()
        c.loop_stop()
        http = node.port("http")
        wait_until(lambda: metric_value(http, "twistmq_retention_dropped_messages_total", "%LMQ%q/#") > 0, 30,
                   what="the disk quota to drop owed messages")
        mongo.start()
        wait_until(lambda: _api(node, "bridges")["items"][0]["lag"] == 0, 60, interval=0.2,
                   what="the bridge to catch up")
        row = _api(node, "bridges")["items"][0]
        client = mongo.client()
        try:
            seqs = [d["payload"]["seq"] for d in client["quota"]["quota"].find({}, {"payload.seq": 1})]
        finally:
            client.close()
        assert row["lost"] > 0 and row["lost"] == metric_value(http, "twistmq_bridge_lost_messages_total")
        # Retention counts what it deleted while the bridge owed it; a batch the bridge had already read when its
        # segment went still arrives, so retention's figure may exceed the bridge's loss by at most one batch.
        dropped = metric_value(http, "twistmq_retention_dropped_messages_total", "%LMQ%q/#")
        assert row["lost"] <= dropped <= row["lost"] + 500
        assert len(seqs) == len(set(seqs)) and len(seqs) + row["lost"] == count
        # the oldest went, the rest arrived (but for that one batch read before its segment went)
        assert set(range(count - len(seqs) + 500, count)) <= set(seqs)
        with open(node.data_dir.rstrip("/") + ".stderr.log") as f:
            log = f.read()
        assert "retention_dropped_owed queue=%LMQ%q/# owner='bridge quota'" in log
        assert "bridge_lost name=quota" in log
    finally:
        node.stop_hard()
        if mongo.proc is None or mongo.proc.poll() is not None:
            mongo.start()


def test_sink_counts_duplicates_and_keeps_what_bson_cannot_hold(mongo):
    """insert_batch against the server: a replayed document is a duplicate, not an error; a JSON object BSON cannot
    hold (a NUL in a key) is kept with its payload as binary; nothing is lost or refused."""
    from cluster.bridges.documents import document
    from cluster.bridges.mongo_sink import insert_batch
    from store import record as rec

    def doc(offset, body):
        r = rec.Record(offset, 10, rec.RecordKind.MQTT_PUBLISH, 1, False, 1, 1, "dev/x", "c", {}, body)
        return document(r, "g1", "auto"), body

    first = [doc(1, b'{"a": 1}'), doc(2, b'{"b": 2}')]
    client = mongo.client()
    try:
        db = client["sink"]
        assert insert_batch(db, "c", [d for d, _ in first], [b for _, b in first]) == (2, 0, 0)
        again = first + [doc(3, b'{"bad\\u0000key": 3}'), doc(4, b"plain")]
        result = insert_batch(db, "c", [d for d, _ in again], [b for _, b in again])
        assert result == (2, 2, 0)
        stored = {d["_id"]: d["payload"] for d in db["c"].find()}
    finally:
        client.close()
    assert stored == {"g1:1": {"a": 1}, "g1:2": {"b": 2}, "g1:3": b'{"bad\\u0000key": 3}', "g1:4": b"plain"}
