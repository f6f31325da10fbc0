"""The ``admin`` role: the admin HTTP API and dashboard for the whole cluster, with no store of its own.

``twistd -n twistmq admin --config F --http tcp:8070:interface=127.0.0.1 [--node-id ID]`` registers
with ``[cluster] controllers`` as a member of type ``admin`` (heartbeats, metadata pushed and polled:
``cluster.discovery.agent``), dials every proxy at the RPC address its member record advertises
(``cluster.discovery.dialer``), and serves on ``--http`` (else ``[node] http``) ``/health``,
``/metrics``, the dashboard and the admin API rows of openapi.json whose ``x-roles`` name ``admin``
(``cluster.admin.cluster_handlers``): ``cluster/members`` from the controllers' metadata, ``clients``
and ``sessions`` gathered from the proxies (each proxy started with ``--rpc`` answers them), and the
sessions no live proxy holds from the brokers (``store.list_sessions`` on their RPC). It
prints ``twistmq ready http=HOST:PORT`` once its listeners are bound. Without controllers it refuses
to start: it would have nobody to ask.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal

import msgpack
from twisted.internet import defer, endpoints
from twisted.python import usage

from cluster.admin.api import AdminAPI
from cluster.admin.cluster_handlers import ClusterHandlers
from cluster.admin.routes import routes, served_by
from cluster.discovery.dialer import MemberPeers
from cluster.remote import codec as store_codec
from cluster.remote.server import request_type
from cluster.roles.common import default_node_id, health_probe, member_agent
from cluster.rpc.frames import RPC_VERSION, Hello
from cluster.rpc.protocol import RpcSettings
from cluster.runtime import node_log
from cluster.runtime.config import CONFIG_HELP, find_config, load_config
from cluster.runtime.http import admin_site
from cluster.runtime.listeners import parse_listener
from cluster.runtime.services import (
    ListenerService,
    Part,
    ReadyLine,
    RoleService,
    SignalService,
)
from cluster.runtime.version import print_version, twistmq_version
from store.config import ConfigError

log = logging.getLogger("twistmq.admin")

START_ERRORS = (ConfigError, OSError)
DASHBOARD_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "admin", "dashboard")


class AdminOptions(usage.Options):
    """Options of ``twistmq admin``."""

    optParameters = [
        ["config", "c", None, CONFIG_HELP],
        ["node-id", None, None, "this process's member id (overrides cluster.node_id; default: admin@HOSTNAME)"],
    ]

    def __init__(self) -> None:
        super().__init__()
        self.http: list[str] = []

    def opt_http(self, value):
        """HTTP listener: the admin API, the dashboard, /health and /metrics, e.g. tcp:8070:interface=127.0.0.1
        (repeatable)"""
        self.http.append(value)

    def opt_version(self):
        """print twistmq's version and exit"""
        print_version()


def admin_config(options: AdminOptions):
    """The config file with the command line applied; controllers required, HTTP listeners checked."""
    cfg = load_config(find_config(options["config"]))
    cluster = cfg.cluster
    if options["node-id"]:
        cluster = dataclasses.replace(cluster, node_id=options["node-id"])
    if not cluster.node_id:
        cluster = dataclasses.replace(cluster, node_id="admin@" + default_node_id(""))
    if not cluster.controllers:
        raise ConfigError("the admin role gathers from the cluster through its controllers: set [cluster] controllers")
    flags = bool(options.http)
    listeners = []
    for description in options.http if flags else cfg.node.http:
        listener = parse_listener("http", description, None if flags else cfg.source, None if flags else cfg.base_dir)
        if not listener.interface and listener.kind != "unix":
            raise ConfigError(f"{listener.where}: an HTTP listener must name its interface "
                              "(interface=127.0.0.1, or interface=0.0.0.0 for all)")
        listeners.append(listener)
    if not listeners:
        raise ConfigError("the admin role needs an HTTP listener: for example --http tcp:8070:interface=127.0.0.1")
    return dataclasses.replace(cfg, cluster=cluster, listeners=tuple(listeners))


class AdminParts:
    """The admin role's parts: its member agent, RPC connections to the proxies and brokers, the API over them,
    listeners."""

    def __init__(self, reactor, cfg) -> None:
        self.reactor = reactor
        self.cfg = cfg
        cluster = cfg.cluster
        settings = RpcSettings(cluster.call_timeout, cluster.heartbeat_interval, cluster.max_frame_bytes,
                               cluster.secret)
        self.peers = MemberPeers(reactor, Hello(cluster.cluster_id, cluster.node_id, "admin", RPC_VERSION),
                                   settings, ("proxy", "broker"))
        handlers = ClusterHandlers(self._members, self._controllers, self._call, self._stored)
        api = AdminAPI(served_by(routes(), "admin"), handlers, cfg.admin.token, cfg.admin.max_body_bytes)
        site = admin_site(api, self._status, dashboard_dir=DASHBOARD_DIR if cfg.admin.dashboard else None,
                          max_body=cfg.admin.max_body_bytes, request_timeout=cfg.admin.request_timeout_s,
                          reactor=reactor)
        self.listeners = [ListenerService(listener, endpoints.serverFromString(reactor, listener.description), site)
                          for listener in cfg.listeners]
        self.agent = member_agent(reactor, cfg, "admin", self.listeners, health_probe(cfg))
        self.agent.on_metadata(self.peers.apply)

    def _members(self) -> list[dict] | None:
        """The metadata's member records; None until the agent has read the metadata once."""
        if self.agent.metadata is None:
            return None
        return list(self.agent.metadata.get("members") or ())

    def _controllers(self) -> list[dict]:
        """The controllers as Member rows: id is the RPC address members dial; leader is the one this process's
        lease is held on (the leader takes registers and heartbeats only)."""
        leader = self.agent.leader if self.agent.joined else None
        return [{"id": address, "role": "controller", "group": None, "active": True, "healthy": peer.healthy,
                 "leader": peer is leader, "joined": peer.connected, "zone": "", "version": "", "address": address,
                 "last_heartbeat": 0.0}
                for address, peer in zip(self.cfg.cluster.controllers, self.agent.controllers)]

    def _call(self, node_id: str, kind: str, body: dict):
        d = self.peers.call(node_id, kind, msgpack.packb(body), wait=self.cfg.cluster.call_timeout)
        return d.addCallback(lambda answer: msgpack.unpackb(answer, raw=False))

    def _stored(self):
        """Every joined broker's stored sessions, as ClusterHandlers reads them; fails if one does not answer."""
        brokers = sorted(r["node_id"] for r in self._members() or ()
                         if r.get("node_type") == "broker" and r.get("joined"))
        frame = store_codec.pack_call("list_sessions")
        calls = [self.peers.call(b, request_type("list_sessions"), frame, wait=self.cfg.cluster.call_timeout)
                 .addCallback(lambda body: store_codec.unpack_result("list_sessions", body)) for b in brokers]
        d = defer.gatherResults(calls, consumeErrors=True)
        d.addErrback(lambda failure: failure.value.subFailure if isinstance(failure.value, defer.FirstError)
                     else failure)
        return d.addCallback(lambda per_broker: [_stored_row(st) for states in per_broker for st in states])

    def _status(self) -> dict:
        return {"status": "ok", "joined": self.agent.joined, "metadata_version": self.agent.version,
                "peers": sorted(self.peers.peers)}


def _stored_row(state) -> dict:
    """A broker's ``store.api.SessionState`` as ClusterHandlers lists it."""
    return {"client_id": state.meta.client_id, "holder": state.holder, "protocol_level": state.meta.protocol_level,
            "subscriptions": [sub.key for sub in state.subscriptions], "inflight": len(state.outbound),
            "epoch": state.epoch}


def admin_tree(parts: AdminParts) -> RoleService:
    """The admin role's tree: the listeners, the member agent (registers once they are bound), the ready line."""
    cfg = parts.cfg
    root = RoleService("admin", parts.reactor, START_ERRORS, cfg.log.file)

    def announce():
        log.info("admin_ready version=%s node_id=%s cluster=%s controllers=%s config=%s", twistmq_version(),
                 cfg.cluster.node_id, cfg.cluster.cluster_id, ",".join(cfg.cluster.controllers), cfg.source)

    children = [
        SignalService("reload", signal.SIGHUP, lambda: log.info("reload_ok role=admin files=none"), parts.reactor),
        Part("member-peers", stop=parts.peers.stop),
        *parts.listeners,
        parts.agent,
        ReadyLine(parts.listeners, announce),
    ]
    for child in children:
        child.setServiceParent(root)
    return root


def build_admin(options: AdminOptions, reactor) -> RoleService:
    """Build the admin role from its options; a bad config raises one of START_ERRORS."""
    cfg = admin_config(options)
    observer = node_log.configure(cfg.log)
    root = admin_tree(AdminParts(reactor, cfg))
    root.log_observer = observer
    return root
