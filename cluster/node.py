"""The ``node`` role (the embedded default): every part in one process, as one service tree.

Builds the store, the light-queue and retained indexes, the timers, the session
store, the notifier, the native engine, the MQTT front end, $SYS and the listeners, from
the config file ``cluster.config.find_config`` names (or the built-in defaults) plus command-line flags. If any listener
flag is given, exactly the listeners given open; otherwise those of the config
file. Every listener is checked before anything opens (``cluster.listeners``).
The tree (``node_tree``) starts the parts in order, recovery before any listener
binds, then prints one ``twistmq ready`` line naming every bound address; it
stops in reverse. The log (``cluster.node_log``) goes to stderr or ``[log] file``.
A configuration error, or a port that cannot be bound, is one line on stderr and
exit code 2.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from itertools import chain

from twisted.internet import endpoints
from twisted.python import usage

from cluster import node_log
from cluster.admin.api import AdminAPI
from cluster.admin.handlers import Handlers
from cluster.admin.metrics import NodeFigures, RateHistory
from cluster.admin.overview import overview
from cluster.admin.routes import routes
from cluster.admin.view import NodeView
from cluster.config import CONFIG_HELP, find_config, load_config, settle, with_data_dir, with_flags
from cluster.http import http_site
from cluster.reuseport import server_endpoint
from cluster.store_parts import StoreParts
from cluster.services import (DatagramListenerService, ListenerService, Part, ReadyLine, RoleService,
                              SignalService)
from cluster.version import print_version, twistmq_version
from mqtt_proxy import tls
from mqtt_proxy.auth.acl import ACLError, load_acl
from mqtt_proxy.auth.authenticator import Authenticator
from mqtt_proxy.auth.passwords import PasswordFile, PasswordFileError
from mqtt_proxy.auth.reload import Reloader, security_targets
from mqtt_proxy.front_end import build_front_end
from mqtt_proxy.protocol import MQTTServerFactory
from mqtt_proxy.reactor_lag import ReactorLagProbe
from mqtt_proxy.sys_topics import SysPublisher
from mqtt_proxy.websocket import websocket_factory
from store.config import ConfigError
from store.executor import ThreadPoolExecutor
from store.message_store import StoreLockedError

log = logging.getLogger("twistmq.node")

DASHBOARD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "admin", "dashboard")
LISTEN_BACKLOG = 4096
LISTENER_FLAGS = ("mqtt", "mqtt-tls", "mqtt-ws", "native", "native-udp", "http")
NODE_HOLDER = "node"
"""Who holds the sessions of a node's clients (``Sessions.claim_session``): the one front end there is."""
START_ERRORS = (ConfigError, StoreLockedError, tls.TLSConfigError, PasswordFileError, ACLError, OSError)
"""What a bad configuration raises while the node is built or started: one line, exit code 2."""


class NodeOptions(usage.Options):
    """Options of ``twistmq node``."""

    optParameters = [
        ["config", "c", None, CONFIG_HELP],
        ["data-dir", "d", None, "data directory (overrides node.data_dir; default /var/lib/twistmq/ROLE)"],
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


def node_config(options: NodeOptions, role: str = "node"):
    """The config file with the command line applied on top, checked (see ``cluster.config.settle``).

    A node keeps its data in ``/var/lib/twistmq/node`` unless told otherwise; a proxy (*role*) keeps none.
    """
    cfg = load_config(find_config(options["config"]))
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
    cfg = settle(with_flags(cfg, changes), set(changes))
    # Last: a configuration refused above makes no directory.
    return with_data_dir(cfg, role) if role == "node" else cfg


class NodeParts:
    """Every part of a node, built and wired but not opened (the data dir is locked): the tree opens them."""

    def __init__(self, reactor, cfg) -> None:
        self.reactor = reactor
        self.cfg = cfg
        # The store half (shared with the broker role); its parts keep their names here.
        self.state = StoreParts(reactor, cfg)
        self.executor, self.store, self.index = self.state.executor, self.state.store, self.state.index
        self.retained, self.timers, self.kv = self.state.retained, self.state.timers, self.state.kv
        self.notifier, self.native = self.state.notifier, self.state.native
        mqtt = cfg.mqtt
        # scrypt runs on its own small pool so password checks never queue behind fsyncs.
        self.auth_executor = ThreadPoolExecutor(reactor, max_threads=2, name="twistmq-auth")
        auth = Authenticator(PasswordFile.load(mqtt.password_file) if mqtt.password_file else None,
                             allow_anonymous=mqtt.allow_anonymous, clock=reactor, executor=self.auth_executor,
                             use_identity_as_username=cfg.node.use_identity_as_username,
                             base_delay=mqtt.auth_fail_delay, max_delay=mqtt.auth_fail_delay_max)
        acl = load_acl(mqtt.acl_file or None)
        # The MQTT front end reaches the parts above only through the store interface, served in-process
        # here by one broker group (a proxy runs the same front end over the remote store).
        self.local_store = self.state.local_store(cfg.cluster.group)
        self.mqtt = build_front_end(self.local_store, reactor, mqtt, cfg.limits, auth, acl, holder=NODE_HOLDER)
        delivery = self.mqtt.registry.ctx.delivery
        # Retention keeps what sessions and shared groups still owe (native consumers and retained messages:
        # StoreParts).
        self.store.retention.add_holder(self.mqtt.owed)
        self.lag = ReactorLagProbe(reactor)  # twistmq_reactor_lag_seconds: nothing may hold the reactor
        # The admin API, its figures (latency histograms fed by the store and the delivery pump) and history.
        self.view = NodeView(self.mqtt, self.store, cfg.admin.member_id or f"node@{socket.gethostname()}",
                             retained=self.retained)
        self.figures = NodeFigures(reactor, self.lag, listeners=lambda: self.streams,
                                   connections=lambda: chain(self.mqtt.connections, self.native.connections),
                                   queue_lag=self.view.lag_total)
        self.store.append_latency = self.figures.append
        delivery.deliver_latency = self.figures.deliver
        stats = self.mqtt.stats
        self.history = RateHistory(reactor, lambda: (stats.messages_received, stats.messages_sent),
                                   self.view.topic_offsets)
        self.sys = SysPublisher(self.mqtt, self.local_store, reactor, cfg.mqtt.sys_interval, twistmq_version(),
                                self._broker_figures, extra=self.figures.sys_values)
        handlers = Handlers(self.view, reactor, self._overview, self.timers, self.native.engine, self.history)
        self.admin_api = AdminAPI(routes(), handlers, cfg.admin.token)
        self.extra_stats = [("native", self.native.stats), ("timer", self.timers.stats)]
        self.streams, self.datagrams = self._listeners()

    def _listeners(self):
        """A ListenerService per stream listener, a DatagramListenerService per UDP one, in flag order."""
        http = http_site(self.mqtt, self.store, self._extra_stats, self._losses, self.lag, self.figures,
                         self.admin_api, DASHBOARD_DIR if self.cfg.admin.dashboard else None)
        return client_listeners(self.reactor, self.cfg, self.mqtt, self.native, http)

    def reloader(self) -> Reloader:
        """SIGHUP re-reads the password file, the ACL and the TLS certificates (mqtt_proxy/auth/reload.py)."""
        return security_reloader(self.mqtt, self.streams)

    def _broker_figures(self) -> dict[str, str]:
        """$SYS figures only the broker side knows (the front end sees the store interface only)."""
        return {"retained messages/count": str(self.retained.count), "store/bytes": str(self.store.size_bytes())}

    def _losses(self):
        """Messages that went away undelivered, for /metrics: expiry, and what a disk limit deleted."""
        stats, native = self.mqtt.stats, self.native.counters
        return {
            "twistmq_expired_messages": ("stored messages whose expiry (MQTT message expiry, native ttl) passed "
                                         "before delivery", stats.messages_expired + native["expired"]),
            "twistmq_delivery_gap_messages": ("owed messages a reader found deleted by a disk limit",
                                              stats.messages_gap + native["gap"]),
            "twistmq_retained_dropped_messages": ("retained messages a disk limit deleted", self.retained.dropped),
            "twistmq_dead_lettered_messages": ("popped messages moved to a dead-letter queue",
                                               native["dead_lettered"]),
        }

    def _overview(self) -> dict:
        return overview(self.mqtt, self.store, self.view, self.figures, self.history, twistmq_version())

    def _extra_stats(self):
        return [(prefix, fn()) for prefix, fn in self.extra_stats]


def node_tree(parts: NodeParts) -> RoleService:
    """The node's service tree in start order; stop runs it backwards (listeners first, the store last)."""
    cfg = parts.cfg
    node = RoleService("node", parts.reactor, START_ERRORS, cfg.log.file)
    listeners = parts.streams + parts.datagrams

    def announce():
        log.info("node_ready version=%s config=%s data_dir=%s log=%s", twistmq_version(), cfg.source,
                 cfg.node.data_dir, cfg.log.file or "stderr")

    children = [
        SignalService("reload", signal.SIGHUP, parts.reloader().reload, parts.reactor),
        Part("auth-executor", start=parts.auth_executor.start, stop=parts.auth_executor.stop),
        *parts.state.tree_parts(),
        Part("mqtt-sessions", start=parts.mqtt.restore, stop=parts.mqtt.shutdown),
        Part("sys", start=parts.sys.start, stop=parts.sys.stop),
        Part("admin-history", start=parts.history.start, stop=parts.history.stop),
        *listeners,
        # The collector takes over once everything alive now is built (cluster/heap.py). The lag probe starts
        # after recovery, which blocks by design.
        Part("collector", start=parts.state.collector.start, stop=parts.state.collector.stop),
        Part("lag-probe", start=parts.lag.start, stop=parts.lag.stop),
        ReadyLine(listeners, announce),
    ]
    for child in children:
        child.setServiceParent(node)
    return node


def build_node(options: NodeOptions, reactor) -> RoleService:
    """Build the node from its options; a bad config or a locked data dir raises one of START_ERRORS."""
    cfg = node_config(options)
    observer = node_log.configure(cfg.log)
    node = node_tree(NodeParts(reactor, cfg))
    node.log_observer = observer
    return node


def client_listeners(reactor, cfg, front, native, http):
    """The listeners of a role that serves clients (``node``, ``proxy``): ``(streams, datagrams)`` in flag
    order, MQTT (TCP, TLS, WebSocket) on ``front``, native TCP and UDP on ``native``, HTTP on ``http``."""
    ca = cfg.node.mqtt_tls_ca or None
    mqtt_factory = MQTTServerFactory(front, reactor, cert_identity=tls.peer_identity)
    ws_factory = websocket_factory(mqtt_factory, cfg.node.ws_path, reactor, cfg.limits.max_packet_size)
    build = {
        "mqtt": lambda d: (server_endpoint(reactor, _backlog(d)), mqtt_factory),
        "mqtt_tls": lambda d: (tls.tls_server_endpoint(reactor, _backlog(d), ca), mqtt_factory),
        "mqtt_ws": lambda d: (tls.server_endpoint(reactor, d, ca), ws_factory),
        "http": lambda d: (endpoints.serverFromString(reactor, d), http),
        "native": lambda d: (server_endpoint(reactor, d), native.tcp_factory()),
    }
    streams, datagrams = [], []
    for listener in cfg.listeners:
        if listener.key == "native_udp":
            datagrams.append(DatagramListenerService(listener, native.udp_protocol(), reactor))
            continue
        try:
            endpoint, factory = build[listener.key](listener.description)
        except tls.TLSConfigError as exc:
            raise ConfigError(f"{listener.where}: {exc}") from None
        streams.append(ListenerService(listener, endpoint, factory))
    return streams, datagrams


def security_reloader(front, streams) -> Reloader:
    """SIGHUP's work: re-read the password file, the ACL and the TLS listeners' certificates."""
    contexts = [(svc.listener.key.replace("_", "-"), svc.endpoint.context_factory)
                for svc in streams if isinstance(svc.endpoint, tls.TLSServerEndpoint)]
    return Reloader(security_targets(front.auth.password_file, front.acl, contexts))


def _backlog(description: str) -> str:
    """Twisted listens with a backlog of 50: a burst of device reconnects overflows it and each
    dropped SYN costs the device a one-second retry, so MQTT listeners ask for more unless told."""
    if description.split(":", 1)[0] in ("tcp", "ssl") and "backlog=" not in description:
        return description + ":backlog=" + str(LISTEN_BACKLOG)
    return description
