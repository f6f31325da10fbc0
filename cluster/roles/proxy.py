"""The ``proxy`` role: MQTT and native listeners, sessions, and the remote store; no durable state of its own.

``twistd -n twistmq proxy --config F --node-id ID --mqtt ... --native ... --http ...``
connects to every broker of ``[[cluster.members]]`` (one RPC connection each,
reconnecting with back-off), puts a ``RemoteStore`` per broker group behind a
``RoutedStore`` (hash slots: ``cluster.routing``), and runs the node's MQTT
front end over it: the same sessions, QoS flows, retained and will messages,
with every piece of durable state in the broker groups. A session is claimed
in its groups on CONNECT; when another proxy claims it, the broker tells this
one (an RPC event) and the client is disconnected (v5: 0x8E), and a proxy that
was merely stopped finds its writes refused (``Fenced``) when it wakes.
Native requests are forwarded whole to the group of their queue
(``cluster.remote.proxy_native``). ``/health`` and ``/metrics`` are on ``--http``.

With ``[cluster] controllers`` the configured brokers are only where it starts: the controllers'
metadata (pushed, and polled with each heartbeat) gives the slot table, the explicit routes and each
group's broker address, and a group whose broker moved is dialled at its new address
(``cluster.remote.rerouting``). ``--rpc`` opens an RPC listener where the ``admin`` role asks for
this proxy's clients (``cluster.admin.member_calls``); its address is in the proxy's member record.

A group that cannot be reached holds the client's acknowledgement for up to
``[cluster] call_timeout`` (the RPC waits for the broker to come back); then
the client is disconnected (v5 DISCONNECT 0x89 Server busy; 3.1.1 closes) and
the publish is not acknowledged: nothing is acknowledged that a broker did not
store.
"""

from __future__ import annotations

import dataclasses
import logging
import signal

import msgpack
from twisted.internet import defer, endpoints

from cluster.admin.member_calls import MemberCalls
from cluster.admin.view import NodeView
from cluster.local.native_service import topic_limits
from cluster.remote.group_watch import GroupWatch
from cluster.remote.proxy_native import ForwardingEngine, ProxyNativeService
from cluster.remote.rerouting import Rerouter
from cluster.remote.routed_store import RoutedStore
from cluster.remote.server import SESSION_EVENT
from cluster.remote.store import RemoteStore
from cluster.roles.common import (
    BOOT,
    NodeOptions,
    client_security,
    mongodb_pool,
    client_listeners,
    default_node_id,
    health_probe,
    member_agent,
    node_config,
    rpc_server_listeners,
    security_reloader,
)
from cluster.routing import RoutingError, SlotTable
from cluster.rpc.frames import RPC_VERSION, Hello
from cluster.rpc.peer import PeerClient
from cluster.rpc.protocol import RpcSettings
from cluster.runtime import heap, node_log
from cluster.runtime.http import proxy_site
from cluster.runtime.services import Part, ReadyLine, RoleService, SignalService
from cluster.runtime.version import twistmq_version
from mqtt_proxy import tls
from mqtt_proxy.auth.acl import ACLError
from mqtt_proxy.auth.passwords import PasswordFileError
from mqtt_proxy.auth.reload import Reloader
from mqtt_proxy.front_end import build_front_end
from mqtt_proxy.reactor_lag import ReactorLagProbe
from store.config import ConfigError, NativeConfig, from_mapping

log = logging.getLogger("twistmq.proxy")

START_ERRORS = (ConfigError, tls.TLSConfigError, PasswordFileError, ACLError, OSError, RoutingError)


class ProxyOptions(NodeOptions):
    """Options of ``twistmq proxy``: the node's listeners, plus its member id."""

    optParameters = NodeOptions.optParameters + [
        ["node-id", None, None, "this proxy's member id (overrides cluster.node_id)"],
    ]

    def opt_rpc(self, value):
        """RPC listener the admin role gathers clients on, e.g. tcp:7801:interface=127.0.0.1 (repeatable)"""
        self._listener("rpc", value)


def proxy_config(options: ProxyOptions):
    """The node's config handling, then the proxy's identity and the broker groups it needs."""
    cfg = node_config(options, role="proxy")
    cluster = cfg.cluster
    if options["node-id"]:
        cluster = dataclasses.replace(cluster, node_id=options["node-id"])
    if not cluster.node_id:
        cluster = dataclasses.replace(cluster, node_id=default_node_id(cfg.node.data_dir))
    if not [m for m in cluster.members if m.role == "broker"]:
        raise ConfigError("a proxy needs brokers: list them as [[cluster.members]] with role = \"broker\", "
                          "a group and an rpc address")
    return dataclasses.replace(cfg, cluster=cluster)


class ProxyParts:
    """The proxy's parts: RPC peers and remote stores per group, the routed store, the front end, listeners."""

    def __init__(self, reactor, cfg, rpc=()) -> None:
        self.reactor = reactor
        self.cfg = cfg
        cluster = cfg.cluster
        health = health_probe(cfg)
        self.peers: list[PeerClient] = []
        self.remotes: dict[str, RemoteStore] = {}
        addresses = {}
        for member in cluster.members:
            if member.role != "broker":
                continue
            if member.group in self.remotes:  # replicas come with replication: the first listed serves
                continue
            self.remotes[member.group] = self._remote(member.id, member.group, member.rpc, health)
            addresses[member.group] = member.rpc
        native_config = from_mapping(NativeConfig, "native", cfg.native)
        self.store = RoutedStore(SlotTable.build(tuple(self.remotes), cluster.slot_assignment(), dict(cluster.routes)),
                                 self.remotes, cluster.group_numbers,
                                 native_config.virtual_queues)
        mqtt = cfg.mqtt
        self.mongodb = mongodb_pool(reactor, cfg)  # None unless the config uses MongoDB
        self.auth_executor, auth, acl = client_security(reactor, cfg, self.mongodb)
        self.mqtt = build_front_end(self.store, reactor, mqtt, cfg.limits, auth, acl, holder=cluster.node_id,
                                    log_connections=cfg.log.connection_messages)
        self.native = ProxyNativeService(ForwardingEngine(self.store), native_config, topic_limits(cfg.limits))
        self.lag = ReactorLagProbe(reactor)
        self.streams, self.datagrams = self._listeners()
        self.streams += rpc_server_listeners(reactor, cfg, rpc, "proxy", health,
                                             MemberCalls(NodeView(self.mqtt, self.store, cluster.node_id)).register)
        self.agent = member_agent(reactor, cfg, "proxy", self.streams, health)  # None: static membership
        # a group that loses this proxy for a lease takes over its sessions there: close them here first
        self.group_watch = GroupWatch(reactor, self.store, self.mqtt.registry, cluster.node_id, cfg.discovery.lease,
                                      cfg.discovery.wheel_tick)
        if self.agent is not None:  # the controllers' groups, slots and routes win over the config's
            self.rerouter = Rerouter(self.store, addresses, self._added_group, self._moved)
            self.agent.on_metadata(self.rerouter.apply)

    @property
    def table(self) -> SlotTable:
        return self.store.table

    def _remote(self, peer_id: str, group: str, address: str, health) -> RemoteStore:
        cluster = self.cfg.cluster
        settings = RpcSettings(cluster.call_timeout, cluster.heartbeat_interval, cluster.max_frame_bytes,
                               cluster.secret)
        hello = Hello(cluster.cluster_id, cluster.node_id, "proxy", RPC_VERSION, boot=BOOT)
        peer = PeerClient(peer_id, endpoints.clientFromString(self.reactor, address), hello, settings, self.reactor,
                          health=health)
        self.peers.append(peer)
        peer.on_event(lambda topic, body: self._event(group, topic, body))
        return RemoteStore(peer, wait_connected=cluster.call_timeout)

    def _added_group(self, group: str, address: str) -> RemoteStore:
        remote = self._remote(f"broker-{group}", group, address, health_probe(self.cfg))
        remote.peer.startService()
        return remote

    def _moved(self, remote: RemoteStore, address: str) -> None:
        remote.peer.retarget(endpoints.clientFromString(self.reactor, address))
        remote.moved()

    def _event(self, group: str, topic: str, body: bytes) -> None:
        """A broker's event other than queue news: a session of ours taken over elsewhere."""
        if topic != SESSION_EVENT:
            return
        try:
            client_id, epoch = msgpack.unpackb(body, raw=False)
        except Exception:  # noqa: BLE001 - a malformed event is logged, never fatal
            log.warning("proxy_bad_session_event group=%s", group)
            return
        if self.table.group_of_client(client_id) == group:  # the home group's epoch is the session's
            self.mqtt.registry.taken_over(client_id, epoch)

    def connect(self) -> defer.Deferred:
        """Start the RPC peers; fires once each group is connected or ``call_timeout`` has passed (a group
        that is down does not keep the proxy from serving the others)."""
        for peer in self.peers:
            peer.startService()
        waits = [peer.when_connected() for peer in self.peers]
        timeout = self.cfg.cluster.call_timeout
        for d in waits:
            d.addTimeout(timeout, self.reactor).addErrback(lambda f: f.trap(defer.TimeoutError))
        return defer.DeferredList(waits).addCallback(self._connected)

    def _connected(self, _results) -> None:
        down = [p.peer_id for p in self.peers if not p.connected]
        if down:
            log.warning("proxy_brokers_unreachable brokers=%s", ",".join(down))

    def disconnect(self) -> defer.Deferred:
        return defer.DeferredList([peer.stopService() for peer in self.peers])

    def _listeners(self):
        http = proxy_site(self.mqtt, [(r.peer, r) for r in self.remotes.values()],
                          lambda: [("native", self.native.stats()),
                                   ("group_watch", {"sessions_closed": self.group_watch.closed}),
                                   *([("mongodb", self.mongodb.stats())] if self.mongodb is not None else [])],
                          self.lag)
        return client_listeners(self.reactor, self.cfg, self.mqtt, self.native, http)

    def reloader(self) -> Reloader:
        return security_reloader(self.mqtt, self.streams)


def proxy_tree(parts: ProxyParts) -> RoleService:
    """Start order: RPC peers, the front end (sessions it held before a restart), $SYS, listeners, ready."""
    cfg = parts.cfg
    root = RoleService("proxy", parts.reactor, START_ERRORS, cfg.log.file)
    listeners = parts.streams + parts.datagrams

    def announce():
        log.info("proxy_ready version=%s node_id=%s cluster=%s groups=%s config=%s", twistmq_version(),
                 cfg.cluster.node_id, cfg.cluster.cluster_id, ",".join(parts.table.groups), cfg.source)

    children = [
        SignalService("reload", signal.SIGHUP, parts.reloader().reload, parts.reactor),
        *([parts.mongodb] if parts.mongodb is not None else []),
        Part("auth-executor", start=parts.auth_executor.start, stop=parts.auth_executor.stop),
        Part("rpc-peers", start=parts.connect, stop=parts.disconnect),
        Part("mqtt-sessions", start=parts.mqtt.restore, stop=parts.mqtt.shutdown),
        Part("group-watch", start=parts.group_watch.start, stop=parts.group_watch.stop),
        Part("native", stop=parts.native.stop),
        *listeners,
        *([parts.agent] if parts.agent is not None else []),  # registers once the listeners are bound
        Part("lag-probe", start=lambda: (heap.settle(), parts.lag.start()), stop=parts.lag.stop),
        ReadyLine(listeners, announce),
    ]
    for child in children:
        child.setServiceParent(root)
    return root


def build_proxy(options: ProxyOptions, reactor) -> RoleService:
    cfg = proxy_config(options)
    observer = node_log.configure(cfg.log)
    root = proxy_tree(ProxyParts(reactor, cfg, rpc=options.listeners.get("rpc", ())))
    root.log_observer = observer
    return root
