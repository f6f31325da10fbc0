"""Interoperability with real third-party clients: connect, QoS, cross-client, wildcards, retained, sessions.

One real node per module; clients, fixtures and the table marker live in interop_clients.py.
"""

from __future__ import annotations

import pytest

from tests.interop_table import AMQTT, MOSQUITTO, PAHO_5, PAHO_311
from tests.integration.interop_clients import (
    amqtt_close, amqtt_connect, amqtt_drain, amqtt_expect, amqtt_run, amqtt_until, AmqttThreadSub, interop,
    mosq_pub, need_mosquitto, PAHO, paho_params, WAIT)
from tests.integration.interop_clients import (  # noqa: F401 (fixtures, used by name)
    cleanup, mk_paho, mk_sub, node, ns)

pytestmark = pytest.mark.slow

# ========================================================================================================
# connect
# ========================================================================================================


@paho_params("connect")
def test_paho_connect(mk_paho, ns, v):
    """paho connects, gets CONNACK 0 and no session present with a clean session, and disconnects."""
    c = mk_paho(v, ns())
    rc, flags, _ = c.connack
    assert rc == 0 and not flags.session_present
    c.close()


@interop(AMQTT, "connect")
def test_amqtt_connect(node, ns):
    """amqtt connects (CONNACK 0) and disconnects."""
    async def run():
        c = await amqtt_connect(node.port(), ns())
        assert c.session.transitions.is_connected()
        await c.disconnect()
    amqtt_run(run)


@interop(MOSQUITTO, "connect")
def test_mosquitto_connect(mk_sub, node, ns):
    """mosquitto_sub connects, subscribes and exits 0 on -E; mosquitto_pub connects and publishes."""
    s = mk_sub([ns.topic()], client_id=ns("sub"), extra=["-E"])
    assert s.wait_exit() == 0
    assert any("received CONNACK (0)" in line for line in s.log)
    mosq_pub(node.port(), ns.topic(), "hello", client_id=ns("pub"))


# ========================================================================================================
# QoS 0/1/2
# ========================================================================================================


@pytest.mark.parametrize("v,qos", [
    pytest.param(v, q, id=f"v{'3.1.1' if v == 4 else '5'}-qos{q}", marks=interop(PAHO[v], f"QoS {q}"))
    for v in (4, 5) for q in (0, 1, 2)])
def test_paho_qos(mk_paho, ns, v, qos):
    """paho publishes at QoS n to a paho subscriber at QoS n; the message arrives once, at QoS n."""
    sub = mk_paho(v, ns("sub"))
    sub.subscribe(ns.topic("t"), qos)
    pub = mk_paho(v, ns("pub"))
    for i in range(3):
        pub.publish(ns.topic("t"), f"m{i}".encode(), qos)
    got = sub.expect(3)
    assert [(m.payload, m.qos) for m in got] == [(f"m{i}".encode(), qos) for i in range(3)]
    assert sub.drain(0.2) == []


@pytest.mark.parametrize("qos", [pytest.param(q, id=f"qos{q}", marks=interop(AMQTT, f"QoS {q}"))
                                 for q in (0, 1, 2)])
def test_amqtt_qos(node, ns, qos):
    """amqtt publishes at QoS n to an amqtt subscriber at QoS n; the message arrives once, at QoS n."""
    async def run():
        sub = await amqtt_connect(node.port(), ns("sub"))
        pub = await amqtt_connect(node.port(), ns("pub"))
        try:
            assert await sub.subscribe([(ns.topic("t"), qos)]) == [qos]
            for i in range(3):
                await pub.publish(ns.topic("t"), f"m{i}".encode(), qos=qos)
            got = await amqtt_expect(sub, 3)
            assert [(bytes(m.data), m.qos) for m in got] == [(f"m{i}".encode(), qos) for i in range(3)]
            assert await amqtt_drain(sub, 0.2) == []
        finally:
            await amqtt_close(pub, sub)
    amqtt_run(run)


@pytest.mark.parametrize("qos", [pytest.param(q, id=f"qos{q}", marks=interop(MOSQUITTO, f"QoS {q}"))
                                 for q in (0, 1, 2)])
def test_mosquitto_qos(mk_sub, node, ns, qos):
    """mosquitto_pub at QoS n to mosquitto_sub at QoS n: the message arrives once, at QoS n."""
    s = mk_sub([ns.topic("t")], client_id=ns("sub"), qos=qos)
    mosq_pub(node.port(), ns.topic("t"), "hello", client_id=ns("pub"), qos=qos)
    assert s.expect(1) == [[ns.topic("t"), str(qos), "0", "hello"]]
    assert s.drain(0.2) == []


# ========================================================================================================
# cross-client delivery: what one client publishes, every other client receives
# ========================================================================================================

_PUBLISHERS = [PAHO_311, PAHO_5, AMQTT, MOSQUITTO]


@pytest.mark.parametrize("publisher", [
    pytest.param(p, id=p.split()[0] + ("-5" if p == PAHO_5 else ""),
                 marks=interop(p, "cross-client delivery (to all four clients)")) for p in _PUBLISHERS])
def test_cross_client_delivery(node, mk_paho, mk_sub, cleanup, ns, publisher):
    """A QoS 1 message from one client reaches paho 3.1.1, paho 5, amqtt and mosquitto_sub subscribers."""
    need_mosquitto()
    topic, payload = ns.topic("x"), f"from {publisher}"
    p4 = mk_paho(4, ns("p4"))
    p4.subscribe(topic, 1)
    p5 = mk_paho(5, ns("p5"))
    p5.subscribe(topic, 1)
    am = AmqttThreadSub(node.port(), ns("am"), topic)
    cleanup.append(am)
    mo = mk_sub([topic], client_id=ns("mo"), qos=1)
    if publisher in (PAHO_311, PAHO_5):
        mk_paho(5 if publisher == PAHO_5 else 4, ns("pub")).publish(topic, payload.encode(), 1)
    elif publisher == AMQTT:
        async def run():
            c = await amqtt_connect(node.port(), ns("pub"))
            await c.publish(topic, payload.encode(), qos=1)
            await amqtt_close(c)
        amqtt_run(run)
    else:
        mosq_pub(node.port(), topic, payload, client_id=ns("pub"), qos=1)
    assert [(m.topic, m.payload) for m in p4.expect(1)] == [(topic, payload.encode())]
    assert [(m.topic, m.payload) for m in p5.expect(1)] == [(topic, payload.encode())]
    assert am.messages.get(timeout=WAIT) == (topic, payload.encode())
    assert mo.expect(1) == [[topic, "1", "0", payload]]


# ========================================================================================================
# wildcards
# ========================================================================================================

def _wildcard_topics(ns):
    return [ns.topic("a/temp"), ns.topic("a/b/temp"), ns.topic()]


@paho_params("wildcards + and #")
def test_paho_wildcards(mk_paho, ns, v):
    """``+`` matches exactly one level, ``#`` matches the parent and every level below."""
    plus, hash_ = mk_paho(v, ns("plus")), mk_paho(v, ns("hash"))
    plus.subscribe(ns.topic("+/temp"))
    hash_.subscribe(ns.topic("#"))
    pub = mk_paho(v, ns("pub"))
    for t in _wildcard_topics(ns):
        pub.publish(t, t.encode(), 1)
    pub.publish(ns.topic("end"), b"end", 1)
    assert [m.topic for m in hash_.until(b"end")] == _wildcard_topics(ns) + [ns.topic("end")]
    assert [m.topic for m in plus.expect(1)] == [ns.topic("a/temp")]
    assert plus.drain(0.2) == []


@interop(AMQTT, "wildcards + and #")
def test_amqtt_wildcards(node, ns):
    """``+`` matches exactly one level, ``#`` matches the parent and every level below (amqtt)."""
    async def run():
        plus = await amqtt_connect(node.port(), ns("plus"))
        hash_ = await amqtt_connect(node.port(), ns("hash"))
        pub = await amqtt_connect(node.port(), ns("pub"))
        try:
            await plus.subscribe([(ns.topic("+/temp"), 1)])
            await hash_.subscribe([(ns.topic("#"), 1)])
            for t in _wildcard_topics(ns):
                await pub.publish(t, t.encode(), qos=1)
            await pub.publish(ns.topic("end"), b"end", qos=1)
            got = await amqtt_until(hash_, b"end")
            assert [m.topic for m in got] == _wildcard_topics(ns) + [ns.topic("end")]
            assert [m.topic for m in await amqtt_expect(plus, 1)] == [ns.topic("a/temp")]
            assert await amqtt_drain(plus, 0.2) == []
        finally:
            await amqtt_close(pub, plus, hash_)
    amqtt_run(run)


@interop(MOSQUITTO, "wildcards + and #")
def test_mosquitto_wildcards(mk_sub, node, ns):
    """``+`` matches exactly one level, ``#`` matches the parent and every level below (mosquitto)."""
    plus = mk_sub([ns.topic("+/temp")], client_id=ns("plus"), qos=1)
    hash_ = mk_sub([ns.topic("#")], client_id=ns("hash"), qos=1)
    for t in _wildcard_topics(ns) + [ns.topic("end")]:
        mosq_pub(node.port(), t, t.rsplit("/", 1)[-1], client_id=ns("pub"), qos=1)
    assert [f[0] for f in hash_.until("end")] == _wildcard_topics(ns) + [ns.topic("end")]
    assert [f[0] for f in plus.expect(1)] == [ns.topic("a/temp")]
    assert plus.drain(0.2) == []


# ========================================================================================================
# retained messages
# ========================================================================================================


@paho_params("retained: set, wildcard match, clear")
def test_paho_retained(mk_paho, ns, v):
    """Retained messages reach a later ``+`` subscriber, flagged; an empty retained payload clears one."""
    pub = mk_paho(v, ns("pub"))
    pub.publish(ns.topic("r/1"), b"one", 1, retain=True)
    pub.publish(ns.topic("r/2"), b"two", 1, retain=True)
    s1 = mk_paho(v, ns("s1"))
    s1.subscribe(ns.topic("r/+"), 1)
    got = sorted((m.topic, m.payload, m.retain) for m in s1.expect(2))
    assert got == [(ns.topic("r/1"), b"one", True), (ns.topic("r/2"), b"two", True)]
    pub.publish(ns.topic("r/1"), b"", 1, retain=True)
    s2 = mk_paho(v, ns("s2"))
    s2.subscribe(ns.topic("#"), 1)
    assert [(m.topic, m.payload) for m in s2.expect(1)] == [(ns.topic("r/2"), b"two")]
    assert s2.drain(0.3) == []


@interop(AMQTT, "retained: set, wildcard match, clear")
def test_amqtt_retained(node, ns):
    """amqtt: retained messages reach a later ``+`` subscriber, flagged; an empty payload clears one."""
    async def run():
        pub = await amqtt_connect(node.port(), ns("pub"))
        s1 = s2 = None
        try:
            await pub.publish(ns.topic("r/1"), b"one", qos=1, retain=True)
            await pub.publish(ns.topic("r/2"), b"two", qos=1, retain=True)
            s1 = await amqtt_connect(node.port(), ns("s1"))
            await s1.subscribe([(ns.topic("r/+"), 1)])
            msgs = await amqtt_expect(s1, 2)
            got = sorted((m.topic, bytes(m.data), m.publish_packet.retain_flag) for m in msgs)
            assert got == [(ns.topic("r/1"), b"one", True), (ns.topic("r/2"), b"two", True)]
            await pub.publish(ns.topic("r/1"), b"", qos=1, retain=True)
            s2 = await amqtt_connect(node.port(), ns("s2"))
            await s2.subscribe([(ns.topic("#"), 1)])
            msgs = await amqtt_expect(s2, 1)
            assert [(m.topic, bytes(m.data)) for m in msgs] == [(ns.topic("r/2"), b"two")]
            assert await amqtt_drain(s2, 0.3) == []
        finally:
            await amqtt_close(*[c for c in (pub, s1, s2) if c])
    amqtt_run(run)


@interop(MOSQUITTO, "retained: set, wildcard match, clear")
def test_mosquitto_retained(mk_sub, node, ns):
    """mosquitto_pub -r sets retained messages a later ``+`` subscriber gets flagged; ``-r -n`` clears one."""
    port = node.port()
    mosq_pub(port, ns.topic("r/1"), "one", client_id=ns("pub"), qos=1, retain=True)
    mosq_pub(port, ns.topic("r/2"), "two", client_id=ns("pub"), qos=1, retain=True)
    s1 = mk_sub([ns.topic("r/+")], client_id=ns("s1"), qos=1)
    assert sorted(s1.expect(2)) == [[ns.topic("r/1"), "1", "1", "one"], [ns.topic("r/2"), "1", "1", "two"]]
    mosq_pub(port, ns.topic("r/1"), None, client_id=ns("pub"), qos=1, retain=True)
    s2 = mk_sub([ns.topic("#")], client_id=ns("s2"), qos=1)
    assert s2.expect(1) == [[ns.topic("r/2"), "1", "1", "two"]]
    assert s2.drain(0.3) == []


# ========================================================================================================
# persistent sessions
# ========================================================================================================


@paho_params("persistent session (offline messages)")
def test_paho_persistent_session(mk_paho, ns, v):
    """A persistent-session subscriber gets, on return, the QoS 1/2 messages published while it was away."""
    kw = dict(clean=False, session_expiry=300) if v == 5 else dict(clean=False)
    sub = mk_paho(v, ns("sub"), **kw)
    sub.subscribe(ns.topic("t"), 2)
    sub.close()
    pub = mk_paho(v, ns("pub"))
    for i, qos in enumerate((1, 2, 1)):
        pub.publish(ns.topic("t"), f"m{i}".encode(), qos)
    sub = mk_paho(v, ns("sub"), **kw)
    assert sub.connack[1].session_present
    # paho hands a QoS 2 message over only after PUBREL, so m1 may come after m2: compare as a set.
    assert sorted((m.payload, m.qos) for m in sub.expect(3)) == [(b"m0", 1), (b"m1", 2), (b"m2", 1)]


@interop(AMQTT, "persistent session (offline messages)")
def test_amqtt_persistent_session(node, ns):
    """An amqtt subscriber with clean session false gets the QoS 1 messages published while it was away."""
    async def run():
        sub = await amqtt_connect(node.port(), ns("sub"), clean=False)
        await sub.subscribe([(ns.topic("t"), 1)])
        await sub.disconnect()
        pub = await amqtt_connect(node.port(), ns("pub"))
        for i in range(3):
            await pub.publish(ns.topic("t"), f"m{i}".encode(), qos=1)
        sub = await amqtt_connect(node.port(), ns("sub"), clean=False)
        try:
            assert [bytes(m.data) for m in await amqtt_expect(sub, 3)] == [b"m0", b"m1", b"m2"]
        finally:
            await amqtt_close(pub, sub)
    amqtt_run(run)


@interop(MOSQUITTO, "persistent session (offline messages)")
def test_mosquitto_persistent_session(mk_sub, node, ns):
    """mosquitto_sub -c gets, on return, the QoS 1 messages published while it was away."""
    s = mk_sub([ns.topic("t")], client_id=ns("sub"), qos=1, extra=["-c", "-E"])
    assert s.wait_exit() == 0
    for i in range(3):
        mosq_pub(node.port(), ns.topic("t"), f"m{i}", client_id=ns("pub"), qos=1)
    s = mk_sub([ns.topic("t")], client_id=ns("sub"), qos=1, extra=["-c"])
    assert [f[-1] for f in s.expect(3)] == ["m0", "m1", "m2"]
