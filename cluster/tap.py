"""The composition root of the ``node`` role: ``twistd -n twistmq node [options]``.

Builds the store, the light-queue and retained indexes, the session store, the
notifier, the broker and the listeners, from ``conf/twistmq.toml`` (or
``--config``) plus command-line flags. If any listener flag is given, exactly
the listeners given open; otherwise those of the config file. Every listener
is checked before anything opens (``cluster.listeners``); recovery runs
before any listener opens; then one ``twistmq ready`` line on stdout names every
bound address. The log (``cluster.node_log``) goes to stderr or ``[log] file``.
A configuration error, or a port that cannot be bound, is one line on stderr and
exit code 2.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from twisted.application import service
from twisted.internet import defer, endpoints
from twisted.internet.error import CannotListenError
from twisted.logger import ILogObserver
from twisted.python import usage

from cluster import node_log
from cluster.config import load_config, settle, with_flags
from cluster.http import http_site
from cluster.version import twistmq_version
from lightqueue import attach as attach_lightqueue
from lightqueue.retained_index import RetainedIndex
from mqtt_proxy import tls
from mqtt_proxy.auth.acl import ACLError, load_acl
from mqtt_proxy.auth.authenticator import Authenticator
from mqtt_proxy.auth.passwords import PasswordFile, PasswordFileError
from mqtt_proxy.auth.reload import Reloader, security_targets
from mqtt_proxy.broker import Broker
from mqtt_proxy.native.config import NativeConfig
from mqtt_proxy.native.service import NativeService
from mqtt_proxy.protocol import MQTTServerFactory
from mqtt_proxy.session_store import SessionStore
from mqtt_proxy.sys_topics import SysPublisher
from mqtt_proxy.websocket import websocket_factory
from push.notifier import Notifier
from push.read_cache import ReadCache
from store.config import ConfigError, from_mapping
from store.executor import ThreadPoolExecutor
from store.kv import DurableKV
from store.message_store import MessageStore, StoreLockedError
from store.timer_service import TimerService

log = logging.getLogger("twistmq.node")

LISTEN_BACKLOG = 4096
LISTENER_FLAGS = ("mqtt", "mqtt-tls", "mqtt-ws", "native", "native-udp", "http")
START_ERRORS = (ConfigError, StoreLockedError, tls.TLSConfigError, PasswordFileError, ACLError, OSError)
"""What a bad configuration raises while the node is built: one line and exit code 2, no traceback."""


def print_version() -> None:
    """``--version``: print twistmq's version and exit 0."""
    print(f"twistmq {twistmq_version()}", file=sys.__stdout__, flush=True)
    raise SystemExit(0)


class NodeOptions(usage.Options):
    """Options of ``twistmq node``."""

    optParameters = [
        ["config", "c", None, "TOML config file (default: conf/twistmq.toml of the checkout)"],
        ["data-dir", "d", None, "data directory (overrides node.data_dir)"],
        ["mqtt-tls-ca", None, None, "CA file: TLS clients must present a certificate it signed"],
        ["ws-path", None, None, "URL path of the WebSocket endpoint (default /mqtt)"],
    ]
    optFlags = [["use-identity-as-username", None, "with mutual TLS, the certificate identity is the username"]]

    def __init__(self) -> None:
        super().__init__()
        self.listeners: dict[str, list[str]] = {}

    def _listener(self, kind: str, value: str) -> None:
        self.listeners.setdefault(kind.replace("-", "_"), []).append(value)

    def opt_mqtt(self, value):
        """MQTT over TCP listener, a Twisted endpoint description (repeatable), e.g. tcp:1883:interface=127.0.0.1"""
        self._listener("mqtt", value)

    def opt_mqtt_tls(self, value):
        """MQTT over TLS listener, e.g. ssl:8883:privateKey=KEY:certKey=CERT (repeatable)"""
        self._listener("mqtt-tls", value)

    def opt_mqtt_ws(self, value):
        """MQTT over WebSocket listener: tcp:8083, or ssl:... for secure WebSocket (repeatable)"""
        self._listener("mqtt-ws", value)

    def opt_native(self, value):
        """native JSON protocol over TCP, e.g. tcp:9876:interface=127.0.0.1 (repeatable)"""
        self._listener("native", value)

    def opt_native_udp(self, value):
        """native JSON protocol over UDP, [HOST:]PORT (repeatable)"""
        self._listener("native-udp", value)

    def opt_http(self, value):
        """HTTP listener for /health and /metrics, e.g. tcp:8080:interface=127.0.0.1 (repeatable)"""
        self._listener("http", value)

    def opt_version(self):
        """print twistmq's version and exit"""
        print_version()


def node_config(options: NodeOptions):
    """The config file with the command line applied on top, checked (see ``node_config.settle``)."""
    cfg = load_config(options["config"])
    changes = {}
    if options.listeners:
        for kind in LISTENER_FLAGS:
            changes[kind.replace("-", "_")] = tuple(options.listeners.get(kind.replace("-", "_"), ()))
    if options["data-dir"]:
        changes["data_dir"] = options["data-dir"]
    if options["mqtt-tls-ca"]:
        changes["mqtt_tls_ca"] = options["mqtt-tls-ca"]
    if options["ws-path"]:
        changes["ws_path"] = options["ws-path"]
    if options["use-identity-as-username"]:
        changes["use_identity_as_username"] = True
    return settle(with_flags(cfg, changes), set(changes))


class NodeService(service.MultiService):
    """Opens the store, restores sessions, then binds every listener and says it is ready."""

    def __init__(self, reactor, cfg) -> None:
        super().__init__()
        self.reactor = reactor
        self.cfg = cfg
        data_dir = cfg.node.data_dir
        self.executor = ThreadPoolExecutor(reactor)
        self.store = MessageStore(data_dir, cfg.store, reactor, self.executor)  # locks the data dir
        self.index = attach_lightqueue(self.store)
        self.retained = RetainedIndex(os.path.join(data_dir, "retained"), cfg.limits.max_retained_messages,
                                      cfg.limits.max_retained_bytes)
        self.store.register_dispatcher(self.retained)
        self.timers = TimerService(self.store, os.path.join(data_dir, "timer"), reactor)  # a dispatcher: before open
        self.kv = DurableKV(os.path.join(data_dir, "sessions"), reactor, sync=cfg.store.kv_sync)
        self.notifier = Notifier(reactor)
        self.store.add_listener(self.notifier.notify)
        self.store.read_soon = self.notifier.watched
        mqtt = cfg.mqtt
        # scrypt runs on its own small pool so password checks never queue behind fsyncs.
        self.auth_executor = ThreadPoolExecutor(reactor, max_threads=2, name="twistmq-auth")
        auth = Authenticator(PasswordFile.load(mqtt.password_file) if mqtt.password_file else None,
                             allow_anonymous=mqtt.allow_anonymous, clock=reactor, executor=self.auth_executor,
                             use_identity_as_username=cfg.node.use_identity_as_username,
                             base_delay=mqtt.auth_fail_delay, max_delay=mqtt.auth_fail_delay_max)
        self.broker = Broker(self.store, SessionStore(self.kv), self.notifier, ReadCache(self.store), self.retained,
                             reactor, mqtt, cfg.limits, timers=self.timers, auth=auth,
                             acl=load_acl(mqtt.acl_file or None))
        self.native = NativeService(self.store, data_dir, from_mapping(NativeConfig, "native", cfg.native), reactor,
                                    self.timers)
        # Retention keeps what sessions, shared groups and native consumers still owe, and carries
        # retained messages ahead of the segments it deletes.
        self.store.retention.add_holder(self.broker.owed)
        self.store.retention.add_holder(self.native.engine.owed)
        self.store.retention.add_carrier(self.retained.records_to_carry)
        self.sys = SysPublisher(self.broker, self.store, reactor, cfg.mqtt.sys_interval, twistmq_version())
        self.ports: list = []
        self.extra_stats = [("native", self.native.stats), ("timer", self.timers.stats)]
        self.log_observer = None  # set by make_node_service: twistd's log observer (see setServiceParent)
        self.streams, self.datagrams = self._listeners()

    def setServiceParent(self, parent):  # noqa: N802 - Twisted interface
        # twistd takes its log observer from the application this service joins, if it has one:
        # ours sends Twisted's events to the node's own log handler, so every event has one format.
        if self.log_observer is not None and hasattr(parent, "setComponent"):
            parent.setComponent(ILogObserver, self.log_observer)
        return super().setServiceParent(parent)

    def _listeners(self):
        """(listener, endpoint, factory) for every stream listener; (listener, protocol) for UDP, in flag order."""
        ca = self.cfg.node.mqtt_tls_ca or None
        mqtt_factory = MQTTServerFactory(self.broker, self.reactor, cert_identity=tls.peer_identity)
        ws_factory = websocket_factory(mqtt_factory, self.cfg.node.ws_path, self.reactor,
                                       self.cfg.limits.max_packet_size)
        http = http_site(self.broker, self.store, self._extra_stats, self._losses)
        build = {
            "mqtt": lambda d: (endpoints.serverFromString(self.reactor, _backlog(d)), mqtt_factory),
            "mqtt_tls": lambda d: (tls.tls_server_endpoint(self.reactor, _backlog(d), ca), mqtt_factory),
            "mqtt_ws": lambda d: (tls.server_endpoint(self.reactor, d, ca), ws_factory),
            "http": lambda d: (endpoints.serverFromString(self.reactor, d), http),
            "native": lambda d: (endpoints.serverFromString(self.reactor, d), self.native.tcp_factory()),
        }
        streams, datagrams = [], []
        for listener in self.cfg.listeners:
            if listener.key == "native_udp":
                datagrams.append((listener, self.native.udp_protocol()))
                continue
            try:
                endpoint, factory = build[listener.key](listener.description)
            except tls.TLSConfigError as exc:
                raise ConfigError(f"{listener.where}: {exc}") from None
            streams.append((listener, endpoint, factory))
        return streams, datagrams

    def _losses(self):
        """Messages that went away undelivered, for /metrics: expiry, and what a disk limit deleted."""
        stats, native = self.broker.stats, self.native.counters
        return {
            "twistmq_expired_messages": ("stored messages whose expiry (MQTT message expiry, native ttl) passed "
                                         "before delivery", stats.messages_expired + native["expired"]),
            "twistmq_delivery_gap_messages": ("owed messages a reader found deleted by a disk limit",
                                              stats.messages_gap + native["gap"]),
            "twistmq_retained_dropped_messages": ("retained messages a disk limit deleted", self.retained.dropped),
            "twistmq_dead_lettered_messages": ("popped messages moved to a dead-letter queue",
                                               native["dead_lettered"]),
        }

    def _extra_stats(self):
        return [(prefix, fn()) for prefix, fn in self.extra_stats]

    def startService(self) -> None:
        super().startService()
        self._install_reload()
        d = defer.maybeDeferred(self._start)
        d.addErrback(self._start_failed)

    @defer.inlineCallbacks
    def _start(self):
        self.executor.start()
        self.auth_executor.start()
        self.store.open()
        self.timers.start()
        yield self.native.open()
        yield self.broker.restore()
        self.sys.start()
        bound = []
        for listener, endpoint, factory in self.streams:
            port = yield _listen(listener, lambda: endpoint.listen(factory))
            self.ports.append(port)
            bound.append(f"{_name(listener)}={_address(port)}")
        for listener, proto in self.datagrams:
            port = yield _listen(listener, lambda: self.reactor.listenUDP(listener.port, proto,
                                                                         interface=listener.interface))
            self.ports.append(port)
            bound.append(f"{_name(listener)}={_address(port)}")
        print("twistmq ready " + " ".join(bound), file=sys.__stdout__, flush=True)
        log.info("node_ready version=%s data_dir=%s log=%s", twistmq_version(), self.cfg.node.data_dir,
                 self.cfg.log.file or "stderr")

    def _start_failed(self, failure) -> None:
        expected = failure.check(*START_ERRORS)
        reason = failure.getErrorMessage() if expected else f"cannot start: {failure.getErrorMessage()}"
        print(f"twistmq: {reason}", file=sys.__stderr__, flush=True)
        if expected and self.cfg.log.file:
            log.error("start_failed %s", failure.getErrorMessage())  # the file says why the node stopped
        elif not expected:
            log.error("start_failed %s", failure.getTraceback())  # a bug: the traceback is the useful part
        try:
            self.store.close()
            self.kv.close()
            self.native.kv.close()
        finally:
            os._exit(2 if expected else 1)

    def _install_reload(self) -> None:
        """SIGHUP re-reads the password file, the ACL and the TLS certificates (mqtt_proxy/auth/reload.py)."""
        contexts = [(listener.key.replace("_", "-"), endpoint.context_factory)
                    for listener, endpoint, _ in self.streams if isinstance(endpoint, tls.TLSServerEndpoint)]
        self.reloader = Reloader(security_targets(self.broker.auth.password_file, self.broker.acl, contexts))
        self._previous_sighup = None
        if threading.current_thread() is threading.main_thread():  # signal.signal works there only
            # The handler runs between two bytecodes of the reactor's thread: hand the work to the reactor.
            self._previous_sighup = signal.signal(
                signal.SIGHUP, lambda _signum, _frame: self.reactor.callFromThread(self.reloader.reload))

    @defer.inlineCallbacks
    def stopService(self):
        if getattr(self, "_previous_sighup", None) is not None:
            signal.signal(signal.SIGHUP, self._previous_sighup)
        self.sys.stop()
        for port in self.ports:
            yield port.stopListening()
        self.broker.shutdown()
        yield super().stopService()
        yield self.native.stop()
        yield self.timers.stop()
        yield self.store.close()
        self.kv.close()
        self.executor.stop()
        self.auth_executor.stop()
        log.info("node_stopped")


def _backlog(description: str) -> str:
    """Twisted listens with a backlog of 50: a burst of device reconnects overflows it and each
    dropped SYN costs the device a one-second retry, so MQTT listeners ask for more unless told."""
    if description.split(":", 1)[0] in ("tcp", "ssl") and "backlog=" not in description:
        return description + ":backlog=" + str(LISTEN_BACKLOG)
    return description


def _address(port) -> str:
    host = port.getHost()
    if hasattr(host, "name"):  # a unix socket
        return host.name.decode() if isinstance(host.name, bytes) else str(host.name)
    return f"{getattr(host, 'host', '?')}:{getattr(host, 'port', '?')}"


def _name(listener) -> str:
    """The listener's name in the ready line: its flag without dashes (mqtt, mqtt-tls, native-udp, ...)."""
    return listener.key.replace("_", "-")


def _listen(listener, listen) -> defer.Deferred:
    """Call *listen*; a port that cannot be bound becomes a ConfigError naming the listener, without a traceback."""
    def failed(failure):
        failure.trap(CannotListenError)
        reason = failure.value.socketError
        reason = getattr(reason, "strerror", None) or str(reason)
        raise ConfigError(f"cannot listen on {listener.where}: {reason}")
    return defer.maybeDeferred(listen).addErrback(failed)


def make_node_service(options: NodeOptions, reactor=None) -> NodeService:
    """Build the node; a bad config or a locked data dir exits with one line naming the cause."""
    if reactor is None:
        from twisted.internet import reactor  # the composition root is where the global reactor is used
    try:
        cfg = node_config(options)
        observer = node_log.configure(cfg.log)
        node = NodeService(reactor, cfg)
    except START_ERRORS as exc:
        print(f"twistmq: {exc}", file=sys.__stderr__, flush=True)
        raise SystemExit(2)
    node.log_observer = observer
    return node


class Options(usage.Options):
    """``twistd twistmq <role>``."""

    subCommands = [["node", None, NodeOptions, "every role in one process (the embedded default)"]]

    def opt_version(self):
        """print twistmq's version and exit"""
        print_version()

    def postOptions(self) -> None:
        if self.subCommand is None:
            raise usage.UsageError("name a role: node")


def makeService(options: Options):
    if options.subCommand == "node":
        return make_node_service(options.subOptions)
    raise usage.UsageError(f"unknown role {options.subCommand}")
