"""Interoperability: real third-party MQTT clients against one real twistmq node.

paho-mqtt (3.1.1 and 5), amqtt (3.1.1) and Debian's mosquitto_pub/mosquitto_sub
talk to a single ``twistd twistmq node`` process started for this module. Every
test uses its own client ids and topics (see ``ns``), so tests do not see each
other's traffic. Each test carries ``@pytest.mark.interop(client=..., feature=...)``
and its outcome fills that cell of the generated table (docs/interop.md, the
README block): see tests/integration/conftest.py and tests/interop_table.py.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.integration.node import NodeProcess
from tests.interop_table import AMQTT, MOSQUITTO, PAHO_5, PAHO_311

paho = pytest.importorskip("paho.mqtt.client")
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402
from paho.mqtt.subscribeoptions import SubscribeOptions  # noqa: E402

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"
WAIT = 5.0  # longest wait for anything that should happen
QUIET = 0.5  # how long "nothing arrives" is watched, after a sentinel proved the path is live
SERVER_KEEP_ALIVE = 30
PAHO = {4: PAHO_311, 5: PAHO_5}
_seq = itertools.count()


def interop(client, feature):
    return pytest.mark.interop(client=client, feature=feature)


def paho_params(feature, versions=(4, 5)):
    """Parametrize ``v`` over paho protocol versions, each case marked for its own table cell."""
    return pytest.mark.parametrize("v", [pytest.param(v, id=f"v{'3.1.1' if v == 4 else '5'}",
                                                      marks=interop(PAHO[v], feature)) for v in versions])


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    config = tmp_path_factory.mktemp("conf") / "twistmq.toml"
    config.write_text(f"[mqtt]\nsys_interval = 1\nmax_keep_alive = {SERVER_KEEP_ALIVE}\n")
    data = str(tmp_path_factory.mktemp("interop") / "data")
    n = NodeProcess(data, extra_args=["--config", str(config)]).start()
    yield n
    n.stop()


@pytest.fixture
def ns(request):
    """A namespace private to this test: ``ns("x")`` is a unique client id, ``ns.topic("a/b")`` a topic."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:40]
    base = f"iop-{next(_seq)}-{name}"

    class NS:
        def __call__(self, what="c"):
            return f"{base}-{what}"

        def topic(self, suffix=""):
            return f"iop/{base}/{suffix}".rstrip("/")
    return NS()


@pytest.fixture
def cleanup():
    """Things to close after the test, whatever happened: clients, processes."""
    items = []
    yield items
    for item in reversed(items):
        try:
            if isinstance(item, subprocess.Popen):
                if item.poll() is None:
                    item.send_signal(signal.SIGCONT)
                    item.kill()
                item.wait(5)
            else:
                item.close()
        except Exception:
            pass


# --- paho-mqtt ------------------------------------------------------------------------------------------


class Paho:
    """A paho-mqtt client on its own network thread, with blocking helpers bounded by ``WAIT``."""

    def __init__(self, port, version, client_id, *, clean=True, session_expiry=None, keepalive=30, will=None,
                 will_props=None, connect_props=None, start=True):
        self.version = version
        self.messages: queue.Queue = queue.Queue()
        self.disconnects: queue.Queue = queue.Queue()
        self.connected = threading.Event()
        self.connack = None
        self._subacks: dict[int, list] = {}
        self._cond = threading.Condition()
        kw = dict(callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id,
                  protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311, reconnect_on_failure=False)
        if version != 5:
            kw["clean_session"] = clean
        self.c = paho.Client(**kw)
        self.c.on_connect = self._on_connect
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        self.c.on_subscribe = self._on_subscribe
        self.c.on_unsubscribe = self._on_subscribe
        self.connect_props = connect_props or {}
        if will is not None:
            topic, payload, qos, retain = will
            self.c.will_set(topic, payload, qos, retain, properties=will_props)
        self.port, self.keepalive, self.clean, self.session_expiry = port, keepalive, clean, session_expiry
        if start:
            self.start()

    def start(self):
        if self.version == 5:
            props = Properties(PacketTypes.CONNECT)
            if self.session_expiry is not None:
                props.SessionExpiryInterval = self.session_expiry
            for k, val in self.connect_props.items():
                setattr(props, k, val)
            self.c.connect(HOST, self.port, self.keepalive, clean_start=self.clean, properties=props)
        else:
            self.c.connect(HOST, self.port, self.keepalive)
        self.c.loop_start()
        assert self.connected.wait(WAIT), "no CONNACK"
        rc, flags, props = self.connack
        assert rc == 0, f"CONNACK {rc}"
        return self

    def _on_connect(self, client, userdata, flags, rc, props):
        self.connack = (rc, flags, props)
        self.connected.set()

    def _on_subscribe(self, client, userdata, mid, rcs, props):
        with self._cond:
            self._subacks[mid] = rcs
            self._cond.notify_all()

    def subscribe(self, topic, qos=1, options=None, sub_id=None):
        props = None
        if sub_id is not None:
            props = Properties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = sub_id
        if options is not None:
            rc, mid = self.c.subscribe(topic, options=options, properties=props)
        else:
            rc, mid = self.c.subscribe(topic, qos, properties=props)
        assert rc == 0
        with self._cond:
            assert self._cond.wait_for(lambda: mid in self._subacks, WAIT), "no SUBACK"
            rcs = self._subacks.pop(mid)
        assert all(int(getattr(r, "value", r)) < 0x80 for r in rcs), f"SUBACK {rcs}"
        return rcs

    def unsubscribe(self, topic):
        rc, mid = self.c.unsubscribe(topic)
        assert rc == 0
        with self._cond:
            assert self._cond.wait_for(lambda: mid in self._subacks, WAIT), "no UNSUBACK"
            self._subacks.pop(mid)

    def publish(self, topic, payload, qos=0, retain=False, props=None):
        info = self.c.publish(topic, payload, qos, retain, properties=props)
        info.wait_for_publish(WAIT)
        assert info.is_published(), "publish not acknowledged"

    def expect(self, n=1, timeout=WAIT):
        """The next ``n`` messages; fails if they do not all arrive in time."""
        got, deadline = [], time.monotonic() + timeout
        while len(got) < n:
            try:
                got.append(self.messages.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"expected {n} messages, got {[(m.topic, m.payload) for m in got]}")
        return got

    def until(self, payload, timeout=WAIT):
        """Every message up to and including the first whose payload is ``payload``."""
        got, deadline = [], time.monotonic() + timeout
        while True:
            try:
                msg = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {payload!r}; got {[(m.topic, m.payload) for m in got]}")
            got.append(msg)
            if msg.payload == payload:
                return got

    def drain(self, quiet=QUIET):
        """Messages until none came for ``quiet`` seconds (at most ``WAIT`` in all)."""
        got, deadline = [], time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                got.append(self.messages.get(timeout=quiet))
            except queue.Empty:
                break
        return got

    def freeze(self):
        """Stop the network loop but keep the socket open: no more PINGREQs."""
        self.c.loop_stop()

    def drop(self):
        """Close the socket without DISCONNECT, as a crashed device would."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self):
        try:
            if self.c.is_connected():
                self.c.disconnect()
        finally:
            self.c.loop_stop()


@pytest.fixture
def mk_paho(node, cleanup):
    def make(version, client_id, **kw):
        c = Paho(node.port(), version, client_id, start=False, **kw)
        cleanup.append(c)
        return c.start()
    return make


def props5(**kw):
    p = Properties(PacketTypes.PUBLISH)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


# --- amqtt ----------------------------------------------------------------------------------------------


def amqtt_run(coro_fn, timeout=20):
    """Run an amqtt scenario on a fresh event loop."""
    async def bounded():
        return await asyncio.wait_for(coro_fn(), timeout)
    return asyncio.run(bounded())


async def amqtt_connect(port, client_id, *, clean=True, will=None, keep_alive=30):
    from amqtt.client import MQTTClient
    config = {"auto_reconnect": False, "keep_alive": keep_alive + 1, "ping_delay": 1}
    if will is not None:
        topic, payload, qos, retain = will
        config["will"] = {"topic": topic, "message": payload, "qos": qos, "retain": retain}
    c = MQTTClient(client_id=client_id, config=config)
    await c.connect(f"mqtt://{HOST}:{port}/", cleansession=clean)
    return c


async def amqtt_expect(c, n=1, timeout=WAIT):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n:
        try:
            got.append(await c.deliver_message(timeout_duration=max(0.01, deadline - time.monotonic())))
        except asyncio.TimeoutError:
            raise AssertionError(f"expected {n} messages, got {[(m.topic, bytes(m.data)) for m in got]}")
    return got


async def amqtt_until(c, payload, timeout=WAIT):
    got, deadline = [], time.monotonic() + timeout
    while True:
        try:
            msg = await c.deliver_message(timeout_duration=max(0.01, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise AssertionError(f"no {payload!r}; got {[(m.topic, bytes(m.data)) for m in got]}")
        got.append(msg)
        if bytes(msg.data) == payload:
            return got


async def amqtt_drain(c, quiet=QUIET):
    got, deadline = [], time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            got.append(await c.deliver_message(timeout_duration=quiet))
        except asyncio.TimeoutError:
            break
    return got


async def amqtt_close(*clients):
    for c in clients:
        try:
            await asyncio.wait_for(c.disconnect(), 2)
        except Exception:
            pass


def amqtt_drop(c):
    """Close the TCP connection without DISCONNECT."""
    c._handler.writer._writer.transport.abort()


class AmqttThreadSub:
    """An amqtt subscriber on its own event loop thread, so it can watch while other clients act."""

    def __init__(self, port, client_id, topic, qos=1):
        self.messages: queue.Queue = queue.Queue()
        self.ready, self.stopping = threading.Event(), threading.Event()
        self.error = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main(port, client_id, topic, qos)),
                                       daemon=True)
        self.thread.start()
        assert self.ready.wait(WAIT) and self.error is None, f"amqtt subscriber failed: {self.error!r}"

    async def _main(self, port, client_id, topic, qos):
        try:
            c = await amqtt_connect(port, client_id)
            await c.subscribe([(topic, qos)])
        except Exception as e:
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        while not self.stopping.is_set():
            try:
                m = await c.deliver_message(timeout_duration=0.1)
            except asyncio.TimeoutError:
                continue
            except Exception as e:
                self.error = e
                break
            self.messages.put((m.topic, bytes(m.data)))
        await amqtt_close(c)

    def close(self):
        self.stopping.set()
        self.thread.join(WAIT)


# --- mosquitto_pub / mosquitto_sub ----------------------------------------------------------------------


def need_mosquitto():
    if shutil.which("mosquitto_sub") is None or shutil.which("mosquitto_pub") is None:
        pytest.skip("mosquitto-clients not installed (./dev test installs them)")


class MosqSub:
    """A mosquitto_sub process; message lines are ``MSG|<format>``, debug lines tell us about SUBACK."""

    def __init__(self, port, topics, *, client_id, qos=0, v5=False, fmt="%t|%q|%r|%p", extra=(),
                 wait_suback=True):
        need_mosquitto()
        args = ["stdbuf", "-oL", "mosquitto_sub", "-h", HOST, "-p", str(port), "-i", client_id,
                "-q", str(qos),
                "-V", "mqttv5" if v5 else "mqttv311", "-d", "-F", "MSG|" + fmt]
        for t in topics:
            args += ["-t", t]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace")
        self.lines: queue.Queue = queue.Queue()
        self.log: list[str] = []
        self.messages: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        if wait_suback:
            self.wait_line("received SUBACK")

    def _read(self):
        for line in iter(self.proc.stdout.readline, ""):
            line = line.rstrip("\n")
            self.log.append(line)
            if line.startswith("MSG|"):
                self.messages.put(line[4:].split("|"))
            else:
                self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, text, timeout=WAIT):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"mosquitto_sub never said {text!r}: {self.log[-10:]}")
            if line is None:
                raise AssertionError(f"mosquitto_sub exited before {text!r}: {self.log[-10:]}")
            if text in line:
                return line

    def expect(self, n=1, timeout=WAIT):
        got, deadline = [], time.monotonic() + timeout
        while len(got) < n:
            try:
                got.append(self.messages.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"expected {n} messages, got {got}; log {self.log[-10:]}")
        return got

    def until(self, payload, timeout=WAIT):
        got, deadline = [], time.monotonic() + timeout
        while True:
            try:
                fields = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {payload!r}; got {got}; log {self.log[-10:]}")
            got.append(fields)
            if fields[-1] == payload:
                return got

    def drain(self, quiet=QUIET):
        """Messages until none came for ``quiet`` seconds (at most ``WAIT`` in all)."""
        got, deadline = [], time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                got.append(self.messages.get(timeout=quiet))
            except queue.Empty:
                break
        return got

    def wait_exit(self, timeout=WAIT):
        return self.proc.wait(timeout)


def mosq_pub(port, topic, payload, *, client_id, qos=0, retain=False, v5=False, props=(), lines=None):
    """Run mosquitto_pub once; ``payload=None`` sends an empty message, ``lines`` one message a line."""
    need_mosquitto()
    args = ["mosquitto_pub", "-h", HOST, "-p", str(port), "-i", client_id, "-t", topic, "-q", str(qos),
            "-V", "mqttv5" if v5 else "mqttv311"]
    if lines is not None:
        args += ["-l"]
    else:
        args += ["-n"] if payload is None else ["-m", payload]
    if retain:
        args.append("-r")
    for name, *values in props:
        args += ["-D", "publish", name, *map(str, values)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=WAIT,
                       input="".join(line + "\n" for line in lines) if lines is not None else None)
    assert r.returncode == 0, f"mosquitto_pub rc={r.returncode}: {r.stderr or r.stdout}"


@pytest.fixture
def mk_sub(node, cleanup):
    def make(topics, **kw):
        s = MosqSub(node.port(), topics, **kw)
        cleanup.append(s.proc)
        return s
    return make


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


@paho_params("no will on DISCONNECT")
def test_paho_no_will_on_disconnect(mk_paho, ns, v):
    """A normal DISCONNECT discards the will: the watcher sees only the sentinel published afterwards."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    c = mk_paho(v, ns("dev"), will=(ns.topic("will"), b"gone", 1, False))
    c.close()
    time.sleep(0.2)
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


@interop(PAHO_5, "will delay")
def test_paho5_will_delay(mk_paho, ns):
    """A v5 will with Will Delay Interval 2 s is held back for 2 s after an abnormal disconnect, then sent."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    wp = Properties(PacketTypes.WILLMESSAGE)
    wp.WillDelayInterval = 2
    c = mk_paho(5, ns("dev"), will=(ns.topic("will"), b"late", 1, False), will_props=wp, session_expiry=60)
    c.drop()
    t0 = time.monotonic()
    assert [m.payload for m in watcher.expect(1)] == [b"late"]
    elapsed = time.monotonic() - t0
    assert 1.7 <= elapsed <= 4.0, f"will after {elapsed:.2f}s, expected 2s"


@interop(PAHO_5, "will delay")
def test_paho5_will_delay_cancelled_by_reconnect(mk_paho, ns):
    """A client that reconnects to its session within the Will Delay Interval cancels the delayed will."""
    watcher = mk_paho(5, ns("watch"))
    watcher.subscribe(ns.topic("will"), 1)
    wp = Properties(PacketTypes.WILLMESSAGE)
    wp.WillDelayInterval = 2
    c = mk_paho(5, ns("dev"), will=(ns.topic("will"), b"late", 1, False), will_props=wp, session_expiry=60)
    c.drop()
    t0 = time.monotonic()
    back = mk_paho(5, ns("dev"), clean=False, session_expiry=60)
    assert back.connack[1].session_present
    time.sleep(max(0.0, 2.5 - (time.monotonic() - t0)))
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

    async def run():
        c = await amqtt_connect(node.port(), ns("dev"), will=(ns.topic("will"), "gone", 1, False))
        await c.disconnect()
    amqtt_run(run)
    time.sleep(0.2)
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
    s = mk_sub([ns.topic("x")], client_id=ns("dev"),
               extra=["-E", "--will-topic", ns.topic("will"), "--will-payload", "gone", "--will-qos", "1"])
    assert s.wait_exit() == 0
    time.sleep(0.2)
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


@paho_params("shared subscriptions")
def test_paho_shared_subscription(mk_paho, ns, v):
    """Two members of ``$share/g/...`` split the messages between them, each message delivered once."""
    members = [mk_paho(v, ns(f"m{i}")) for i in range(2)]
    for m in members:
        m.subscribe(f"$share/g/{ns.topic('t')}", 1)
    pub = mk_paho(v, ns("pub"))
    for i in range(N_SHARED):
        pub.publish(ns.topic("t"), f"m{i}".encode(), 1)
    time.sleep(0.3)
    _check_split([[msg.payload.decode() for msg in m.drain(0.3)] for m in members])


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
            await asyncio.sleep(0.3)
            _check_split([[bytes(msg.data).decode() for msg in await amqtt_drain(m, 0.3)] for m in members])
        finally:
            await amqtt_close(pub, *members)
    amqtt_run(run)


@interop(MOSQUITTO, "shared subscriptions")
def test_mosquitto_shared_subscription(mk_sub, node, ns):
    """Two mosquitto_sub members of ``$share/g/...`` split the messages between them, each delivered once."""
    members = [mk_sub([f"$share/g/{ns.topic('t')}"], client_id=ns(f"m{i}"), qos=1) for i in range(2)]
    for i in range(N_SHARED):
        mosq_pub(node.port(), ns.topic("t"), f"m{i}", client_id=ns("pub"), qos=1)
    time.sleep(0.3)
    _check_split([[f[-1] for f in m.drain(0.3)] for m in members])


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
    time.sleep(2.2)
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
    time.sleep(2.2)
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
