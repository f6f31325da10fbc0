"""The composition root of the ``node`` role: ``twistd -n twistmq node [options]``.

Builds the store, the light-queue and retained indexes, the session store, the
notifier, the broker and the listeners, from ``conf/twistmq.toml`` (or
``--config``) plus command-line flags. If any listener flag is given, exactly
the listeners given open; otherwise those of the config file. Recovery runs
before any listener opens; then one ``twistmq ready`` line names every bound
address.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys

from twisted.application import service
from twisted.internet import defer, endpoints
from twisted.python import usage

from lightqueue import attach as attach_lightqueue
from lightqueue.retained_index import RetainedIndex
from mqtt_proxy import tls
from mqtt_proxy.auth.acl import ACLError, load_acl
from mqtt_proxy.auth.authenticator import Authenticator
from mqtt_proxy.auth.passwords import PasswordFile, PasswordFileError
from mqtt_proxy.broker import Broker
from mqtt_proxy.http import http_site
from mqtt_proxy.native.config import NativeConfig
from mqtt_proxy.native.service import NativeService
from mqtt_proxy.node_config import load_config
from mqtt_proxy.protocol import MQTTServerFactory
from mqtt_proxy.reactor_lag import ReactorLagProbe
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
        """MQTT over TCP listener, a Twisted endpoint description (repeatable), e.g. tcp:1883"""
        self._listener("mqtt", value)

    def opt_mqtt_tls(self, value):
        """MQTT over TLS listener, e.g. ssl:8883:privateKey=KEY:certKey=CERT (repeatable)"""
        self._listener("mqtt-tls", value)

    def opt_mqtt_ws(self, value):
        """MQTT over WebSocket listener: tcp:8083, or ssl:... for secure WebSocket (repeatable)"""
        self._listener("mqtt-ws", value)

    def opt_native(self, value):
        """native JSON protocol over TCP, e.g. tcp:9876 (repeatable)"""
        self._listener("native", value)

    def opt_native_udp(self, value):
        """native JSON protocol over UDP, [HOST:]PORT (repeatable)"""
        self._listener("native-udp", value)

    def opt_http(self, value):
        """HTTP listener for /health and /metrics, e.g. tcp:8080 (repeatable)"""
        self._listener("http", value)


def node_config(options: NodeOptions):
    """The config file with the command line applied on top."""
    cfg = load_config(options["config"])
    node = cfg.node
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
    node = dataclasses.replace(node, **changes)
    data_dir = node.data_dir if os.path.isabs(node.data_dir) or options["data-dir"] \
        else os.path.join(cfg.base_dir, node.data_dir)
    node = dataclasses.replace(node, data_dir=os.path.abspath(data_dir))
    return dataclasses.replace(cfg, node=node)


class NodeService(service.MultiService):
    """Opens the store, restores sessions, then binds every listener and says it is ready."""

    def __init__(self, reactor, cfg) -> None:
        super().__init__()
        self.reactor = reactor
        self.cfg = cfg
        data_dir = cfg.node.data_dir
        # fsyncs and RocksDB flushes run here: the commit log, both KVs' WAL syncs, the index flush and the
        # timer checkpoint can each have one in flight, so none waits for a thread behind another.
        self.executor = ThreadPoolExecutor(reactor, max_threads=6)
        self.store = MessageStore(data_dir, cfg.store, reactor, self.executor)  # locks the data dir
        self.index = attach_lightqueue(self.store)
        self.retained = RetainedIndex(os.path.join(data_dir, "retained"), cfg.limits.max_retained_messages,
                                      cfg.limits.max_retained_bytes)
        self.store.register_dispatcher(self.retained)
        self.timers = TimerService(self.store, os.path.join(data_dir, "timer"), reactor,
                                   executor=self.executor)  # a dispatcher: made before open
        self.kv = DurableKV(os.path.join(data_dir, "sessions"), reactor, sync=cfg.store.kv_sync,
                             executor=self.executor)
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
                                    self.timers, executor=self.executor)
        # Retention keeps what sessions, shared groups and native consumers still owe, and carries
        # retained messages ahead of the segments it deletes.
        self.store.retention.add_holder(self.broker.owed)
        self.store.retention.add_holder(self.native.engine.owed)
        self.store.retention.add_carrier(self.retained.records_to_carry)
        self.sys = SysPublisher(self.broker, self.store, reactor, cfg.mqtt.sys_interval)
        self.lag = ReactorLagProbe(reactor)  # twistmq_reactor_lag_seconds: nothing may hold the reactor
        self.ports: list = []
        self.extra_stats = [("native", self.native.stats), ("timer", self.timers.stats)]
        self.streams, self.datagrams = self._listeners()

    def _listeners(self):
        """(name, endpoint, factory) for every stream listener, and (name, port, interface, protocol) for UDP."""
        node = self.cfg.node
        ca = node.mqtt_tls_ca or None
        mqtt_factory = MQTTServerFactory(self.broker, self.reactor, cert_identity=tls.peer_identity)
        streams = [("mqtt", endpoints.serverFromString(self.reactor, _backlog(d)), mqtt_factory) for d in node.mqtt]
        streams += [("mqtt-tls", tls.tls_server_endpoint(self.reactor, _backlog(d), ca), mqtt_factory)
                    for d in node.mqtt_tls]
        ws_factory = websocket_factory(mqtt_factory, node.ws_path, self.reactor, self.cfg.limits.max_packet_size)
        streams += [("mqtt-ws", tls.server_endpoint(self.reactor, d, ca), ws_factory) for d in node.mqtt_ws]
        streams += [("http", endpoints.serverFromString(self.reactor, d), http_site(self.broker, self.store,
                                                                                    self._extra_stats, self._losses,
                                                                                    self.lag))
                    for d in node.http]
        streams += [("native", endpoints.serverFromString(self.reactor, d), self.native.tcp_factory())
                    for d in node.native]
        datagrams = []
        for spec in node.native_udp:
            host, _, port = spec.rpartition(":")
            try:
                number = int(port)
            except ValueError:
                raise ConfigError(f"--native-udp wants [HOST:]PORT, not {spec!r}") from None
            datagrams.append(("native-udp", number, host or "", self.native.udp_protocol()))
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
        for name, endpoint, factory in self.streams:
            port = yield endpoint.listen(factory)
            self.ports.append(port)
            bound.append(f"{name}={_address(port)}")
        for name, port_number, interface, proto in self.datagrams:
            port = self.reactor.listenUDP(port_number, proto, interface=interface)
            self.ports.append(port)
            bound.append(f"{name}={_address(port)}")
        # Everything alive now (modules, recovered state) stays alive: out of the collector's full passes,
        # which stop the reactor for as long as they walk the heap (measured: about half the pause).
        gc.freeze()
        self.lag.start()  # after recovery, which blocks by design
        print("twistmq ready " + " ".join(bound), file=sys.__stdout__, flush=True)
        log.info("node_ready data_dir=%s", self.cfg.node.data_dir)

    def _start_failed(self, failure) -> None:
        print(f"twistmq: cannot start: {failure.getErrorMessage()}", file=sys.__stderr__, flush=True)
        log.error("start_failed %s", failure.getTraceback())
        try:
            self.store.close()
            self.kv.close()
            self.native.kv.close()
        finally:
            os._exit(1)

    @defer.inlineCallbacks
    def stopService(self):
        self.lag.stop()
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
    return f"{getattr(host, 'host', '?')}:{getattr(host, 'port', '?')}"


def make_node_service(options: NodeOptions, reactor=None) -> NodeService:
    """Build the node; a bad config or a locked data dir exits with one line naming the cause."""
    if reactor is None:
        from twisted.internet import reactor  # the composition root is where the global reactor is used
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s",
                        stream=sys.__stderr__)
    try:
        cfg = node_config(options)
        return NodeService(reactor, cfg)
    except (ConfigError, StoreLockedError, tls.TLSConfigError, PasswordFileError, ACLError, OSError) as exc:
        print(f"twistmq: {exc}", file=sys.__stderr__, flush=True)
        raise SystemExit(2)


class Options(usage.Options):
    """``twistd twistmq <role>``."""

    subCommands = [["node", None, NodeOptions, "every role in one process (the embedded default)"]]

    def postOptions(self) -> None:
        if self.subCommand is None:
            raise usage.UsageError("name a role: node")


def makeService(options: Options):
    if options.subCommand == "node":
        return make_node_service(options.subOptions)
    raise usage.UsageError(f"unknown role {options.subCommand}")
