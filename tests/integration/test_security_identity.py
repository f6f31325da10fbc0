"""Nobody where they do not belong, on a real node with real clients: sessions, client ids, password guessing.

One node for most of the module: a password file (alice, bob, carol),
``allow_anonymous = false`` and this ACL (the SIGHUP tests change it and put it
back)::

    user alice
    topic readwrite alice/#
    topic readwrite news/#
    user bob
    topic readwrite bob/#
    topic write news/#
    user carol
    topic readwrite carol/#

- a client id whose session another identity made is refused (CONNACK 0x87 /
  return code 5), connected or stored, clean start or not, and the owner's
  session and connection are untouched;
- every delivery checks the read access of the identity connected now, so an
  ACL reload applies to subscriptions made before it;
- rules keyed by client id (``client`` sections, ``%c``) are refused unless
  ``use_username_as_clientid`` binds client ids to usernames;
- failed logins are counted per username and per address, separately.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time

import pytest

from mqtt_proxy.auth.passwords import hash_password
from mqtt_proxy.codec import PingReq, PingResp, Properties, PubAck, Publish
from tests.integration.node import TWISTD, NodeProcess
from tests.integration.security_support import (Paho, http_get, node_logs, publishes, raw, subscribe, toml_str,
                                                unique, write_config)

pytestmark = pytest.mark.slow

LOG_N = 10
PW = {"alice": "alice-Ident1ty-pw-7a1c", "bob": "bob-Ident1ty-pw-2f9e", "carol": "carol-Ident1ty-pw-5d03"}
WRONG = "n0t-the-Passw0rd-1e8b"
FAIL_DELAY, FAIL_DELAY_MAX = 0.2, 1.6
ACL = ("user alice\ntopic readwrite alice/#\ntopic readwrite news/#\n"
       "user bob\ntopic readwrite bob/#\ntopic write news/#\n"
       "user carol\ntopic readwrite carol/#\n")
LEVELS = pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])
NOT_AUTHORIZED = {5: 0x87, 4: 5}


def write_passwords(path) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for user, password in PW.items():
            handle.write(f"{user}:{hash_password(password, log_n=LOG_N)}\n")


def start_node(directory, acl: str = ACL, mqtt_extra: str = "") -> NodeProcess:
    """A node with the users above, anonymous refused, *acl*; its ACL path on the object."""
    conf = directory / "conf"
    conf.mkdir()
    write_passwords(conf / "passwd")
    (conf / "acl").write_text(acl, encoding="utf-8")
    config = write_config(conf, f"[mqtt]\npassword_file = {toml_str(conf / 'passwd')}\n"
                                f"acl_file = {toml_str(conf / 'acl')}\nallow_anonymous = false\n"
                                f"auth_fail_delay = {FAIL_DELAY}\nauth_fail_delay_max = {FAIL_DELAY_MAX}\n"
                                + mqtt_extra)
    node = NodeProcess(str(directory / "data"), extra_args=["--config", config]).start()
    node.acl = str(conf / "acl")
    return node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = start_node(tmp_path_factory.mktemp("identity"))
    yield n
    n.stop()


def login(node, user: str, level: int = 5, client_id: str | None = None, clean: bool = True,
          expect_ok: bool = True, expiry: int = 300):
    """A raw client logged in as *user*; persistent (``clean=False``) sessions ask for *expiry* seconds in v5."""
    props = Properties(session_expiry_interval=expiry) if level == 5 and not clean else Properties()
    return raw(node.port(), level, client_id=client_id, expect_ok=expect_ok, clean_start=clean, username=user,
               password=PW.get(user, WRONG).encode(), properties=props)


def log_lines(node, pattern: str) -> list[str]:
    return [ln for ln in node_logs(node).splitlines() if re.search(pattern, ln)]


def wait_log(node, pattern: str, count: int, timeout: float = 10.0) -> list[str]:
    """Wait until at least *count* log lines match *pattern*; return them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = log_lines(node, pattern)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} lines match {pattern!r}: {node_logs(node)[-3000:]}")


def publish_acked(client, topic: str, payload: bytes, pid: int = 1) -> int:
    client.send(Publish(topic, payload, qos=1, packet_id=pid))
    ack, _ = client.recv_until(PubAck)
    return ack.reason_code


def alive(client) -> bool:
    """The connection still answers a PINGREQ."""
    client.send(PingReq())
    try:
        client.recv_until(PingResp, timeout=3)
    except Exception:  # noqa: BLE001 - closed or silent: not alive
        return False
    return True


def sighup(node, pattern: str) -> str:
    before = len(log_lines(node, pattern))
    node.proc.send_signal(signal.SIGHUP)
    return wait_log(node, pattern, before + 1)[-1]


# -- session takeover across identities --------------------------------------------------------------

@LEVELS
def test_stored_session_of_another_user_is_refused(node, level):
    """bob reusing alice's persistent client id is refused and gets none of her messages; alice gets them later."""
    cid, topic = unique("alice-dev"), "alice/" + unique("t")
    a = login(node, "alice", level, cid, clean=False)
    assert subscribe(a, topic).reason_codes == (1,)
    a.close()
    wait_log(node, rf"client_disconnected client={re.escape(cid)}", 1)
    publisher = login(node, "alice", level)
    assert publish_acked(publisher, topic, b"for alice only") == 0
    publisher.close()
    b = login(node, "bob", level, cid, clean=False, expect_ok=False)
    try:
        assert (b.connack.reason_code, b.connack.session_present) == (NOT_AUTHORIZED[level], False)
        assert publishes(b.expect_closed()) == []
    finally:
        b.close()
    assert log_lines(node, rf"session_foreign_refused client='{re.escape(cid)}' identity='user:bob' "
                           r"owner='user:alice'")
    a = login(node, "alice", level, cid, clean=False)
    try:
        assert a.connack.session_present
        msg, _ = a.recv_until(Publish)
        assert (msg.topic, msg.payload) == (topic, b"for alice only")
    finally:
        a.close()


@LEVELS
def test_clean_start_by_another_user_leaves_the_owner_connected(node, level):
    """bob's clean-start CONNECT with alice's connected client id neither kicks alice nor discards her session."""
    cid, topic = unique("alice-live"), "alice/" + unique("t")
    a = login(node, "alice", level, cid, clean=False)
    try:
        assert subscribe(a, topic).reason_codes == (1,)
        b = login(node, "bob", level, cid, clean=True, expect_ok=False)
        assert b.connack.reason_code == NOT_AUTHORIZED[level]
        b.close()
        assert alive(a)
        assert publish_acked(a, topic, b"still mine", pid=7) == 0
        got = [p for p in a.recv_all() if isinstance(p, Publish)]
        assert [(p.topic, p.payload) for p in got] == [(topic, b"still mine")]
    finally:
        a.close()


def test_session_owner_survives_a_restart(tmp_path):
    """The owner is stored with the session: after a restart bob is still refused alice's stored session."""
    n = start_node(tmp_path)
    cid, topic = unique("alice-restart"), "alice/" + unique("t")
    try:
        a = login(n, "alice", 4, cid, clean=False)
        assert subscribe(a, topic).reason_codes == (1,)
        a.close()
        wait_log(n, rf"client_disconnected client={re.escape(cid)}", 1)
    finally:
        n.stop()
    again = n.start()
    try:
        b = login(again, "bob", 4, cid, clean=False, expect_ok=False)
        assert (b.connack.reason_code, b.connack.session_present) == (5, False)
        b.close()
        a = login(again, "alice", 4, cid, clean=False)
        assert a.connack.session_present
        a.close()
    finally:
        again.stop()


def test_same_user_still_takes_over_its_own_session(node):
    """The owner reconnecting with its client id takes the session over as before (MQTT-3.1.4-3)."""
    cid = unique("alice-own")
    first = login(node, "alice", 5, cid, clean=False)
    second = login(node, "alice", 5, cid, clean=False)
    try:
        assert second.connack.session_present
        first.expect_closed()
    finally:
        first.close()
        second.close()


# -- delivery checks the ACL of now ------------------------------------------------------------------

def test_acl_reload_applies_to_existing_subscriptions(node):
    """After SIGHUP removes alice's read on news/#, her existing news/# subscription delivers nothing more."""
    a = Paho(node.port(), username="alice", password=PW["alice"])
    b = Paho(node.port(), username="bob", password=PW["bob"])
    try:
        assert a.connect() == 0 and b.connect() == 0
        assert a.subscribe("news/#", 1) == [1] and a.subscribe("alice/inbox", 1) == [1]
        assert b.publish("news/a", b"before", 1) == 0
        msg = a.next_message()
        assert msg is not None and msg.payload == b"before"
        with open(node.acl, "w", encoding="utf-8") as handle:
            handle.write(ACL.replace("topic readwrite news/#\n", "", 1))
        assert "reload_ok kind=acl" in sighup(node, r"reload_ok kind=acl")
        assert b.publish("news/a", b"after", 1) == 0
        a2 = Paho(node.port(), username="alice", password=PW["alice"])
        assert a2.connect() == 0
        assert a2.publish("alice/inbox", b"queue moves on", 1) == 0
        a2.close()
        msg = a.next_message()
        assert msg is not None and (msg.topic, msg.payload) == ("alice/inbox", b"queue moves on")
        assert a.next_message(timeout=0.5) is None
        _, metrics = http_get(node)
        denied = re.search(r"^twistmq_denied_deliveries_messages_total (\S+)", metrics, re.M)
        assert denied and float(denied.group(1)) >= 1, metrics
        assert log_lines(node, r"delivery_denied client=\S+ user=alice topic=news/a")
    finally:
        with open(node.acl, "w", encoding="utf-8") as handle:
            handle.write(ACL)
        sighup(node, r"reload_ok kind=acl")
        a.close()
        b.close()


def test_acl_reload_applies_to_shared_subscriptions(node):
    """A $share subscription made before the reload delivers nothing the reloaded ACL denies; the group goes on."""
    a = Paho(node.port(), username="alice", password=PW["alice"])
    b = Paho(node.port(), username="bob", password=PW["bob"])
    try:
        assert a.connect() == 0 and b.connect() == 0
        group = unique("g")
        assert a.subscribe(f"$share/{group}/news/#", 1) == [1]
        with open(node.acl, "w", encoding="utf-8") as handle:
            handle.write(ACL.replace("topic readwrite news/#\n", "topic readwrite news/open/#\n", 1))
        sighup(node, r"reload_ok kind=acl")
        assert b.publish("news/closed", b"denied", 1) == 0
        assert b.publish("news/open/x", b"allowed", 1) == 0
        msg = a.next_message()
        assert msg is not None and (msg.topic, msg.payload) == ("news/open/x", b"allowed")
        assert a.next_message(timeout=0.5) is None
    finally:
        with open(node.acl, "w", encoding="utf-8") as handle:
            handle.write(ACL)
        sighup(node, r"reload_ok kind=acl")
        a.close()
        b.close()


# -- rules keyed by client id -----------------------------------------------------------------------

@pytest.mark.parametrize("rules", ["client sensor-7\ntopic read sensors/7/#\n", "pattern read devices/%c/#\n"],
                         ids=["client-section", "percent-c"])
def test_client_id_rules_without_binding_refused_at_start(tmp_path, rules):
    """An ACL keyed by client id without use_username_as_clientid stops the node: exit 2, one line."""
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic read a/#\n" + rules, encoding="utf-8")
    config = write_config(tmp_path, f"[mqtt]\nacl_file = {toml_str(acl)}\n")
    done = subprocess.run([TWISTD, "-n", "--pidfile=", "twistmq", "node", "--config", config,
                           "--data-dir", str(tmp_path / "data"), "--mqtt", "tcp:0:interface=127.0.0.1"],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("twistmq:")]
    assert len(errors) == 1 and errors[0].startswith(f"twistmq: {acl}:3: "), done.stderr
    assert "use_username_as_clientid" in errors[0]
    assert "Traceback" not in done.stderr + done.stdout


def test_client_id_rules_without_binding_refused_on_reload(node):
    """SIGHUP with a client section in the ACL keeps the old rules and logs one reload_failed line."""
    try:
        with open(node.acl, "w", encoding="utf-8") as handle:
            handle.write(ACL + "client sensor-7\ntopic read alice/#\n")
        line = sighup(node, r"reload_failed kind=acl")
        assert "use_username_as_clientid" in line and "kept=previous" in line
        c = login(node, "carol", 5, "sensor-7")
        try:
            assert subscribe(c, "alice/#").reason_codes == (0x87,)
            assert subscribe(c, "carol/#", pid=2).reason_codes == (1,)
        finally:
            c.close()
    finally:
        with open(node.acl, "w", encoding="utf-8") as handle:
            handle.write(ACL)
        sighup(node, r"reload_ok kind=acl")


def test_use_username_as_clientid_binds_client_rules(tmp_path):
    """With use_username_as_clientid, the client id is the username: client rules and %c follow the login."""
    acl = ("pattern readwrite devices/%c/#\nuser alice\ntopic read alice/#\n"
           "client alice\ntopic read fleet/#\n")
    n = start_node(tmp_path, acl=acl, mqtt_extra="use_username_as_clientid = true\n")
    try:
        # bob asks for alice's client id: he gets his own, and none of alice's client-keyed rights
        b = login(n, "bob", 5, client_id="alice")
        try:
            assert subscribe(b, "fleet/#").reason_codes == (0x87,)
            assert subscribe(b, "devices/alice/#", pid=2).reason_codes == (0x87,)
            assert subscribe(b, "devices/bob/#", pid=3).reason_codes == (1,)
        finally:
            b.close()
        a = login(n, "alice", 5, client_id="whatever")
        try:
            assert subscribe(a, "fleet/#").reason_codes == (1,)
            assert subscribe(a, "devices/alice/#", pid=2).reason_codes == (1,)
        finally:
            a.close()
        nobody = raw(n.port(), 5, expect_ok=False)  # no username: nothing to bind the id to
        try:
            assert nobody.connack.reason_code == 0x87
        finally:
            nobody.close()
    finally:
        n.stop()


# -- password guessing -------------------------------------------------------------------------------

def timed_login(node, user: str, password: str) -> tuple[int | None, float]:
    """A paho login from 127.0.0.1; return (CONNACK code, seconds to it)."""
    client = Paho(node.port(), username=user, password=password)
    start = time.monotonic()
    try:
        code = client.connect(timeout=15)
        return code, time.monotonic() - start
    finally:
        client.close()


def test_another_accounts_login_does_not_reset_guessing(node):
    """After carol's password failed four times, alice's login from the same address does not reset carol's delay."""
    for _ in range(4):
        assert timed_login(node, "carol", WRONG)[0] == 0x86  # answered after 0.2, 0.4, 0.8, 1.6 s
    assert timed_login(node, "alice", PW["alice"])[0] == 0
    code, took = timed_login(node, "carol", WRONG)
    assert code == 0x86 and took >= FAIL_DELAY_MAX * 0.9, took  # still capped, not back to 0.2 s
    assert timed_login(node, "carol", PW["carol"])[0] == 0  # her own success clears her count


def test_one_users_failures_do_not_lock_out_the_address(node):
    """While bob's fifth failure is being held back, alice behind the same address logs in at once."""
    before = len(log_lines(node, r"mqtt\.auth\.fail .*username='bob'"))
    for _ in range(4):
        assert timed_login(node, "bob", WRONG)[0] == 0x86
    box = []
    pending = threading.Thread(target=lambda: box.append(timed_login(node, "bob", WRONG)))
    pending.start()
    try:
        wait_log(node, r"mqtt\.auth\.fail .*username='bob'", before + 5)
        code, took = timed_login(node, "alice", PW["alice"])
        assert code == 0 and took < FAIL_DELAY_MAX / 2, took
    finally:
        pending.join(20)
    assert box and box[0][0] == 0x86
    assert timed_login(node, "bob", PW["bob"])[0] == 0
