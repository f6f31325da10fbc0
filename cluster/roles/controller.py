"""The ``controller`` role: the cluster metadata in Raft, member leases, and the RPC members use.

``twistd -n twistmq controller --data-dir D --raft 127.0.0.1:7900 --peer 127.0.0.1:7901
--peer 127.0.0.1:7902 --rpc tcp:7910:interface=127.0.0.1 --http tcp:8090:interface=127.0.0.1
[--config F] [--node-id ID]`` runs one of 3 or 5 controllers: pysyncobj's Raft on ``--raft``
(journal and snapshot in the data dir), the controller's RPC (register, heartbeat, deregister,
metadata: ``cluster.controller.service``) on ``--rpc``, and ``/health``, ``/metrics`` and the
admin API's ``cluster/members`` on ``--http``. Its first leader seeds slots and routes from the
``[cluster]`` config. It prints ``twistmq ready rpc=HOST:PORT http=HOST:PORT raft=HOST:PORT``
once its listeners are bound (Raft elects in the background). Without listener flags it opens
``[controller] rpc`` and ``[node] http`` of the config file; ``[controller] raft`` and ``peers``
unless ``--raft``/``--peer`` are given.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal

from twisted.internet import endpoints
from twisted.python import usage

from cluster.admin.api import AdminAPI
from cluster.admin.controller_handlers import ControllerHandlers
from cluster.admin.routes import routes, served_by
from cluster.controller.raft import RaftNode
from cluster.controller.raft_files import UnreadableRaftFile
from cluster.controller.service import Controller
from cluster.controller.site import controller_site
from cluster.roles.common import default_node_id, health_probe, rpc_and_http_listeners
from cluster.routing import RoutingError, SlotTable
from cluster.rpc.dispatch import Dispatcher
from cluster.rpc.frames import RPC_VERSION, Hello
from cluster.rpc.metrics import RpcMetrics
from cluster.rpc.protocol import RpcSettings
from cluster.rpc.server import RpcServerFactory
from cluster.runtime import node_log
from cluster.runtime.config import CONFIG_HELP, find_config, load_config, with_data_dir, with_flags
from cluster.runtime.listeners import is_loopback
from cluster.runtime.services import ListenerService, Part, ReadyLine, RoleService, SignalService
from cluster.runtime.version import print_version, twistmq_version
from store.config import ConfigError

log = logging.getLogger("twistmq.controller")

START_ERRORS = (ConfigError, OSError, UnreadableRaftFile)


class ControllerOptions(usage.Options):
    """Options of ``twistmq controller``."""

    optParameters = [
        ["config", "c", None, CONFIG_HELP],
        ["data-dir", "d", None, "data directory: the Raft journal and snapshot (overrides node.data_dir)"],
        ["node-id", None, None, "this controller's member id (overrides cluster.node_id)"],
        ["raft", None, None, "this controller's Raft address HOST:PORT (overrides controller.raft)"],
        ["raft-bind", None, None, "the Raft address to bind when peers dial another one (overrides controller.raft_bind)"],
    ]

    def __init__(self) -> None:
        super().__init__()
        self.listeners: dict[str, list[str]] = {}
        self.peers: list[str] = []

    def opt_peer(self, value):
        """another controller's Raft address HOST:PORT, or ID=HOST:PORT with its member id (repeatable; overrides controller.peers)"""
        self.peers.append(value)

    def opt_rpc(self, value):
        """RPC listener members register and heartbeat on, e.g. tcp:7910:interface=127.0.0.1 (repeatable)"""
        self.listeners.setdefault("rpc", []).append(value)

    def opt_http(self, value):
        """HTTP listener for /health, /metrics and cluster/members, e.g. tcp:8090:interface=127.0.0.1 (repeatable)"""
        self.listeners.setdefault("http", []).append(value)

    def opt_version(self):
        """print twistmq's version and exit"""
        print_version()


def controller_config(options: ControllerOptions):
    """The config file with the command line applied; the listeners checked (rpc, then http)."""
    cfg = load_config(find_config(options["config"]))
    if options["data-dir"]:
        cfg = with_flags(cfg, {"data_dir": options["data-dir"]})
    cluster = cfg.cluster
    if options["node-id"]:
        cluster = dataclasses.replace(cluster, node_id=options["node-id"])
    if not cluster.node_id:
        cluster = dataclasses.replace(cluster, node_id=default_node_id(cfg.node.data_dir))
    controller = cfg.controller
    changes = {}
    if options["raft"]:
        changes["raft"] = options["raft"]
    if options["raft-bind"]:
        changes["raft_bind"] = options["raft-bind"]
    if options.peers:
        changes["peers"] = tuple(options.peers)
    if options.listeners.get("rpc"):
        changes["rpc"] = tuple(options.listeners["rpc"])
    if changes:
        controller = dataclasses.replace(controller, **changes)
        try:
            controller.validate()
        except ConfigError as exc:
            raise ConfigError(f"controller.{exc}") from None
    _check_raft_exposure(controller.raft_bind or controller.raft, cluster.secret)  # what it binds is exposed
    flags = bool(options.listeners)
    listeners = rpc_and_http_listeners(
        cfg, "controller", list(controller.rpc), options.listeners.get("http", []) if flags else list(cfg.node.http),
        flags, "tcp:7910:interface=127.0.0.1")
    # Last: a configuration refused above makes no directory.
    return with_data_dir(dataclasses.replace(cfg, cluster=cluster, controller=controller, listeners=listeners),
                         "controller")


def _check_raft_exposure(raft: str, secret: str) -> None:
    """pysyncobj unpickles whatever reaches its port unless it has a password: off loopback, a secret is required."""
    if not is_loopback(raft.rpartition(":")[0].strip("[]")) and not secret:
        raise ConfigError(f"controller.raft {raft} is not a loopback address: set [cluster] secret (the Raft "
                          "port unpickles what reaches it; the secret encrypts and authenticates that traffic)")


def seed_from(cluster) -> tuple[dict, dict]:
    """Slots and routes of ``[cluster]`` as the first leader commits them: the groups are the configured
    brokers' and those ``slots`` names (else ``[cluster] group`` alone), split as a proxy of that config would."""
    groups = tuple(sorted({m.group for m in cluster.members if m.role == "broker"} | set(cluster.slots))) \
        or (cluster.group,)
    try:
        table = SlotTable.build(groups, cluster.slot_assignment() or None, cluster.routes)
    except RoutingError as exc:
        raise ConfigError(f"cluster.slots: {exc}") from None
    slots = {group: [list(r) for r in ranges] for group, ranges in table.slot_ranges().items()}
    return slots, dict(cluster.routes)


class ControllerParts:
    """The controller's parts: Raft, the controller's work over it, its RPC server and HTTP site."""

    def __init__(self, reactor, cfg) -> None:
        self.reactor = reactor
        self.cfg = cfg
        cluster, discovery = cfg.cluster, cfg.discovery
        self.raft = RaftNode(reactor, cfg.controller, os.path.join(cfg.node.data_dir, "raft"), cluster.secret or None)
        self.controller = Controller(reactor, self.raft, cluster.cluster_id, discovery.timings(),
                                     discovery.heartbeat_interval, seed_from(cluster),
                                     cfg.controller)
        self.metrics = RpcMetrics()
        self.dispatcher = Dispatcher(reactor, self.metrics)
        self.controller.register(self.dispatcher)
        settings = RpcSettings(cluster.call_timeout, cluster.heartbeat_interval, cluster.max_frame_bytes,
                               cluster.secret)
        hello = Hello(cluster.cluster_id, cluster.node_id, "controller", RPC_VERSION)
        health = health_probe(cfg)
        self.rpc = RpcServerFactory(hello, settings, reactor, self.dispatcher, health=health)
        self.rpc.on_lost(self.controller.connection_lost)
        handlers = ControllerHandlers(self.controller, self.raft, twistmq_version(), reactor, cluster.node_id, health)
        api = AdminAPI(served_by(routes(), "controller"), handlers, cfg.admin.token)
        site = controller_site(self.raft, self.controller, [self.metrics], api)
        self.listeners = [ListenerService(listener, endpoints.serverFromString(reactor, listener.description),
                                          self.rpc if listener.key == "rpc" else site)
                          for listener in cfg.listeners]


def controller_tree(parts: ControllerParts) -> RoleService:
    """The controller's service tree: Raft first, then the listeners, then the ready line."""
    cfg = parts.cfg
    root = RoleService("controller", parts.reactor, START_ERRORS, cfg.log.file)

    def announce():
        log.info("controller_ready version=%s node_id=%s cluster=%s raft=%s peers=%s data_dir=%s", twistmq_version(),
                 cfg.cluster.node_id, cfg.cluster.cluster_id, cfg.controller.raft, ",".join(cfg.controller.peers),
                 cfg.node.data_dir)

    children = [
        # systemctl reload sends SIGHUP, whose default action ends the process: a controller has no file to re-read.
        SignalService("reload", signal.SIGHUP, lambda: log.info("reload_ok role=controller files=none"),
                      parts.reactor),
        Part("raft", start=parts.raft.start, stop=parts.raft.stop),
        Part("leases", stop=parts.controller.stop),
        *parts.listeners,
        Part("rpc-goodbye", stop=parts.rpc.stop),
        ReadyLine(parts.listeners, announce, extra=(f"raft={cfg.controller.raft}",)),  # pysyncobj binds raft
    ]
    for child in children:
        child.setServiceParent(root)
    return root


def build_controller(options: ControllerOptions, reactor) -> RoleService:
    """Build the controller from its options; a bad config raises one of START_ERRORS."""
    cfg = controller_config(options)
    observer = node_log.configure(cfg.log)
    root = controller_tree(ControllerParts(reactor, cfg))
    root.log_observer = observer
    return root
