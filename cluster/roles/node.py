"""The ``node`` role (the embedded default): every part in one process, as one service tree.

Builds the store, the light-queue and retained indexes, the timers, the session
store, the notifier, the native engine, the MQTT front end, $SYS and the listeners, from
the config file ``cluster.config.find_config`` names (or the built-in defaults) plus command-line flags. If any listener
flag is given, exactly the listeners given open; otherwise those of the config
file. Every listener is checked before anything opens (``cluster.runtime.listeners``).
The tree (``node_tree``) starts the parts in order, recovery before any listener
binds, then prints one ``twistmq ready`` line naming every bound address; it
stops in reverse. The log (``cluster.runtime.node_log``) goes to stderr or ``[log] file``.
A configuration error, or a port that cannot be bound, is one line on stderr and
exit code 2.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from itertools import chain

from cluster.admin.api import AdminAPI
from cluster.admin.handlers import Handlers
from cluster.admin.metrics import NodeFigures, RateHistory
from cluster.admin.overview import overview
from cluster.admin.routes import routes, served_by
from cluster.admin.view import NodeView
from cluster.bridges.metrics import BridgeCollector
from cluster.local.parts import StoreParts
from cluster.roles.common import (
    NodeOptions,
    bridge_parts,
    client_listeners,
    client_security,
    health_probe,
    mongodb_pool,
    node_config,
    security_reloader,
    store_bridges,
)
from cluster.runtime import node_log
from cluster.runtime.histogram import Histogram
from cluster.runtime.http import http_site
from cluster.runtime.services import Part, ReadyLine, RoleService, SignalService
from cluster.runtime.version import twistmq_version
from mqtt_proxy import tls
from mqtt_proxy.auth.acl import ACLError
from mqtt_proxy.auth.passwords import PasswordFileError
from mqtt_proxy.auth.reload import Reloader
from mqtt_proxy.front_end import build_front_end
from mqtt_proxy.reactor_lag import ReactorLagProbe
from mqtt_proxy.sys_topics import SysPublisher
from store.config import ConfigError
from store.message_store import StoreLockedError

log = logging.getLogger("twistmq.node")

DASHBOARD_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "admin", "dashboard")
NODE_HOLDER = "node"
"""Who holds the sessions of a node's clients (``Sessions.claim_session``): the one front end there is."""
START_ERRORS = (ConfigError, StoreLockedError, tls.TLSConfigError, PasswordFileError, ACLError, OSError)
"""What a bad configuration raises while the node is built or started: one line, exit code 2."""


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
        self.mongodb = mongodb_pool(reactor, cfg)  # None unless the config uses MongoDB
        self.auth_executor, auth, acl = client_security(reactor, cfg, self.mongodb)
        # The MQTT front end reaches the parts above only through the store interface, served in-process
        # here by one broker group (a proxy runs the same front end over the remote store).
        self.local_store = self.state.local_store(cfg.cluster.group, own_holder=NODE_HOLDER)
        # [[bridge.mongodb]]: durable subscribers inside the store, with their own positions (cluster/bridges).
        self.bridges = store_bridges(reactor, cfg, self.state, self.local_store, self.mongodb)
        deliver_latency = Histogram()
        self.mqtt = build_front_end(self.local_store, reactor, mqtt, cfg.limits, auth, acl, holder=NODE_HOLDER,
                                    deliver_latency=deliver_latency,
                                    log_connections=cfg.log.connection_messages, left_wills=True)
        # Retention keeps what sessions and shared groups still owe (native consumers and retained messages:
        # StoreParts).
        self.store.retention.add_holder(self.mqtt.owed)
        self.lag = ReactorLagProbe(reactor)  # twistmq_reactor_lag_seconds: nothing may hold the reactor
        self.health = health_probe(cfg)
        # The admin API, its figures (latency histograms fed by the store and the delivery pump) and history.
        self.view = NodeView(self.mqtt, self.store, cfg.admin.member_id or f"node@{socket.gethostname()}",
                             retained=self.retained)
        self.figures = NodeFigures(reactor, self.lag, listeners=lambda: self.streams,
                                   connections=lambda: chain(self.mqtt.connections, self.native.connections),
                                   queue_lag=self.view.lag_total, deliver=deliver_latency,
                                   append=self.state.append_latency)
        stats = self.mqtt.stats
        self.history = RateHistory(reactor, lambda: (stats.messages_received, stats.messages_sent),
                                   self.view.topic_offsets)
        self.sys = SysPublisher(self.mqtt, self.local_store, reactor, cfg.mqtt.sys_interval, twistmq_version(),
                                self._broker_figures, extra=self.figures.sys_values)
        handlers = Handlers(self.view, reactor, self._overview, self.timers, self.native.engine, self.history,
                            bridges=self.bridges.rows if self.bridges is not None else None,
                            member=self._member)
        self.admin_api = AdminAPI(served_by(routes(), "node"), handlers, cfg.admin.token, cfg.admin.max_body_bytes)
        self.extra_stats = [("native", self.native.stats), ("timer", self.timers.stats)]
        if self.mongodb is not None:
            self.extra_stats.append(("mongodb", self.mongodb.stats))
        self.streams, self.datagrams = self._listeners()

    def _listeners(self):
        """A ListenerService per stream listener, a DatagramListenerService per UDP one, in flag order."""
        http = http_site(self.mqtt, self.store, self._extra_stats, self._losses, self.lag, self.figures,
                         self.admin_api, DASHBOARD_DIR if self.cfg.admin.dashboard else None,
                         self.cfg.admin.max_body_bytes, self.cfg.admin.request_timeout_s, self.reactor,
                         collectors=[BridgeCollector(self.bridges.rows)] if self.bridges is not None else [])
        return client_listeners(self.reactor, self.cfg, self.mqtt, self.native, http)

    def reloader(self) -> Reloader:
        """SIGHUP re-reads the password file, the ACL and the TLS certificates (mqtt_proxy/auth/reload.py)."""
        return security_reloader(self.mqtt, self.streams)

    def _member(self) -> dict:
        """This node's row in cluster/members: its id (as clients' ``proxy`` field), the group its store
        serves, its health flag now (``[cluster]`` limits), zone and version; it is its own cluster."""
        cluster = self.cfg.cluster
        return {"id": self.view.member_id, "role": "node", "group": cluster.group, "active": True,
                "healthy": bool(self.health()), "leader": False, "joined": True, "zone": cluster.zone,
                "version": twistmq_version()}

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
            "twistmq_denied_deliveries_messages": ("messages not delivered to a subscriber whose identity the ACL "
                                                   "no longer lets read them", stats.messages_denied),
            "twistmq_dead_lettered_messages": ("popped messages moved to a dead-letter queue",
                                               native["dead_lettered"]),
            "twistmq_retained_queue_dropped_messages": (
                "retained messages for a SUBSCRIBE beyond the client's queue (max_queued_bytes)",
                stats.retained_dropped),
            **self._index_refusals(),
        }

    def _index_refusals(self):
        """What the light-queue index refused for its caps (issue 26), for /metrics."""
        index = self.store.queue_index
        if index is None:
            return {}
        return {
            "twistmq_filters_refused": ("SUBSCRIBEs refused for max_filter_shapes", index.trie.refused),
            "twistmq_topic_queue_refused_messages": (
                "publishes to a new first level not indexed in a topic queue for max_topic_queues",
                index.topic_queues_refused),
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
        *([parts.mongodb] if parts.mongodb is not None else []),
        Part("auth-executor", start=parts.auth_executor.start, stop=parts.auth_executor.stop),
        *parts.state.tree_parts(),
        *bridge_parts(parts.bridges),
        Part("mqtt-sessions", start=parts.mqtt.restore, stop=parts.mqtt.shutdown),
        Part("sys", start=parts.sys.start, stop=parts.sys.stop),
        Part("admin-history", start=parts.history.start, stop=parts.history.stop),
        *listeners,
        # The collector takes over once everything alive now is built (cluster/runtime/heap.py). The lag probe starts
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


