"""The brokers under test: how to install, configure, start, probe and stop each one.

Every broker runs as its own process on 127.0.0.1, started fresh for each
scenario run, pinned to one core with ``taskset``, with RLIMIT_NOFILE raised
to the hard limit (``preexec_fn``), and its output sent to a log file (a pipe
nobody reads would eventually block it). ``Broker.settings()`` states every
setting for the report.
"""

import importlib.metadata
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench import amqtt_broker
from bench.loadgen import connect_packet
from bench.netloop import DISCONNECT_PACKET
from mqtt_proxy.codec import MQTT_3_1_1, ConnAck, MQTTParser, ProtocolError

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0

MOSQUITTO_CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
{persistence}
max_queued_messages 0
max_queued_bytes 0
max_inflight_messages 100
max_connections -1
set_tcp_nodelay false
connection_messages false
log_dest stderr
log_type error
log_type warning
"""

PERSISTENCE_ON = "persistence true\npersistence_location WORKDIR/"

MOSQUITTO_NOTES = [
    "persistence false (no disk; sessions and offline messages in memory), except in scenario 8: "
    f"{PERSISTENCE_ON} (its default autosave: the in-memory database is written at shutdown and every "
    "30 minutes)",
    "max_queued_messages 0 and max_queued_bytes 0 (unlimited): the default (1000) silently drops "
    "QoS 1 messages under burst",
    "max_inflight_messages 100: the same window the generator's publishers use (default 20)",
    "set_tcp_nodelay false (Mosquitto's default, Nagle on; amqtt's asyncio transports set TCP_NODELAY "
    "by themselves, twistmq keeps its own default): with it on, Mosquitto's fan-out here fell from "
    "about 205,000 to 100,000 deliveries/s and its QoS 1 fan-in from about 70,000 to 51,000 msg/s, "
    "while its latency p99 stayed near 0.2 ms",
    "max_connections -1 (unlimited); connection_messages false; log_type error+warning only",
]

TWISTMQ_NOTES = [
    "twistd -n --pidfile= twistmq node --mqtt tcp:PORT:interface=127.0.0.1 "
    "--http tcp:HTTP_PORT:interface=127.0.0.1 --data-dir <fresh temp dir> --config WORKDIR/twistmq.toml",
    "twistmq.toml: [log] connection_messages = false (Mosquitto's connection_messages false: no line per "
    "client connecting or leaving; refusals and failures are still logged)",
    "every other setting: the defaults of conf/twistmq.toml (every message written to the commit log)",
]


class BrokerStartError(Exception):
    """The broker could not be started or did not become ready."""


def _raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(port, timeout=2.0):
    """True if an MQTT CONNECT on ``port`` gets an accepting CONNACK."""
    parser = MQTTParser(server_side=False, protocol_level=MQTT_3_1_1)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(connect_packet(f"bench-probe-{os.getpid()}") + DISCONNECT_PACKET)
            for _ in range(8):
                chunk = s.recv(64)
                if not chunk:
                    return False
                packets = parser.feed(chunk)
                if packets:
                    return type(packets[0]) is ConnAck and packets[0].reason_code == 0
            return False
    except (OSError, ProtocolError):
        return False


class Running:
    """A started broker process: its port, pid and log."""

    def __init__(self, name, proc, port, log_path):
        self.name, self.proc, self.port, self.log_path = name, proc, port, log_path

    @property
    def pid(self):
        return self.proc.pid

    def log_tail(self, lines=3):
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def stop(self, timeout=10.0):
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


class Broker:
    """Base class: subclasses say how to build the command line and what to report."""

    name = label = ""
    ready_text = None   # a line of output that must appear before probing
    stop_timeout = 5.0  # seconds between SIGTERM and SIGKILL (only twistmq's clean stop is checked)

    def available(self):
        """``(True, "")`` or ``(False, reason)``."""
        return True, ""

    def version(self):
        raise NotImplementedError

    def settings(self):
        raise NotImplementedError

    def command(self, port, workdir, scenario=None):
        raise NotImplementedError

    def start(self, workdir, cpu=None, scenario=None):
        """Start on a fresh port; return a ``Running`` once it accepts MQTT connections.

        ``scenario`` lets a broker adjust its configuration to one scenario (Mosquitto
        persists its sessions in scenario 8).
        """
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        argv = self.command(port, workdir, scenario)
        if cpu is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", str(cpu)] + argv
        log_path = workdir / f"{self.name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, preexec_fn=_raise_nofile,
                                    start_new_session=True)
        running = Running(self.name, proc, port, log_path)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerStartError(f"{self.name} exited with {proc.returncode}: {running.log_tail(1)}")
            if self.ready_text is None or self.ready_text in log_path.read_text(errors="replace"):
                if probe(port):
                    return running
            time.sleep(0.05)
        running.stop()
        raise BrokerStartError(f"{self.name} not ready after {START_TIMEOUT:.0f} s: {running.log_tail()}")


class Mosquitto(Broker):
    """Debian's mosquitto, configured by ``MOSQUITTO_CONF``."""

    name, label = "mosquitto", "Mosquitto"

    def __init__(self):
        self.path = None

    def available(self):
        self.path, reason = ensure_mosquitto()
        return self.path is not None, reason

    def version(self):
        out = subprocess.run([self.path, "-h"], capture_output=True, text=True).stdout
        return out.strip().splitlines()[0] if out.strip() else "unknown"

    def settings(self):
        conf = [line for line in MOSQUITTO_CONF.format(port="PORT", persistence="persistence false").splitlines()
                if line]
        return ["config: " + "; ".join(conf)] + MOSQUITTO_NOTES

    def command(self, port, workdir, scenario=None):
        conf = workdir / "mosquitto.conf"
        persistence = PERSISTENCE_ON.replace("WORKDIR", str(workdir)) if scenario == 8 else "persistence false"
        conf.write_text(MOSQUITTO_CONF.format(port=port, persistence=persistence))
        return [self.path, "-c", str(conf)]


class Amqtt(Broker):
    """amqtt's ``Broker`` in its own process (``bench/amqtt_broker.py``)."""

    name, label = "amqtt", "amqtt"
    ready_text = "amqtt ready"

    def available(self):
        try:
            importlib.metadata.version("amqtt")
        except importlib.metadata.PackageNotFoundError:
            return False, "amqtt is not installed (pip install -e '.[bench]')"
        return True, ""

    def version(self):
        return "amqtt " + importlib.metadata.version("amqtt")

    def settings(self):
        return amqtt_broker.CONFIG_NOTES

    def command(self, port, workdir, scenario=None):
        return [sys.executable, "-m", "bench.amqtt_broker", "--port", str(port)]


class Twistmq(Broker):
    """A twistmq node started through its twistd plugin."""

    name, label = "twistmq", "twistmq"
    ready_text = "twistmq ready"
    stop_timeout = 15.0

    def twistd(self):
        path = Path(sys.executable).parent / "twistd"
        return str(path) if path.exists() else shutil.which("twistd")

    def available(self):
        if not self.twistd():
            return False, "twistd not found next to the interpreter"
        return True, ""

    def version(self):
        try:
            version = importlib.metadata.version("twistmq")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
        rev = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                             capture_output=True, text=True).stdout.strip()
        return f"twistmq {version} ({rev or 'no git'})"

    def settings(self):
        return TWISTMQ_NOTES

    def command(self, port, workdir, scenario=None):
        http = free_port()
        config = workdir / "twistmq.toml"
        config.write_text("[log]\nconnection_messages = false\n")
        return [self.twistd(), "-n", "--pidfile=", "twistmq", "node",
                "--mqtt", f"tcp:{port}:interface=127.0.0.1", "--http", f"tcp:{http}:interface=127.0.0.1",
                "--data-dir", str(workdir / "data"), "--config", str(config)]


BROKERS = {b.name: b for b in (Twistmq(), Mosquitto(), Amqtt())}


def ensure_mosquitto():
    """Find the mosquitto binary, installing Debian's package if missing; ``(path, reason)``."""
    def find():
        return shutil.which("mosquitto") or next(
            (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None)

    path = find()
    if path:
        return path, ""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None, "mosquitto is missing and cannot be installed here (needs root and apt-get)"
    print("bench: installing mosquitto with apt-get", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=300,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-qq", "mosquitto", "mosquitto-clients"], env=env,
                       check=True, timeout=600, stdout=subprocess.DEVNULL)
    except (subprocess.SubprocessError, OSError) as e:
        return None, f"apt-get install mosquitto failed: {e}"
    path = find()
    return (path, "") if path else (None, "mosquitto still missing after apt-get install")
