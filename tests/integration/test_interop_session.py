"""Interoperability with real third-party clients: will messages, session takeover, shared subscriptions.

One real node per module; clients, fixtures and the table marker live in interop_clients.py.
"""

from __future__ import annotations

import asyncio
import queue
import signal
import time

import pytest

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from tests.interop_table import AMQTT, MOSQUITTO, PAHO_5
from tests.integration.interop_clients import (
    amqtt_close, amqtt_connect, amqtt_drain, amqtt_drop, amqtt_expect, amqtt_run, drain, interop, mosq_pub,
    paho_params, QUIET, WAIT)
from tests.integration.interop_clients import (  # noqa: F401 (fixtures, used by name)
    cleanup, mk_paho, mk_sub, node, ns)
from tests.integration.waiting import open_connections, wait_until

pytestmark = pytest.mark.slow

# ========================================================================================================
# will messages
# ========================================================================================================


@paho_params("will on abnormal disconnect")
def test_paho_will_on_abnormal_disconnect(mk_paho, ns, v):
    """When a client's socket closes without DISCONNECT, the broker publishes its will."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    c = mk_paho(v, ns("dev"), will=(ns.topic("will"), b"gone", 1, False))
    c.drop()
    assert [(m.topic, m.payload) for m in watcher.expect(1)] == [(ns.topic("will"), b"gone")]


def _wait_closed(node, before: int) -> None:
    """Wait until the node has closed the client that disconnected (so it has handled its DISCONNECT):
    its open connections are back to *before*, the count before that client came."""
    wait_until(lambda: open_connections(node) <= before, WAIT,
               what="the node to close the disconnected client")


@paho_params("no will on DISCONNECT")
def test_paho_no_will_on_disconnect(mk_paho, node, ns, v):
    """A normal DISCONNECT discards the will: the watcher sees only the sentinel published afterwards."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    before = open_connections(node)
    c = mk_paho(v, ns("dev"), will=(ns.topic("will"), b"gone", 1, False))
    c.close()
    _wait_closed(node, before)
    mk_paho(5, ns("pub")).publish(ns.topic("will"), b"sentinel", 1)
    assert [m.payload for m in watcher.until(b"sentinel")] == [b"sentinel"]
    assert watcher.drain(QUIET) == []


@paho_params("will on keep-alive expiry (1.5x)")
def test_paho_will_on_keepalive_expiry(mk_paho, ns, v):
    """A client with keep alive 1 s that goes silent (socket open) has its will sent after about 1.5 s."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    c = mk_paho(v, ns("dev"), keepalive=1, will=(ns.topic("will"), b"silent", 1, False))
    c.freeze()
    t0 = time.monotonic()
    assert [m.payload for m in watcher.expect(1)] == [b"silent"]
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed <= 3.5, f"will after {elapsed:.2f}s, expected about 1.5s"


WILL_DELAY_S = 2
DROP_SEEN_MARGIN_S = 0.5


def _dropped_with_delayed_will(mk_paho, ns):
    """A watcher of the will topic, and when a v5 client with a 2 s Will Delay Interval dropped its link."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    wp = Properties(PacketTypes.WILLMESSAGE)
    wp.WillDelayInterval = WILL_DELAY_S
    c = mk_paho(5, ns("dev"), will=(ns.topic("will"), b"late", 1, False), will_props=wp, session_expiry=60)
    c.drop()
    t0 = time.monotonic()
    return watcher, t0


@interop(PAHO_5, "will delay")
def test_paho5_will_delay(mk_paho, ns):
    """A v5 will with Will Delay Interval 2 s is held back for 2 s after an abnormal disconnect, then sent."""
    watcher, t0 = _dropped_with_delayed_will(mk_paho, ns)
    assert [m.payload for m in watcher.expect(1)] == [b"late"]
    elapsed = time.monotonic() - t0
    assert 1.7 <= elapsed <= 4.0, f"will after {elapsed:.2f}s, expected 2s"


@interop(PAHO_5, "will delay")
def test_paho5_will_delay_cancelled_by_reconnect(mk_paho, ns):
    """A client that reconnects to its session within the Will Delay Interval cancels the delayed will."""
    watcher, t0 = _dropped_with_delayed_will(mk_paho, ns)
    back = mk_paho(5, ns("dev"), clean=False, session_expiry=60)
    assert back.connack[1].session_present
    # The will delay is the subject: wait until the will would have gone out, had the reconnect not
    # cancelled it. The node counts the delay from when it saw the drop, a moment after t0 (the margin).
    time.sleep(max(0.0, WILL_DELAY_S + DROP_SEEN_MARGIN_S - (time.monotonic() - t0)))
    mk_paho(5, ns("pub")).publish(ns.topic("will"), b"sentinel", 1)
    assert [m.payload for m in watcher.until(b"sentinel")] == [b"sentinel"]


@interop(PAHO_5, "will delay")
def test_paho5_will_at_session_end_before_delay(mk_paho, ns):
    """With a Will Delay (10 s) longer than the Session Expiry (1 s), the will goes at session end."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    wp = Properties(PacketTypes.WILLMESSAGE)
    wp.WillDelayInterval = 10
    c = mk_paho(5, ns("dev"), will=(ns.topic("will"), b"ended", 1, False), will_props=wp, session_expiry=1)
    c.drop()
    t0 = time.monotonic()
    assert [m.payload for m in watcher.expect(1)] == [b"ended"]
    elapsed = time.monotonic() - t0
    assert 0.6 <= elapsed <= 3.0, f"will after {elapsed:.2f}s, expected 1s (session end)"


@interop(AMQTT, "will on abnormal disconnect")
def test_amqtt_will_on_abnormal_disconnect(mk_paho, node, ns):
    """When an amqtt client's connection drops without DISCONNECT, the broker publishes its will."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)

    async def run():
        c = await amqtt_connect(node.port(), ns("dev"), will=(ns.topic("will"), "gone", 1, False))
        amqtt_drop(c)
        await asyncio.sleep(0.1)
    amqtt_run(run)
    assert [m.payload for m in watcher.expect(1)] == [b"gone"]


@interop(AMQTT, "no will on DISCONNECT")
def test_amqtt_no_will_on_disconnect(mk_paho, node, ns):
    """An amqtt client's normal DISCONNECT discards its will."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)

    before = open_connections(node)

    async def run():
        c = await amqtt_connect(node.port(), ns("dev"), will=(ns.topic("will"), "gone", 1, False))
        await c.disconnect()
    amqtt_run(run)
    _wait_closed(node, before)
    mk_paho(5, ns("pub")).publish(ns.topic("will"), b"sentinel", 1)
    assert [m.payload for m in watcher.until(b"sentinel")] == [b"sentinel"]
    assert watcher.drain(QUIET) == []


@interop(AMQTT, "will on keep-alive expiry (1.5x)")
def test_amqtt_will_on_keepalive_expiry(mk_paho, node, ns):
    """An amqtt client with keep alive 1 s whose loop stalls (socket open) has its will sent after ~1.5 s."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    stalled = {}

    async def run():
        c = await amqtt_connect(node.port(), ns("dev"), keep_alive=1,
                                will=(ns.topic("will"), "silent", 1, False))
        stalled["t0"] = time.monotonic()
        # Block the loop: no PINGREQ, no reads; the socket stays open.
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and watcher.messages.empty():
            time.sleep(0.05)
        stalled["t1"] = time.monotonic()
        amqtt_drop(c)
    amqtt_run(run)
    assert [m.payload for m in watcher.expect(1, timeout=0.5)] == [b"silent"]
    elapsed = stalled["t1"] - stalled["t0"]
    assert 1.0 <= elapsed <= 3.5, f"will after {elapsed:.2f}s, expected about 1.5s"


@interop(MOSQUITTO, "will on abnormal disconnect")
def test_mosquitto_will_on_abnormal_disconnect(mk_paho, mk_sub, ns):
    """A SIGKILLed mosquitto_sub (socket closed, no DISCONNECT) has its will published."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    s = mk_sub([ns.topic("x")], client_id=ns("dev"),
               extra=["--will-topic", ns.topic("will"), "--will-payload", "gone", "--will-qos", "1"])
    s.proc.kill()
    assert [m.payload for m in watcher.expect(1)] == [b"gone"]


@interop(MOSQUITTO, "no will on DISCONNECT")
def test_mosquitto_no_will_on_disconnect(mk_paho, mk_sub, node, ns):
    """mosquitto_sub -E ends with DISCONNECT, so its will is discarded."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    before = open_connections(node)
    s = mk_sub([ns.topic("x")], client_id=ns("dev"),
               extra=["-E", "--will-topic", ns.topic("will"), "--will-payload", "gone", "--will-qos", "1"])
    assert s.wait_exit() == 0
    _wait_closed(node, before)
    mosq_pub(node.port(), ns.topic("will"), "sentinel", client_id=ns("pub"), qos=1)
    assert [m.payload for m in watcher.until(b"sentinel")] == [b"sentinel"]
    assert watcher.drain(QUIET) == []


@interop(MOSQUITTO, "will on keep-alive expiry (1.5x)")
def test_mosquitto_will_on_keepalive_expiry(mk_paho, mk_sub, ns):
    """A SIGSTOPped mosquitto_sub with keep alive 5 s (its minimum) has its will sent after about 7.5 s."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    s = mk_sub([ns.topic("x")], client_id=ns("dev"),
               extra=["-k", "5", "--will-topic", ns.topic("will"), "--will-payload", "silent",
                      "--will-qos", "1"])
    s.proc.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    assert [m.payload for m in watcher.expect(1, timeout=10)] == [b"silent"]
    elapsed = time.monotonic() - t0
    assert 6.0 <= elapsed <= 9.5, f"will after {elapsed:.2f}s, expected about 7.5s"


# ========================================================================================================
# takeover
# ========================================================================================================


@paho_params("session takeover")
def test_paho_takeover(mk_paho, ns, v):
    """A second connection with the same client id closes the first (v5: DISCONNECT 0x8E)."""
    first = mk_paho(v, ns("dev"))
    second = mk_paho(v, ns("dev"))
    rc = first.disconnects.get(timeout=WAIT)
    if v == 5:
        assert rc == 0x8E, f"first connection got {rc}"
    else:
        assert rc != 0
    second.subscribe(ns.topic("t"), 1)
    second.publish(ns.topic("t"), b"still here", 1)
    assert [m.payload for m in second.expect(1)] == [b"still here"]
    assert second.c.is_connected()


@interop(AMQTT, "session takeover")
def test_amqtt_takeover(node, ns):
    """A second amqtt connection with the same client id closes the first; the second keeps working."""
    async def run():
        first = await amqtt_connect(node.port(), ns("dev"))
        second = await amqtt_connect(node.port(), ns("dev"))
        try:
            deadline = time.monotonic() + WAIT
            while first.session.transitions.is_connected() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert not first.session.transitions.is_connected(), "first connection still open"
            await second.subscribe([(ns.topic("t"), 1)])
            await second.publish(ns.topic("t"), b"still here", qos=1)
            assert [bytes(m.data) for m in await amqtt_expect(second, 1)] == [b"still here"]
        finally:
            await amqtt_close(second)
    amqtt_run(run)


@interop(MOSQUITTO, "session takeover")
def test_mosquitto_takeover(mk_sub, node, ns):
    """A second mosquitto_sub -V 5 with the same id makes the broker send the first DISCONNECT 0x8E (142)."""
    first = mk_sub([ns.topic("t")], client_id=ns("dev"), v5=True)
    second = mk_sub([ns.topic("t")], client_id=ns("dev"), v5=True)
    first.wait_line("DISCONNECT (142)")
    first.wait_exit()
    mosq_pub(node.port(), ns.topic("t"), "still here", client_id=ns("pub"))
    assert second.expect(1)[0][-1] == "still here"


# ========================================================================================================
# shared subscriptions
# ========================================================================================================

N_SHARED = 12


def _check_split(per_member, n=N_SHARED):
    everything = [p for member in per_member for p in member]
    assert sorted(everything) == sorted(f"m{i}" for i in range(n)), f"not each once: {per_member}"
    assert all(member for member in per_member), f"a member got nothing: {per_member}"


def _shared_split(queues, n=N_SHARED, quiet=0.3):
    """What each member's message queue got: wait until *n* arrived among them, then watch *quiet* seconds
    for any more (a message delivered twice)."""
    got = [[] for _ in queues]

    def arrived() -> bool:
        for mine, q in zip(got, queues):
            while True:
                try:
                    mine.append(q.get_nowait())
                except queue.Empty:
                    break
        return sum(map(len, got)) >= n

    wait_until(arrived, WAIT, what=f"{n} messages among the members")
    for mine, q in zip(got, queues):
        mine += drain(q, quiet)
    return got


@paho_params("shared subscriptions")
def test_paho_shared_subscription(mk_paho, ns, v):
    """Two members of ``$share/g/...`` split the messages between them, each message delivered once."""
    members = [mk_paho(v, ns(f"m{i}")) for i in range(2)]
    for m in members:
        m.subscribe(f"$share/g/{ns.topic('t')}", 1)
    pub = mk_paho(v, ns("pub"))
    for i in range(N_SHARED):
        pub.publish(ns.topic("t"), f"m{i}".encode(), 1)
    split = _shared_split([m.messages for m in members])
    _check_split([[msg.payload.decode() for msg in got] for got in split])


@interop(AMQTT, "shared subscriptions")
def test_amqtt_shared_subscription(node, ns):
    """Two amqtt members of ``$share/g/...`` split the messages between them, each message delivered once."""
    async def run():
        members = [await amqtt_connect(node.port(), ns(f"m{i}")) for i in range(2)]
        pub = await amqtt_connect(node.port(), ns("pub"))
        try:
            for m in members:
                await m.subscribe([(f"$share/g/{ns.topic('t')}", 1)])
            for i in range(N_SHARED):
                await pub.publish(ns.topic("t"), f"m{i}".encode(), qos=1)
            got = [[] for _ in members]
            deadline = time.monotonic() + WAIT
            while sum(map(len, got)) < N_SHARED and time.monotonic() < deadline:  # all of them, among members
                for mine, m in zip(got, members):
                    try:
                        mine.append(await m.deliver_message(timeout_duration=0.05))
                    except asyncio.TimeoutError:
                        pass
            for mine, m in zip(got, members):
                mine += await amqtt_drain(m, 0.3)  # and no message twice
            _check_split([[bytes(msg.data).decode() for msg in mine] for mine in got])
        finally:
            await amqtt_close(pub, *members)
    amqtt_run(run)


@interop(MOSQUITTO, "shared subscriptions")
def test_mosquitto_shared_subscription(mk_sub, node, ns):
    """Two mosquitto_sub members of ``$share/g/...`` split the messages between them, each delivered once."""
    members = [mk_sub([f"$share/g/{ns.topic('t')}"], client_id=ns(f"m{i}"), qos=1) for i in range(2)]
    for i in range(N_SHARED):
        mosq_pub(node.port(), ns.topic("t"), f"m{i}", client_id=ns("pub"), qos=1)
    _check_split([[f[-1] for f in got] for got in _shared_split([m.messages for m in members])])
