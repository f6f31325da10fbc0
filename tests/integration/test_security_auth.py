"""Password authentication and the ACL on a real node: CONNACK codes, publish/subscribe/retained enforcement.

One node for the module: ``allow_anonymous = false``, a password file (alice
added with the real ``twistmq-admin passwd`` command, bob with the
``PasswordFile`` API) and this ACL::

    pattern readwrite users/%u/#        # every user: its own username tree
    user alice
    topic readwrite acl/alice/#
    topic read ret/open/#
    topic read shared/#
    topic deny shared/secret/#
    user bob
    topic readwrite acl/bob/#
    topic write ret/#
    user dave                           # may schedule delayed publishes
    topic write $delayed/#

Exact reason codes come from the raw codec client; paho shows a real client
sees the same. The other half of anonymous access (accepted when
``allow_anonymous = true``) is in ``test_security_tls.py``.
"""

from __future__ import annotations

import time

import pytest

from mqtt_proxy.auth.passwords import PasswordFile
from mqtt_proxy.codec import PingReq, PubAck, Publish, PubRec
from mqtt_proxy.codec.packets import PingResp, Will
from tests.integration.node import NodeProcess
from tests.integration.security_support import (Paho, add_user, node_logs, publishes, raw, subscribe,
                                                subscribe_many, toml_str, unique, write_config)
from tests.integration.waiting import wait_until

ALICE_PW = "alice-Secr3t-c0rrect-horse-91d2"
BOB_PW = "bob-Secr3t-battery-staple-4e7a"
DAVE_PW = "dave-Secr3t-delayed-8c0f"
WRONG_PW = "n0t-the-Passw0rd-5b1c"
FAIL_DELAY = 0.2
LEVELS = pytest.mark.parametrize("level", [5, 4], ids=["v5", "v311"])

ACL = """\
# every client (rules keyed by client id, %c, need use_username_as_clientid: test_security_identity.py)
pattern readwrite users/%u/#

user alice
topic readwrite acl/alice/#
topic read ret/open/#
topic read shared/#
topic deny shared/secret/#

user bob
topic readwrite acl/bob/#
topic write ret/#

user dave
topic write $delayed/#
"""


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    conf = tmp_path_factory.mktemp("auth-conf")
    passwords = str(conf / "passwd")
    add_user(passwords, "alice", ALICE_PW)  # the real CLI, password on stdin
    table = PasswordFile.load(passwords)  # and the Python API
    table.add("bob", BOB_PW)
    table.add("dave", DAVE_PW)
    table.save(passwords)
    (conf / "acl").write_text(ACL)
    config = write_config(conf, f"[mqtt]\npassword_file = {toml_str(passwords)}\n"
                                f"acl_file = {toml_str(conf / 'acl')}\nallow_anonymous = false\n"
                                f"auth_fail_delay = {FAIL_DELAY}\nauth_fail_delay_max = {FAIL_DELAY}\n")
    n = NodeProcess(str(tmp_path_factory.mktemp("auth") / "data"), extra_args=["--config", config]).start()
    yield n
    n.stop()


def alice(node, level, client_id=None, **kw):
    return raw(node.port(), level, client_id, username="alice", password=ALICE_PW.encode(), **kw)


def bob(node, level, client_id=None):
    return raw(node.port(), level, client_id, username="bob", password=BOB_PW.encode())


def denied_suback(level: int) -> int:
    return 0x87 if level == 5 else 0x80


def still_up(c) -> None:
    """The connection answers a PINGREQ."""
    c.send(PingReq())
    pong, _ = c.recv_until(PingResp)
    assert isinstance(pong, PingResp)


# -- passwords -------------------------------------------------------------------------------------

@LEVELS
def test_good_password_connects(node, level):
    """paho with the right username and password gets CONNACK success (users made by CLI and by API)."""
    for user, password in (("alice", ALICE_PW), ("bob", BOB_PW)):
        c = Paho(node.port(), level=level, username=user, password=password)
        try:
            assert c.connect() == 0
        finally:
            c.close()


@LEVELS
def test_bad_password_refused(node, level):
    """A wrong password or an unknown user is refused: CONNACK 0x86 in v5, return code 4 in 3.1.1, then closed."""
    want = 0x86 if level == 5 else 4
    for user, password in (("alice", WRONG_PW), ("mallory", ALICE_PW), ("alice", None)):
        c = raw(node.port(), level, expect_ok=False, username=user,
                password=password.encode() if password else None)
        try:
            assert c.connack.reason_code == want, (user, c.connack)
            c.expect_closed()
        finally:
            c.close()
    p = Paho(node.port(), level=level, username="alice", password=WRONG_PW)
    try:
        assert p.connect() == 0x86  # paho maps return code 4 to 0x86
    finally:
        p.close()


@LEVELS
def test_anonymous_refused_when_not_allowed(node, level):
    """With allow_anonymous = false a client without a username is refused: 0x87 in v5, return code 5 in 3.1.1."""
    c = raw(node.port(), level, expect_ok=False)
    try:
        assert c.connack.reason_code == (0x87 if level == 5 else 5)
        c.expect_closed()
    finally:
        c.close()
    p = Paho(node.port(), level=level)
    try:
        assert p.connect() == 0x87
    finally:
        p.close()


def test_failed_login_answered_after_the_delay(node):
    """A failed login is answered only after auth_fail_delay; a good one right away."""
    start = time.monotonic()
    c = raw(node.port(), 5, expect_ok=False, username="alice", password=WRONG_PW.encode())
    slow = time.monotonic() - start
    c.close()
    assert c.connack.reason_code == 0x86
    assert slow >= FAIL_DELAY * 0.9, slow
    start = time.monotonic()
    alice(node, 5).close()
    assert time.monotonic() - start < FAIL_DELAY * 3


# -- ACL: publish ----------------------------------------------------------------------------------

@LEVELS
def test_acl_publish_allowed_and_denied(node, level):
    """Publishing without write is refused (v5 PUBACK/PUBREC 0x87; 3.1.1 acked and dropped); the link stays up."""
    a, watcher, a_own = alice(node, level), bob(node, level), alice(node, level)
    try:
        mine = "acl/alice/" + unique("t")
        theirs = "acl/bob/" + unique("t")
        assert subscribe(watcher, theirs + "/#").reason_codes == (1,)
        assert subscribe(a_own, mine + "/#").reason_codes == (1,)
        a.send(Publish(theirs + "/x", b"denied qos1", qos=1, packet_id=1))
        ack, _ = a.recv_until(PubAck)
        assert (ack.packet_id, ack.reason_code) == (1, 0x87 if level == 5 else 0)
        a.send(Publish(theirs + "/x", b"denied qos2", qos=2, packet_id=2))
        rec, _ = a.recv_until(PubRec)
        assert (rec.packet_id, rec.reason_code) == (2, 0x87 if level == 5 else 0)
        a.send(Publish(theirs + "/x", b"denied qos0", qos=0))
        still_up(a)
        a.send(Publish(mine + "/x", b"allowed", qos=1, packet_id=3))
        ack, _ = a.recv_until(PubAck)
        assert (ack.packet_id, ack.reason_code) == (3, 0)
        msg, _ = a_own.recv_until(Publish)
        assert msg.payload == b"allowed"
        assert publishes(watcher.recv_all(0.4)) == []  # no denied message reached a reader
        assert not a.closed
    finally:
        for c in (a, watcher, a_own):
            c.close()


def test_acl_publish_denied_with_paho(node):
    """paho v5 sees PUBACK 0x87 for a denied publish and keeps its connection; paho 3.1.1 gets the ack and stays up."""
    for level in (5, 4):
        c = Paho(node.port(), level=level, username="alice", password=ALICE_PW)
        try:
            assert c.connect() == 0
            assert c.publish("acl/bob/" + unique("t"), b"no", 1) == (0x87 if level == 5 else 0)
            assert c.publish("acl/alice/" + unique("t"), b"yes", 1) == 0
            assert not c.disconnected.is_set()
        finally:
            c.close()


@LEVELS
def test_acl_applies_to_will_messages(node, level):
    """A will is published only where its owner may write: the denied will never reaches a reader."""
    tag = unique("w")
    watcher_a, watcher_b = alice(node, level), bob(node, level)
    try:
        assert subscribe(watcher_a, f"acl/alice/{tag}/#").reason_codes == (1,)
        assert subscribe(watcher_b, f"acl/bob/{tag}/#").reason_codes == (1,)
        allowed = alice(node, level, will=Will(f"acl/alice/{tag}/will", b"allowed will", qos=1))
        denied = alice(node, level, will=Will(f"acl/bob/{tag}/will", b"denied will", qos=1))
        allowed.close()  # no DISCONNECT: the will goes out
        denied.close()
        msg, _ = watcher_a.recv_until(Publish)
        assert msg.payload == b"allowed will"
        assert publishes(watcher_b.recv_all(0.5)) == []
    finally:
        watcher_a.close()
        watcher_b.close()


def test_acl_delayed_publish_to_own_topic_allowed(node):
    """alice may write acl/alice/#, so a $delayed/1/acl/alice/... publish is accepted and delivered a second later."""
    topic = f"acl/alice/{unique('d')}/x"
    a, reader = alice(node, 5), alice(node, 5)
    try:
        assert subscribe(reader, topic).reason_codes == (1,)
        a.send(Publish("$delayed/1/" + topic, b"later", qos=1, packet_id=1))
        ack, _ = a.recv_until(PubAck)
        assert ack.reason_code == 0, hex(ack.reason_code)
        msg, _ = reader.recv_until(Publish, timeout=4)
        assert (msg.topic, msg.payload) == (topic, b"later")
    finally:
        a.close()
        reader.close()


def test_acl_delayed_publish_cannot_bypass_write_rules(node):
    """dave may schedule delayed publishes but not write acl/bob/#: $delayed/1/acl/bob/... must not reach bob."""
    topic = f"acl/bob/{unique('d')}/x"
    d = raw(node.port(), 5, username="dave", password=DAVE_PW.encode())
    watcher = bob(node, 5)
    try:
        assert subscribe(watcher, topic).reason_codes == (1,)
        d.send(Publish("$delayed/1/" + topic, b"smuggled", qos=1, packet_id=1))
        d.recv_until(PubAck)
        assert publishes(watcher.recv_all(2.0)) == [], "a delayed publish reached a topic its sender may not write"
    finally:
        d.close()
        watcher.close()


# -- ACL: subscribe --------------------------------------------------------------------------------

@LEVELS
def test_acl_subscribe_allowed_and_denied(node, level):
    """SUBACK grants covered filters and refuses others (0x87 v5 / 0x80 3.1.1), including any overlapping a deny."""
    a = alice(node, level)
    try:
        ack = subscribe_many(a, ["acl/alice/#", "acl/bob/#", "shared/open/#", "shared/#", "#", "shared/secret/x",
                                 "$share/g/acl/alice/#", "$share/g/acl/bob/#"])
        no = denied_suback(level)
        assert ack.reason_codes == (1, no, 1, no, no, no, 1, no)
        still_up(a)
    finally:
        a.close()


def test_acl_subscribe_denied_with_paho(node):
    """paho sees 0x87 (v5) / 0x80 (3.1.1) in SUBACK for a filter it may not read, and success for one it may."""
    for level in (5, 4):
        c = Paho(node.port(), level=level, username="alice", password=ALICE_PW)
        try:
            assert c.connect() == 0
            assert c.subscribe("acl/bob/#", 1) == [denied_suback(level)]
            assert c.subscribe("acl/alice/#", 1) == [1]
        finally:
            c.close()


# -- ACL: retained reads ---------------------------------------------------------------------------

@LEVELS
def test_acl_retained_reads(node, level):
    """Retained messages go only to readers allowed to read them; a wildcard reaching unreadable ones is refused."""
    tag = unique("r")
    writer = bob(node, level)
    try:
        for topic in (f"ret/open/{tag}/a", f"ret/closed/{tag}/b"):
            writer.send(Publish(topic, b"retained " + topic.encode(), qos=1, packet_id=1, retain=True))
            ack, _ = writer.recv_until(PubAck)
            assert ack.reason_code == 0
    finally:
        writer.close()
    reader = alice(node, level)
    try:
        # A wildcard over both the readable and the unreadable retained message: refused, nothing delivered.
        assert subscribe(reader, f"ret/+/{tag}/#", pid=1).reason_codes == (denied_suback(level),)
        assert subscribe(reader, f"ret/closed/{tag}/b", pid=2).reason_codes == (denied_suback(level),)
        assert publishes(reader.recv_all(0.4)) == []
        # A wildcard over readable topics only: exactly the readable retained message.
        assert subscribe(reader, f"ret/open/{tag}/#", pid=3).reason_codes == (1,)
        got = publishes(reader.recv_all(0.5))
        assert [(p.topic, p.retain) for p in got] == [(f"ret/open/{tag}/a", True)]
    finally:
        reader.close()
    # bob may write ret/# but not read it: his wildcard subscription is refused and gets no retained message.
    nosy = bob(node, level)
    try:
        assert subscribe(nosy, f"ret/open/{tag}/#").reason_codes == (denied_suback(level),)
        assert publishes(nosy.recv_all(0.3)) == []
    finally:
        nosy.close()


# -- ACL: %u -----------------------------------------------------------------------------------------

@LEVELS
def test_acl_username_pattern(node, level):
    """%u grants a user its users/<username>/ tree and nothing more; no rule is keyed by the chosen client id."""
    cid = unique("dev")
    a = alice(node, level, client_id=cid)
    try:
        no = denied_suback(level)
        ack = subscribe_many(a, [f"clients/{cid}/#", "users/alice/#", "users/bob/#"])
        assert ack.reason_codes == (no, 1, no)
        a.send(Publish("users/alice/state", b"by %u", qos=1, packet_id=2))
        a.send(Publish("users/bob/state", b"not mine", qos=1, packet_id=3))
        acks = {}
        got = []
        deadline = time.monotonic() + 5
        while len(acks) < 2 or len(got) < 1:
            assert time.monotonic() < deadline, (acks, got)
            p = a.recv()
            if isinstance(p, PubAck):
                acks[p.packet_id] = p.reason_code
            elif isinstance(p, Publish):
                got.append(p.payload)
        assert acks == {2: 0, 3: 0x87 if level == 5 else 0}
        assert got == [b"by %u"]
    finally:
        a.close()
    b = bob(node, level)
    try:
        assert subscribe(b, "users/bob/#").reason_codes == (1,)
        assert subscribe(b, "users/alice/#", pid=2).reason_codes == (denied_suback(level),)
    finally:
        b.close()


def test_no_password_in_auth_node_logs(node):
    """After good and bad logins (both versions) the node's stdout and stderr logs hold no password."""
    ids = []
    for level in (5, 4):
        ids += [unique("logs-ok"), unique("logs-fail")]
        alice(node, level, ids[-2]).close()
        raw(node.port(), level, ids[-1], expect_ok=False, username="bob", password=WRONG_PW.encode()).close()
    wait_until(lambda: all(f"client_id={cid!r}" in node_logs(node) for cid in ids),
               what="the node's log line of every attempt")
    logs = node_logs(node)
    assert "mqtt.auth.fail" in logs and "mqtt.auth.ok" in logs  # attempts are logged ...
    for secret in (ALICE_PW, BOB_PW, WRONG_PW):
        assert secret not in logs  # ... without the password
    assert "PRIVATE KEY" not in logs
