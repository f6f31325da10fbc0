"""Real third-party MQTT clients and fixtures for the interop tests (tests/integration/test_interop_*.py).

paho-mqtt (3.1.1 and 5), amqtt (3.1.1) and Debian's mosquitto_pub/mosquitto_sub
against one ``twistd twistmq node`` process per test module (the ``node``
fixture). Every test uses its own client ids and topics (see ``ns``), so tests do
not see each other's traffic. Each test carries ``@pytest.mark.interop(client=...,
feature=...)`` and its outcome fills that cell of the generated table
(docs/interop.md, the README block): see tests/integration/conftest.py and
tests/interop_table.py.
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
from tests.interop_table import PAHO_5, PAHO_311

paho = pytest.importorskip("paho.mqtt.client")
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402

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



def take(messages, n, timeout, failure):
    """The next ``n`` items of the queue ``messages``; AssertionError(failure(got)) if they do not all arrive in time."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n:
        try:
            got.append(messages.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(failure(got))
    return got


def drain(messages, quiet):
    """Items of ``messages`` until none came for ``quiet`` seconds (at most ``WAIT`` in all)."""
    got, deadline = [], time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            got.append(messages.get(timeout=quiet))
        except queue.Empty:
            break
    return got


def take_until(messages, last, timeout, failure):
    """Items of ``messages`` up to and including the first for which ``last(item)``; AssertionError(failure(got))."""
    got, deadline = [], time.monotonic() + timeout
    while True:
        try:
            item = messages.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(failure(got))
        got.append(item)
        if last(item):
            return got

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
        return take(self.messages, n, timeout, lambda got: f"expected {n} messages, got "
                                                           f"{[(m.topic, m.payload) for m in got]}")

    def until(self, payload, timeout=WAIT):
        """Every message up to and including the first whose payload is ``payload``."""
        return take_until(self.messages, lambda m: m.payload == payload, timeout,
                          lambda got: f"no {payload!r}; got {[(m.topic, m.payload) for m in got]}")

    def drain(self, quiet=QUIET):
        """Messages until none came for ``quiet`` seconds (at most ``WAIT`` in all)."""
        return drain(self.messages, quiet)

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
        return take(self.messages, n, timeout, lambda got: f"expected {n} messages, got {got}; log {self.log[-10:]}")

    def until(self, payload, timeout=WAIT):
        return take_until(self.messages, lambda fields: fields[-1] == payload, timeout,
                          lambda got: f"no {payload!r}; got {got}; log {self.log[-10:]}")

    def drain(self, quiet=QUIET):
        """Messages until none came for ``quiet`` seconds (at most ``WAIT`` in all)."""
        return drain(self.messages, quiet)

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
