"""Interoperability with real third-party clients: MQTT 5 features and $SYS.

One real node per module; clients, fixtures and the table marker live in interop_clients.py.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from paho.mqtt.subscribeoptions import SubscribeOptions
from tests.interop_table import AMQTT, MOSQUITTO, PAHO_5
from tests.integration.interop_clients import (
    amqtt_close, amqtt_connect, amqtt_expect, amqtt_run, amqtt_until, interop, mosq_pub, paho_params,
    props5, SERVER_KEEP_ALIVE)
from tests.integration.interop_clients import (  # noqa: F401 (fixtures, used by name)
    cleanup, mk_paho, mk_sub, node, ns)
from tests.integration.waiting import CLOCK_MARGIN_S

pytestmark = pytest.mark.slow

# ========================================================================================================
# MQTT 5 features
# ========================================================================================================


@interop(PAHO_5, "topic alias (client to broker)")
def test_paho5_topic_alias(mk_paho, ns):
    """A publisher sets alias 1, publishes with an empty topic, remaps it; subscribers see full topics."""
    sub = mk_paho(5, ns("sub"))
    sub.subscribe(ns.topic("#"), 1)
    pub = mk_paho(5, ns("pub"))
    pub.publish(ns.topic("long/topic"), b"first", 1, props=props5(TopicAlias=1))
    pub.publish("", b"second", 1, props=props5(TopicAlias=1))
    pub.publish("", b"third", 1, props=props5(TopicAlias=1))
    pub.publish(ns.topic("other"), b"remapped", 1, props=props5(TopicAlias=1))  # alias 1 now means "other"
    pub.publish("", b"fifth", 1, props=props5(TopicAlias=1))
    got = sub.expect(5)
    assert [(m.topic, m.payload) for m in got] == (
        [(ns.topic("long/topic"), p) for p in (b"first", b"second", b"third")]
        + [(ns.topic("other"), b"remapped"), (ns.topic("other"), b"fifth")])


@interop(PAHO_5, "topic alias (broker to client)")
def test_paho5_topic_alias_from_broker(mk_paho, ns):
    """A subscriber announcing Topic Alias Maximum gets the topic once with an alias, then the alias alone."""
    sub = mk_paho(5, ns("sub"), connect_props={"TopicAliasMaximum": 4})
    sub.subscribe(ns.topic("t"), 1)
    pub = mk_paho(5, ns("pub"))
    for p in (b"1", b"2", b"3"):
        pub.publish(ns.topic("t"), p, 1)
    got = sub.expect(3)
    aliases = [getattr(m.properties, "TopicAlias", None) for m in got]
    assert aliases[0] and aliases == [aliases[0]] * 3, aliases
    # paho 2.2 hands aliased PUBLISHes over as they came: the topic only on the first.
    assert [(m.topic, m.payload) for m in got] == [(ns.topic("t"), b"1"), ("", b"2"), ("", b"3")]


@interop(PAHO_5, "message expiry")
def test_paho5_message_expiry(mk_paho, ns):
    """Expiry is passed on; offline, an expired message is dropped, a live one keeps its remaining time."""
    sub = mk_paho(5, ns("sub"), clean=False, session_expiry=300)
    sub.subscribe(ns.topic("t"), 1)
    pub = mk_paho(5, ns("pub"))
    pub.publish(ns.topic("t"), b"live", 1, props=props5(MessageExpiryInterval=50))
    live = sub.expect(1)[0]
    assert live.payload == b"live" and 45 <= live.properties.MessageExpiryInterval <= 50
    sub.close()
    pub.publish(ns.topic("t"), b"short", 1, props=props5(MessageExpiryInterval=1))
    pub.publish(ns.topic("t"), b"long", 1, props=props5(MessageExpiryInterval=100))
    # The subject is time passing on the node: "short" (1 s) must expire, and the remaining expiry of
    # "long" (100 s, sent rounded up) must read 98 or less, so two full seconds.
    time.sleep(2 + CLOCK_MARGIN_S)
    sub = mk_paho(5, ns("sub"), clean=False, session_expiry=300)
    got = sub.expect(1)
    assert got[0].payload == b"long"
    left = got[0].properties.MessageExpiryInterval
    assert 90 <= left <= 98, f"remaining expiry {left}, expected about 98"
    assert sub.drain(0.3) == []


@interop(PAHO_5, "user properties, content type, payload format, response topic, correlation data")
def test_paho5_properties_pass_through(mk_paho, ns):
    """User properties (in order), content type, payload format, response topic, correlation data pass."""
    sub = mk_paho(5, ns("sub"))
    sub.subscribe(ns.topic("t"), 1)
    pub = mk_paho(5, ns("pub"))
    props = props5(UserProperty=[("a", "1"), ("b", "2"), ("a", "3")], ContentType="application/json",
                   PayloadFormatIndicator=1, ResponseTopic=ns.topic("reply"), CorrelationData=b"\x00\x01corr")
    pub.publish(ns.topic("t"), b'{"x": 1}', 1, props=props)
    p = sub.expect(1)[0].properties
    assert p.UserProperty == [("a", "1"), ("b", "2"), ("a", "3")]
    assert (p.ContentType, p.PayloadFormatIndicator, p.ResponseTopic, p.CorrelationData) == (
        "application/json", 1, ns.topic("reply"), b"\x00\x01corr")


@interop(PAHO_5, "subscription identifiers")
def test_paho5_subscription_identifiers(mk_paho, ns):
    """A message carries the identifiers of the subscriptions it matched, retained ones on subscribe too."""
    sub = mk_paho(5, ns("sub"))
    sub.subscribe(ns.topic("a/+"), options=SubscribeOptions(qos=1), sub_id=7)
    sub.subscribe(ns.topic("#"), options=SubscribeOptions(qos=1), sub_id=9)
    pub = mk_paho(5, ns("pub"))
    pub.publish(ns.topic("a/x"), b"both", 1)
    pub.publish(ns.topic("b"), b"one", 1)
    got = sub.until(b"one")
    ids = sorted(i for m in got if m.payload == b"both" for i in m.properties.SubscriptionIdentifier)
    assert ids == [7, 9], [(m.payload, m.properties.SubscriptionIdentifier) for m in got]
    assert [m.properties.SubscriptionIdentifier for m in got if m.payload == b"one"] == [[9]]
    pub.publish(ns.topic("r"), b"kept", 1, retain=True)
    late = mk_paho(5, ns("late"))
    late.subscribe(ns.topic("+"), options=SubscribeOptions(qos=1), sub_id=11)
    got = late.expect(1)
    assert [(m.payload, m.retain, m.properties.SubscriptionIdentifier) for m in got] == [
        (b"kept", True, [11])]


@interop(PAHO_5, "no local")
def test_paho5_no_local(mk_paho, ns):
    """With no-local, a client does not get its own publishes back, but does get other clients'."""
    c = mk_paho(5, ns("self"))
    c.subscribe(ns.topic("t"), options=SubscribeOptions(qos=1, noLocal=True))
    c.publish(ns.topic("t"), b"mine", 1)
    mk_paho(5, ns("other")).publish(ns.topic("t"), b"theirs", 1)
    assert [m.payload for m in c.until(b"theirs")] == [b"theirs"]
    assert c.drain(0.3) == []


@interop(PAHO_5, "retain handling 0/1/2")
def test_paho5_retain_handling(mk_paho, ns):
    """Retain handling 0 sends retained on every subscribe, 1 only on a new subscription, 2 never."""
    mk_paho(5, ns("pub")).publish(ns.topic("t"), b"kept", 1, retain=True)
    c = mk_paho(5, ns("sub"))
    marker = mk_paho(5, ns("marker"))

    def subscribe_and_see(topic_filter, rh):
        c.subscribe(topic_filter, options=SubscribeOptions(qos=1, retainHandling=rh))
        marker.publish(ns.topic("t"), b"live", 1)  # not retained: ends what this subscribe delivered
        return [m.payload for m in c.until(b"live")]
    t = ns.topic("t")
    assert subscribe_and_see(t, 0) == [b"kept", b"live"]
    assert subscribe_and_see(t, 0) == [b"kept", b"live"]      # 0: again on a re-subscribe
    c.unsubscribe(t)
    assert subscribe_and_see(t, 1) == [b"kept", b"live"]      # 1: new subscription
    assert subscribe_and_see(t, 1) == [b"live"]               # 1: existing subscription
    c.unsubscribe(t)
    assert subscribe_and_see(t, 2) == [b"live"]               # 2: never


@interop(PAHO_5, "retain as published")
def test_paho5_retain_as_published(mk_paho, ns):
    """Live retained messages keep RETAIN=1 only with retain-as-published; on subscribe they always do."""
    rap = mk_paho(5, ns("rap"))
    rap.subscribe(ns.topic("t"), options=SubscribeOptions(qos=1, retainAsPublished=True))
    plain = mk_paho(5, ns("plain"))
    plain.subscribe(ns.topic("t"), options=SubscribeOptions(qos=1, retainAsPublished=False))
    mk_paho(5, ns("pub")).publish(ns.topic("t"), b"flagged", 1, retain=True)
    assert [(m.payload, m.retain) for m in rap.expect(1)] == [(b"flagged", True)]
    assert [(m.payload, m.retain) for m in plain.expect(1)] == [(b"flagged", False)]
    late = mk_paho(5, ns("late"))
    late.subscribe(ns.topic("t"), options=SubscribeOptions(qos=1, retainAsPublished=False))
    assert [(m.payload, m.retain) for m in late.expect(1)] == [(b"flagged", True)]  # sent because retained


@interop(PAHO_5, "assigned client identifier")
def test_paho5_assigned_client_identifier(mk_paho, ns):
    """A v5 client connecting with an empty client id gets an Assigned Client Identifier it can use."""
    c = mk_paho(5, "")
    assigned = c.connack[2].AssignedClientIdentifier
    assert assigned
    c.subscribe(ns.topic("t"), 1)
    c.publish(ns.topic("t"), b"works", 1)
    assert [m.payload for m in c.expect(1)] == [b"works"]


@interop(PAHO_5, "server keep alive")
def test_paho5_server_keep_alive(mk_paho, ns):
    """A v5 client asking for a keep alive above the broker's maximum is told the maximum in CONNACK."""
    c = mk_paho(5, ns(), keepalive=120)
    assert c.connack[2].ServerKeepAlive == SERVER_KEEP_ALIVE
    short = mk_paho(5, ns("short"), keepalive=10)
    assert not hasattr(short.connack[2], "ServerKeepAlive")


@interop(MOSQUITTO, "user properties, content type, payload format, response topic, correlation data")
def test_mosquitto_properties_pass_through(mk_sub, node, ns):
    """mosquitto_pub -V 5 -D publish properties reach mosquitto_sub unchanged."""
    s = mk_sub([ns.topic("t")], client_id=ns("sub"), qos=1, v5=True, fmt="%P|%C|%F|%R|%D|%p")
    mosq_pub(node.port(), ns.topic("t"), "body", client_id=ns("pub"), qos=1, v5=True,
             props=[("user-property", "k", "v"), ("content-type", "text/plain"),
                    ("payload-format-indicator", 1),
                    ("response-topic", ns.topic("reply")), ("correlation-data", "corr-1")])
    assert s.expect(1) == [["k:v", "text/plain", "1", ns.topic("reply"), "corr-1", "body"]]


@interop(MOSQUITTO, "topic alias (client to broker)")
def test_mosquitto_topic_alias(mk_sub, node, ns):
    """mosquitto_pub -l -D publish topic-alias 1 sends the topic once, then only the alias; all arrive."""
    s = mk_sub([ns.topic("#")], client_id=ns("sub"), qos=1)
    mosq_pub(node.port(), ns.topic("long/topic"), None, client_id=ns("pub"), qos=1, v5=True,
             props=[("topic-alias", 1)], lines=["a", "b", "c"])
    assert s.expect(3) == [[ns.topic("long/topic"), "1", "0", p] for p in ("a", "b", "c")]


@interop(MOSQUITTO, "retain as published")
def test_mosquitto_retain_as_published(mk_sub, node, ns):
    """mosquitto_sub --retain-as-published sees RETAIN=1 on a live retained message; without it, RETAIN=0."""
    rap = mk_sub([ns.topic("t")], client_id=ns("rap"), qos=1, v5=True, extra=["--retain-as-published"])
    plain = mk_sub([ns.topic("t")], client_id=ns("plain"), qos=1, v5=True)
    mosq_pub(node.port(), ns.topic("t"), "flagged", client_id=ns("pub"), qos=1, retain=True, v5=True)
    assert rap.expect(1) == [[ns.topic("t"), "1", "1", "flagged"]]
    assert plain.expect(1) == [[ns.topic("t"), "1", "0", "flagged"]]


@interop(MOSQUITTO, "will delay")
def test_mosquitto_will_delay(mk_paho, mk_sub, ns):
    """mosquitto_sub -V 5 -D will will-delay-interval 2, SIGKILLed: the will comes 2 s later."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    s = mk_sub([ns.topic("x")], client_id=ns("dev"), v5=True,
               extra=["-x", "60", "--will-topic", ns.topic("will"), "--will-payload", "late",
                      "--will-qos", "1",
                      "-D", "will", "will-delay-interval", "2"])
    s.proc.kill()
    t0 = time.monotonic()
    assert [m.payload for m in watcher.expect(1)] == [b"late"]
    elapsed = time.monotonic() - t0
    assert 1.7 <= elapsed <= 4.0, f"will after {elapsed:.2f}s, expected 2s"


@interop(MOSQUITTO, "message expiry")
def test_mosquitto_message_expiry(mk_sub, node, ns):
    """mosquitto message-expiry-interval: a returning -c subscriber gets only the unexpired message."""
    s = mk_sub([ns.topic("t")], client_id=ns("sub"), qos=1, v5=True, extra=["-c", "-x", "300", "-E"])
    assert s.wait_exit() == 0
    mosq_pub(node.port(), ns.topic("t"), "short", client_id=ns("pub"), qos=1, v5=True,
             props=[("message-expiry-interval", 1)])
    mosq_pub(node.port(), ns.topic("t"), "long", client_id=ns("pub"), qos=1, v5=True,
             props=[("message-expiry-interval", 100)])
    # The subject is time passing on the node: "short" (1 s) must expire, and the remaining expiry of
    # "long" (100 s, sent rounded up) must read 98 or less, so two full seconds.
    time.sleep(2 + CLOCK_MARGIN_S)
    s = mk_sub([ns.topic("t")], client_id=ns("sub"), qos=1, v5=True, fmt="%E|%p", extra=["-c", "-x", "300"])
    got = s.expect(1)
    assert got[0][-1] == "long" and 90 <= int(got[0][0]) <= 98, got
    assert s.drain(0.3) == []


@interop(MOSQUITTO, "subscription identifiers")
def test_mosquitto_subscription_identifier(mk_sub, node, ns):
    """mosquitto_sub -D subscribe subscription-identifier: delivered messages carry that identifier."""
    s = mk_sub([ns.topic("t")], client_id=ns("sub"), qos=1, v5=True, fmt="%S|%p",
               extra=["-D", "subscribe", "subscription-identifier", "42"])
    mosq_pub(node.port(), ns.topic("t"), "x", client_id=ns("pub"), qos=1, v5=True)
    assert s.expect(1) == [["42", "x"]]


# ========================================================================================================
# $SYS
# ========================================================================================================

_UPTIME = re.compile(rb"^\d+ seconds$")


@paho_params("$SYS/broker/uptime")
def test_paho_sys_uptime(mk_paho, ns, v):
    """``$SYS/broker/uptime`` can be subscribed to and reads ``N seconds``."""
    c = mk_paho(v, ns())
    c.subscribe("$SYS/broker/uptime", 0)
    msg = c.expect(1, timeout=3)[0]
    assert msg.topic == "$SYS/broker/uptime" and _UPTIME.match(msg.payload), msg.payload


def _sys_cycle(mk_paho, ns):
    """Block until a fresh $SYS publication went out (the uptime value changes)."""
    w = mk_paho(5, ns("sysw"))
    w.subscribe("$SYS/broker/uptime", 0)
    first = w.expect(1, timeout=3)[0].payload
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if w.expect(1, timeout=3)[0].payload != first:
            return
    raise AssertionError("no $SYS update within 3 s (sys_interval = 1)")


@paho_params("# does not match $SYS")
def test_paho_hash_does_not_match_sys(mk_paho, ns, v):
    """``#`` gets ordinary messages but no ``$SYS`` topics published meanwhile; ``+/broker/uptime`` none."""
    c = mk_paho(v, ns())
    c.subscribe("#", 0)
    plus = mk_paho(v, ns("plus"))
    plus.subscribe("+/broker/uptime", 0)
    _sys_cycle(mk_paho, ns)
    mk_paho(v, ns("pub")).publish(ns.topic("end"), b"end", 1)
    got = c.until(b"end")
    assert [m.topic for m in got if m.topic.startswith("$")] == []
    assert plus.drain(0.2) == []


@interop(AMQTT, "$SYS/broker/uptime")
def test_amqtt_sys_uptime(node, ns):
    """amqtt can subscribe to ``$SYS/broker/uptime`` and reads ``N seconds``."""
    async def run():
        c = await amqtt_connect(node.port(), ns())
        try:
            await c.subscribe([("$SYS/broker/uptime", 0)])
            msg = (await amqtt_expect(c, 1, timeout=3))[0]
            assert msg.topic == "$SYS/broker/uptime" and _UPTIME.match(bytes(msg.data)), bytes(msg.data)
        finally:
            await amqtt_close(c)
    amqtt_run(run)


@interop(AMQTT, "# does not match $SYS")
def test_amqtt_hash_does_not_match_sys(mk_paho, node, ns):
    """An amqtt ``#`` subscriber gets ordinary messages but no ``$SYS`` topics published meanwhile."""
    async def run():
        c = await amqtt_connect(node.port(), ns())
        try:
            await c.subscribe([("#", 0)])
            await asyncio.get_running_loop().run_in_executor(None, _sys_cycle, mk_paho, ns)
            await c.publish(ns.topic("end"), b"end", qos=1)
            got = await amqtt_until(c, b"end")
            assert [m.topic for m in got if m.topic.startswith("$")] == []
        finally:
            await amqtt_close(c)
    amqtt_run(run)


@interop(MOSQUITTO, "$SYS/broker/uptime")
def test_mosquitto_sys_uptime(mk_sub, ns):
    """mosquitto_sub can read ``$SYS/broker/uptime`` (``N seconds``)."""
    s = mk_sub(["$SYS/broker/uptime"], client_id=ns())
    topic, _, _, payload = s.expect(1, timeout=3)[0]
    assert topic == "$SYS/broker/uptime" and _UPTIME.match(payload.encode()), payload


@interop(MOSQUITTO, "# does not match $SYS")
def test_mosquitto_hash_does_not_match_sys(mk_paho, mk_sub, node, ns):
    """mosquitto_sub -t '#' gets ordinary messages but none of the ``$SYS`` topics published meanwhile."""
    s = mk_sub(["#"], client_id=ns())
    _sys_cycle(mk_paho, ns)
    mosq_pub(node.port(), ns.topic("end"), "end", client_id=ns("pub"), qos=1)
    got = s.until("end")
    assert [f[0] for f in got if f[0].startswith("$")] == []
