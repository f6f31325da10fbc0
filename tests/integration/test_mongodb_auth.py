"""Authentication and ACL from MongoDB on a real node, against a real wire-protocol server process (secantusd-py).

One server and one node for the module (``[auth] backends = ["mongodb"]``,
``cache_ttl`` 30 s, change streams on); a second server presenting itself as a
standalone ``mongod`` (no change streams) with its own node (``cache_ttl`` 2 s)
shows the TTL bounding staleness. The outage test SIGKILLs the first server and
starts it again on the same port and data directory, so it runs last.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess

import pytest

from mqtt_proxy.auth.passwords import hash_password
from tests.integration.node import TWISTD, NodeProcess
from tests.integration.security_support import (ADMIN, Paho, admin, http_get, node_logs, raw, toml_str, unique,
                                                write_config)
from tests.integration.waiting import wait_until
from tests.mongo_server import MongoServer

pytestmark = pytest.mark.slow

LEVELS = pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])
PASSWORD = "dev1ce-Secr3t-7c4e"
WRONG = "n0t-the-Passw0rd"
DB = "fleet"


def mosquitto_hash(password: str, iterations: int = 101) -> str:
    """A mosquitto_passwd (2.0) ``$7$`` PBKDF2-SHA512 hash, as a fleet moved from a password file would hold."""
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def node_config(directory, server: MongoServer, ttl: float) -> str:
    return write_config(directory, f"[mongodb]\nuri = {toml_str(server.uri)}\ndatabase = \"{DB}\"\ntimeout = 1\n"
                                   f"[auth]\nbackends = [\"mongodb\"]\n[auth.mongodb]\ncache_ttl = {ttl}\n"
                                   "[mqtt]\nauth_fail_delay = 0.05\nauth_fail_delay_max = 0.05\n")


@pytest.fixture(scope="module")
def mongo(tmp_path_factory):
    server = MongoServer(str(tmp_path_factory.mktemp("mongo") / "db")).start()
    yield server
    server.remove()


@pytest.fixture(scope="module")
def db(mongo):
    client = mongo.client()
    yield client[DB]
    client.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory, mongo):
    conf = tmp_path_factory.mktemp("mongo-auth-conf")
    n = NodeProcess(str(tmp_path_factory.mktemp("mongo-auth") / "data"),
                    extra_args=["--config", node_config(conf, mongo, 30)]).start()
    yield n
    n.stop()


def add_device(db, username: str, password: str = PASSWORD, superuser: bool = False, encoded: str | None = None):
    db.mqtt_user.insert_one({"username": username, "password_hash": encoded or hash_password(password, log_n=10),
                             "is_superuser": superuser})


def connack(port: int, username: str, password: str = PASSWORD, level: int = 5, client_id: str | None = None):
    """paho's CONNACK reason code (3.1.1 return codes mapped to v5 values by paho), or None."""
    c = Paho(port, client_id=client_id, level=level, username=username, password=password)
    try:
        return c.connect()
    finally:
        c.close()


@LEVELS
def test_device_in_mqtt_user_connects_with_paho(node, db, mongo, level, tmp_path):
    """Devices in mqtt_user connect with paho: one added by twistmq-admin users add, one holding a $7$ hash."""
    by_admin, moved = unique("adm"), unique("moved")
    admin("users", "add", by_admin, "--backend", "mongodb", "--config", node_config(tmp_path, mongo, 30),
          stdin=PASSWORD + "\n")
    add_device(db, moved, encoded=mosquitto_hash(PASSWORD))
    assert connack(node.port(), by_admin, level=level) == 0
    assert connack(node.port(), moved, level=level) == 0


@pytest.mark.parametrize("section,key", [
    ('[mongodb]\nuri = "mongodb://fleet:s3cr3t-pw@127.0.0.1:99999/"\n[auth]\nbackends = ["mongodb"]\n', "mongodb.uri"),
    ('[mongodb]\nuri = "mongodb://127.0.0.1/"\ndatabase = ""\n[auth]\nbackends = ["mongodb"]\n', "mongodb.database"),
])
def test_bad_uri_or_missing_database_exits_2_with_one_line(tmp_path, section, key):
    """A bad [mongodb] uri or an empty database name: the node exits 2 with one line naming the key, never the
    password in the URI."""
    config = write_config(tmp_path, section)
    done = subprocess.run([TWISTD, "-n", "--pidfile=", "twistmq", "node", "--config", config, "--data-dir",
                           str(tmp_path / "d")], capture_output=True, text=True, timeout=60, cwd="/")
    lines = [line for line in done.stderr.splitlines() if "twistmq:" in line]
    assert done.returncode == 2 and len(lines) == 1 and key in lines[0], done.stderr
    assert "s3cr3t-pw" not in done.stderr + done.stdout


def test_admin_users_passwd_delete_list(node, mongo, tmp_path):
    """twistmq-admin users passwd/list/delete --backend mongodb: the new password works and the old does not, list
    shows the user (and superusers), a deleted user is refused; changing it then is one line on stderr, exit 2."""
    config = node_config(tmp_path, mongo, 30)
    name, boss = unique("cli"), unique("boss")
    admin("users", "add", name, "--backend", "mongodb", "--config", config, "--password", "first-Pa55")
    admin("users", "add", boss, "--superuser", "--backend", "mongodb", "--config", config, stdin="b0ss-Pa55\n")
    admin("users", "passwd", name, "--backend", "mongodb", "--config", config, stdin="second-Pa55\n")
    assert connack(node.port(), name, "second-Pa55") == 0
    assert connack(node.port(), name, "first-Pa55") == 0x86
    listed = admin("users", "list", "--backend", "mongodb", "--config", config).splitlines()
    assert name in listed and f"{boss}  superuser" in listed
    admin("users", "delete", name, "--backend", "mongodb", "--config", config)
    wait_until(lambda: connack(node.port(), name, "second-Pa55") == 0x86, timeout=1.0, interval=0.05,
               what="the deleted user to be refused")
    done = subprocess.run([ADMIN, "users", "passwd", name, "--backend", "mongodb", "--config", config,
                           "--password", "x"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and f"no user '{name}'" in done.stderr
    assert mongo.uri not in done.stderr


@LEVELS
def test_wrong_password_and_unknown_user_are_refused(node, db, level):
    """A wrong password and an unknown username: bad credentials (v5 0x86, 3.1.1 return code 4)."""
    name = unique("dev")
    add_device(db, name)
    assert connack(node.port(), name, WRONG, level) == 0x86
    assert connack(node.port(), unique("nobody"), PASSWORD, level) == 0x86
    c = raw(node.port(), level, expect_ok=False, username=name, password=WRONG.encode())
    try:
        assert c.connack.reason_code == (0x86 if level == 5 else 4)
    finally:
        c.close()


def test_acl_documents_deny_a_publish_and_a_subscribe(node, db):
    """ACL documents with ${username}: the allowed publish arrives, the denied publish (PUBACK 0x87) and a publish
    no rule matches do not, and the denied subscribe gets SUBACK 0x87; a superuser reads past every rule."""
    name, watcher_name = unique("acl"), unique("super")
    add_device(db, name)
    add_device(db, watcher_name, superuser=True)
    db.mqtt_acl.insert_many([
        {"username": name, "permission": "allow", "action": "all", "topics": ["fleet/${username}/#"]},
        {"username": name, "permission": "deny", "action": "publish", "topics": ["fleet/${username}/locked"]},
        {"username": name, "permission": "deny", "action": "subscribe", "topics": ["fleet/${username}/private/#"]},
    ])
    watcher = Paho(node.port(), username=watcher_name, password=PASSWORD)
    device = Paho(node.port(), username=name, password=PASSWORD)
    try:
        assert watcher.connect() == 0 and device.connect() == 0
        assert watcher.subscribe("fleet/#") == [1]
        assert device.publish(f"fleet/{name}/locked", b"denied", 1) == 0x87
        assert device.publish("elsewhere/x", b"no rule", 1) == 0x87
        assert device.publish(f"fleet/{name}/ok", b"allowed", 1) == 0
        msg = watcher.next_message()
        assert (msg.topic, msg.payload) == (f"fleet/{name}/ok", b"allowed")
        assert watcher.next_message(0.3) is None
        assert device.subscribe(f"fleet/{name}/private/#") == [0x87]
        assert device.subscribe(f"fleet/{name}/status") == [1]
    finally:
        watcher.close()
        device.close()


def test_deleted_user_refused_within_a_second_and_revoked_acl_at_once(node, db):
    """With change streams: a deleted user is refused on a connect within a second of the delete, and a
    connected device whose allow rule is deleted is refused from its next publishes (connected clients stay)."""
    name = unique("del")
    add_device(db, name)
    db.mqtt_acl.insert_one({"username": name, "permission": "allow", "action": "publish", "topics": ["t/${username}"]})
    assert connack(node.port(), name) == 0  # its document is cached now (30 s)
    device = Paho(node.port(), username=name, password=PASSWORD)
    try:
        assert device.connect() == 0
        assert device.publish(f"t/{name}", b"before", 1) == 0
        db.mqtt_user.delete_one({"username": name})
        wait_until(lambda: connack(node.port(), name) == 0x86, timeout=1.0, interval=0.05,
                   what="the deleted user to be refused")
        db.mqtt_acl.delete_many({"username": name})
        wait_until(lambda: device.publish(f"t/{name}", b"after", 1) == 0x87, timeout=1.0, interval=0.05,
                   what="the revoked publish to be refused")
        assert not device.disconnected.is_set()  # not kicked: refused from its next publish on
    finally:
        device.close()


def test_without_change_streams_the_ttl_bounds_staleness(tmp_path_factory):
    """A server without change streams (standalone): a deleted user is still served from the cache at once, and
    refused within cache_ttl (2 s)."""
    ttl = 2.0
    server = MongoServer(str(tmp_path_factory.mktemp("mongo-standalone") / "db"), standalone=True).start()
    node = None
    try:
        node = NodeProcess(str(tmp_path_factory.mktemp("mongo-ttl") / "data"),
                           extra_args=["--config", node_config(tmp_path_factory.mktemp("ttl-conf"), server, ttl)])
        node.start()
        client = server.client()
        try:
            name = unique("ttl")
            add_device(client[DB], name)
            assert connack(node.port(), name) == 0
            client[DB].mqtt_user.delete_one({"username": name})
            assert connack(node.port(), name) == 0  # no change stream: the cached document still answers
            wait_until(lambda: connack(node.port(), name) == 0x86, timeout=ttl + 1.0, interval=0.1,
                       what="the deleted user to be refused within cache_ttl")
        finally:
            client.close()
        assert "mongodb_change_stream_unavailable" in node_logs(node)
    finally:
        if node is not None:
            node.stop()
        server.remove()


def metric(node, name: str) -> float:
    _, text = http_get(node)
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"no {name} in /metrics"
    return float(match.group(1))


def test_outage_serves_cached_devices_and_answers_others_server_unavailable(node, db, mongo):
    """MongoDB SIGKILLed: a device seen within cache_ttl connects, another gets "server unavailable" (3.1.1 code 3,
    v5 0x88), not counted as a failed login; the outage is logged once and counted. Back: everyone connects."""
    cached, cold = unique("cached"), unique("cold")
    add_device(db, cached)
    add_device(db, cold)
    db.mqtt_acl.insert_one({"username": cached, "permission": "allow", "action": "all", "topics": ["o/${username}"]})
    device_id = unique("cached-device")  # a device reconnects with its client id: its rules are cached under it
    assert connack(node.port(), cached, client_id=device_id) == 0
    mongo.kill()
    try:
        for level in (5, 4):
            assert connack(node.port(), cached, level=level, client_id=device_id) == 0
        for level, code in ((5, 0x88), (4, 3)):
            c = raw(node.port(), level, expect_ok=False, username=cold, password=PASSWORD.encode())
            try:
                assert c.connack.reason_code == code
            finally:
                c.close()
        assert connack(node.port(), cold) == 0x88
        d = Paho(node.port(), client_id=device_id, username=cached, password=PASSWORD)
        try:  # the cached device also publishes on its cached rules
            assert d.connect() == 0 and d.publish(f"o/{cached}", b"during", 1) == 0
        finally:
            d.close()
        assert metric(node, "twistmq_mongodb_up") == 0 and metric(node, "twistmq_mongodb_outages") >= 1
        logs = node_logs(node)
        assert "mqtt.auth.unavailable" in logs
        assert not re.search(rf"mqtt\.auth\.fail .*username='{cold}'", logs)
        assert logs.count("mongodb_unreachable") == 1
        assert mongo.uri not in logs
    finally:
        mongo.start()
    wait_until(lambda: connack(node.port(), cold) == 0, timeout=15, interval=0.2, what="the cold device to connect")
    assert connack(node.port(), cached, client_id=device_id) == 0
    wait_until(lambda: "mongodb_reachable" in node_logs(node), timeout=5, what="the end of the outage logged")
    assert metric(node, "twistmq_mongodb_up") == 1
