"""The ``broker`` role: one broker group's store served over RPC, with no MQTT or native client listeners.

``twistd -n twistmq broker --data-dir D --rpc tcp:P:interface=127.0.0.1
--http tcp:H:interface=127.0.0.1 [--config F] [--node-id ID] [--group G]``
runs the store half of a node (``cluster.local.parts``: commit log, light
queues, retained index, timers, session KV, native engine, notifier,
retention) behind ``LocalStore``, and serves it to proxies on the RPC
listeners (``cluster.remote.server``: every store operation, notify as event
frames to the connections that watch a queue, native requests forwarded
whole). ``/health`` and ``/metrics`` (with the RPC counters) are on the HTTP
listeners. It prints ``twistmq ready rpc=HOST:PORT http=HOST:PORT`` once
recovery is done and every listener is bound. If any listener flag is given,
exactly the listeners given open; otherwise ``[cluster] rpc`` and ``[node]
http`` of the config file. Its identity (``[cluster]`` cluster_id, node_id,
group) is what RPC handshakes carry.

Replication (``--ha LISTENER``, ``--ha-master ENDPOINT``; ``[cluster]`` ha,
ha_master): a broker without ``ha_master`` is its group's master, begins a new
epoch at each start and serves its log to slaves on its ``ha`` listeners; one
with ``ha_master`` is a slave of it: it replicates the master's log, refuses
client writes and delivers no timers (its master does; its timer state follows the log). With ``[cluster]
controllers`` and an ``ha`` listener the controllers decide instead
(``cluster.replication.controllers``): the broker registers before it serves
(the config's master may master only an empty group, on its first start),
heartbeats, and switches role whenever they elect another master.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import signal

from twisted.internet import defer, endpoints
from twisted.python import usage

from cluster.admin.api import AdminAPI
from cluster.admin.broker_handlers import BrokerHandlers
from cluster.admin.routes import routes, served_by
from cluster.bridges.metrics import BridgeCollector
from cluster.local.parts import StoreParts
from cluster.local.logged_interest import LoggedInterest
from cluster.local.session_interest import SessionInterest
from cluster.replication.controllers import ReplicaAgent
from cluster.replication.role import ReplicaRole
from cluster.replication.settings import HASettings
from cluster.local.session_keeper import SessionKeeper
from cluster.remote.server import StoreServer
from cluster.routing import RoutingError, SlotTable
from cluster.roles.common import (
    bridge_parts,
    default_node_id,
    health_probe,
    member_agent,
    mongodb_pool,
    rpc_and_http_listeners,
    store_bridges,
)
from cluster.rpc.dispatch import Dispatcher
from cluster.rpc.frames import RPC_VERSION, Hello
from cluster.rpc.metrics import RpcMetrics
from cluster.rpc.peer import MAX_RETRY_DELAY, PeerClient
from cluster.rpc.protocol import RpcSettings
from cluster.rpc.server import RpcServerFactory
from cluster.runtime import node_log
from cluster.runtime.config import CONFIG_HELP, find_config, load_config, with_data_dir, with_flags
from cluster.runtime.http import store_site
from cluster.runtime.listeners import parse_listener
from cluster.runtime.services import ListenerService, Part, ReadyLine, RoleService, SignalService, address
from cluster.runtime.version import print_version, twistmq_version
from store.config import ConfigError
from store.message_store import StoreLockedError
from store.session_store import SessionStore

log = logging.getLogger("twistmq.broker")

START_ERRORS = (ConfigError, StoreLockedError, OSError)


class BrokerOptions(usage.Options):
    """Options of ``twistmq broker``."""

    optParameters = [
        ["config", "c", None, CONFIG_HELP],
        ["data-dir", "d", None, "data directory (overrides node.data_dir; default /var/lib/twistmq/broker)"],
        ["node-id", None, None, "this broker's member id (overrides cluster.node_id)"],
        ["group", None, None, "the broker group it serves (overrides cluster.group)"],
        ["ha-master", None, None, "replicate from this master's ha listener, a client endpoint such as "
                                  "tcp:127.0.0.1:7850 (overrides cluster.ha_master; none: this broker is master)"],
    ]

    def __init__(self) -> None:
        super().__init__()
        self.listeners: dict[str, list[str]] = {}

    def opt_rpc(self, value):
        """RPC listener for proxies and other nodes, e.g. tcp:7800:interface=127.0.0.1 (repeatable)"""
        self.listeners.setdefault("rpc", []).append(value)

    def opt_http(self, value):
        """HTTP listener for /health and /metrics, e.g. tcp:8080:interface=127.0.0.1 (repeatable)"""
        self.listeners.setdefault("http", []).append(value)

    def opt_ha(self, value):
        """replication listener the group's slaves connect to, e.g. tcp:7850:interface=127.0.0.1 (repeatable)"""
        self.listeners.setdefault("ha", []).append(value)

    def opt_version(self):
        """print twistmq's version and exit"""
        print_version()


def broker_config(options: BrokerOptions):
    """The config file with the command line applied; the listeners checked (rpc first, then http)."""
    cfg = load_config(find_config(options["config"]))
    if options["data-dir"]:
        cfg = with_flags(cfg, {"data_dir": options["data-dir"]})
    cluster = cfg.cluster
    if options["node-id"]:
        cluster = dataclasses.replace(cluster, node_id=options["node-id"])
    if options["group"]:
        cluster = dataclasses.replace(cluster, group=options["group"])
    if options["ha-master"]:
        cluster = dataclasses.replace(cluster, ha_master=options["ha-master"])
        cluster.validate()
    if not cluster.node_id:
        # From a directory someone named; with the default one (/var/lib/twistmq/broker) the host name.
        cluster = dataclasses.replace(cluster, node_id=default_node_id(cfg.node.data_dir))
    flags = bool(options.listeners)
    listeners = rpc_and_http_listeners(
        cfg, "broker", options.listeners.get("rpc", []) if flags else list(cluster.rpc),
        options.listeners.get("http", []) if flags else list(cfg.node.http), flags, "tcp:7800:interface=127.0.0.1")
    ha = tuple(parse_listener("ha", d, None if flags else cfg.source, None if flags else cfg.base_dir)
               for d in (options.listeners.get("ha", []) if flags else cluster.ha))
    _check_ha_exposure(ha, cluster.ha_master, cluster.secret)
    listeners += ha
    # Last: a configuration refused above makes no directory.
    return with_data_dir(dataclasses.replace(cfg, cluster=cluster, listeners=listeners), "broker")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_ha_exposure(ha, ha_master: str, secret: str) -> None:
    """Off loopback the replication channel needs ``[cluster] secret``: without it anyone could pull the log as a
    slave, or feed a slave (and make it truncate) as its master."""
    if secret:
        return
    for listener in ha:
        if listener.kind != "unix" and not _loopback(listener.interface or "0.0.0.0"):
            raise ConfigError(f"{listener.where} is not on loopback: set [cluster] secret (slaves and masters "
                              "prove it to each other on the replication channel)")
    if ha_master:
        parts = ha_master.split(":")
        host = next((p[5:] for p in parts if p.startswith("host=")), parts[1] if len(parts) > 1 else "")
        if not ha_master.startswith("unix:") and not _loopback(host):
            raise ConfigError(f"ha_master {ha_master} is not on loopback: set [cluster] secret (slaves and masters "
                              "prove it to each other on the replication channel)")


def homed_here(cluster):
    """Whether a client id's session lives in this broker's group, by the slot table the proxies build from the
    same config (every client id, when the config lists no broker groups)."""
    groups = tuple(dict.fromkeys(m.group for m in cluster.members if m.role == "broker"))
    if cluster.group not in groups:
        return lambda _client_id: True
    try:
        table = SlotTable.build(groups, cluster.slot_assignment(), dict(cluster.routes))
    except RoutingError:
        return lambda _client_id: True
    return lambda client_id: table.group_of_client(client_id) == cluster.group


def homed_by_metadata(metadata: dict, group: str):
    """``homed_here`` by the controllers' slot table (which an operator's slot moves change), or None when the
    metadata has none (the config's table stays)."""
    try:
        table = SlotTable.from_metadata(metadata)
    except RoutingError:
        return None
    if group not in table.groups:
        return None
    return lambda client_id: table.group_of_client(client_id) == group


class BrokerParts:
    """The broker's parts: the store half, the store interface over it, and the RPC server in front."""

    def __init__(self, reactor, cfg) -> None:
        self.reactor = reactor
        self.cfg = cfg
        cluster = cfg.cluster
        self.state = StoreParts(reactor, cfg)
        ha_settings = HASettings(secret=cluster.secret, max_time_not_caught_up_s=cluster.ha_max_time_slave_not_catchup,
                                 all_ack=cluster.all_ack_in_sync_state_set,
                                 min_in_sync_replicas=cluster.min_in_sync_replicas, ack_timeout_s=cluster.call_timeout)
        self.replication = ReplicaRole(self.state.store, cluster.node_id, ha_settings, reactor,
                                       cluster.ha_async_learner, on_role=self._role_changed)
        if cluster.ha_master:  # from the start: nothing may write before replication begins
            self.state.store.replica_of = cluster.ha_master
        # First start only (no epoch yet): the config's master may master an empty group.
        self._may_master = not cluster.ha_master and self.state.store.epochs.last is None
        self.state.hold_stored_sessions()
        # the broker's own interest in stored sessions' filters: they miss nothing while their proxy is gone
        local_store = self.state.local_store(cluster.group)
        # the filters anyone holds interest in, in the group's log: a new master indexes for them from its first
        # write, before the proxies took their interest again
        self.interest = LoggedInterest(local_store, self.state.session_log, lambda: not self.state.store.replica_of,
                                       reactor, cfg.discovery.lease)
        self.local = SessionInterest(self.interest, SessionStore(self.state.session_log))
        # [[bridge.mongodb]]: each reads this group's light queue of its filter (a filter whose topics span
        # groups is read by the bridge of every group, each with its own position).
        self.mongodb = mongodb_pool(reactor, cfg)  # None unless the config uses MongoDB
        self.bridges = store_bridges(reactor, cfg, self.state, local_store, self.mongodb)
        self.metrics = RpcMetrics()
        self.dispatcher = Dispatcher(reactor, self.metrics)
        self.server = StoreServer(self.local, reactor)
        self.server.register(self.dispatcher)
        local_store.add_claim_listener(self.server.session_claimed)  # takeovers reach the old holder
        settings = RpcSettings(cluster.call_timeout, cluster.heartbeat_interval, cluster.max_frame_bytes,
                               cluster.secret)
        hello = Hello(cluster.cluster_id, cluster.node_id, "broker", RPC_VERSION)
        health = health_probe(cfg)
        self.rpc = RpcServerFactory(hello, settings, reactor, self.dispatcher, health=health)
        self.rpc.on_lost(self.server.connection_lost)
        # the sessions of a proxy lost for a lease (or evicted) are this group's: wills, expiry, claims
        self.claims = local_store.session_claims
        self.keeper = SessionKeeper(self.local, local_store.session_claims, SessionStore(self.state.session_log),
                                    cluster.group, reactor, cfg.discovery.lease, cfg.discovery.wheel_tick, homed_here(cluster),
                                    start_grace=MAX_RETRY_DELAY)
        self.rpc.on_opened(lambda p: p.peer.role == "proxy" and self.keeper.member_up(p.peer.node_id, p.peer.boot))
        self.rpc.on_closed(lambda p: p.peer.role == "proxy" and self.keeper.member_down(p.peer.node_id))
        collectors = [self.metrics] + ([BridgeCollector(self.bridges.rows)] if self.bridges is not None else [])
        api = AdminAPI(served_by(routes(), "broker"), BrokerHandlers(cluster.node_id, self._epoch), cfg.admin.token)
        site = store_site(self.state.store, collectors, self._extra_stats, api)
        self.listeners = []
        for listener in cfg.listeners:
            factory = {"rpc": self.rpc, "ha": self.replication.master.factory}.get(listener.key, site)
            self.listeners.append(ListenerService(listener, endpoints.serverFromString(reactor, listener.description),
                                                  factory))
        self.agent = member_agent(reactor, cfg, "broker", self.listeners, health)  # None: static membership
        if self.agent is not None:
            # an evicted proxy is lost; only a writable broker (not a slave) takes its sessions over
            self.agent.on_metadata(lambda m: None if self.state.store.replica_of else self.keeper.metadata(m))
            self.agent.on_metadata(self._follow_slots)
        self.replica_agent = self._replica_agent(settings)  # None: the config decides the role
        if self.replica_agent is not None and self.agent is not None:  # pushed role changes, besides the beat's
            self.agent.on_metadata(self.replica_agent.follow_metadata)

    def _follow_slots(self, metadata: dict) -> None:
        # which sessions the keeper may end as their home group's: by the slot table in force, not the config's
        homed = homed_by_metadata(metadata, self.cfg.cluster.group)
        if homed is not None:
            self.keeper.homed = homed

    def _replica_agent(self, settings: RpcSettings) -> ReplicaAgent | None:
        """With controllers and an ha listener, the controllers decide this broker's role (RIP-44)."""
        cluster = self.cfg.cluster
        ha = [svc for svc in self.listeners if svc.listener.key == "ha"]
        if not cluster.controllers or not ha:
            return None
        # Nothing writes before the controllers named the master: a relaunched old master may be a slave now.
        self.state.store.replica_of = cluster.ha_master or "the master the controllers name"
        hello = Hello(cluster.cluster_id, cluster.node_id, "broker", RPC_VERSION)
        peers = [PeerClient(f"controller-{i + 1}", endpoints.clientFromString(self.reactor, endpoint), hello,
                            settings, self.reactor) for i, endpoint in enumerate(cluster.controllers)]

        def ha_address() -> str:
            advertised = cluster.advertise.get("ha")
            if advertised:
                return advertised
            bound = next((address(svc.port) for svc in ha if getattr(svc, "port", None)), "")
            return f"tcp:{bound}" if bound and not bound.startswith("/") else (f"unix:{bound}" if bound else "")

        return ReplicaAgent(self.replication, self.reactor, peers, cluster.group, cluster.node_id, ha_address,
                            lambda: self._may_master)

    def _extra_stats(self):
        native = self.state.native
        return [("ha", self._ha_stats()), ("native", native.stats()), ("timer", self.state.timers.stats()),
                ("rpc", {"watches": self.server.watches, "filters": self.server.filters,
                         "session_filters": self.local.held}),
                ("session_keeper", self.keeper.stats()),
                *([("mongodb", self.mongodb.stats())] if self.mongodb is not None else [])]

    def _ha_stats(self) -> dict[str, float]:
        cl = self.state.store.commit_log
        last = self.state.store.epochs.last
        stats = {"max_offset": cl.max_offset, "epoch": last.epoch if last else 0}
        if self.replica_agent is not None:
            stats["role_switches"] = self.replica_agent.switches
        slave, master = self.replication.slave, self.replication.master
        if slave is not None:
            stats.update(slave=1, confirm_offset=slave.confirm_offset, transferring=int(slave.transferring))
        elif master.running:
            stats.update(slave=0, confirm_offset=master.update_confirm(), sync_state_set=len(master.sync.members),
                         sync_state_set_epoch=master.sync.epoch, slaves=len(master.connections))
        return stats

    def _epoch(self) -> dict:
        """``GET cluster/brokers/{this}/epoch``: the epoch file's entries, the role, the log end, the confirm offset."""
        store = self.state.store
        slave, master = self.replication.slave, self.replication.master
        role, confirm = ("slave", slave.confirm_offset) if slave is not None else \
            ("master", master.update_confirm()) if master.running else ("none", None)
        return {"broker": self.cfg.cluster.node_id, "group": self.cfg.cluster.group, "role": role,
                "max_offset": store.commit_log.max_offset, "confirm_offset": confirm,
                "epochs": [{"epoch": e.epoch, "start_offset": e.start_offset} for e in store.epochs.entries]}

    def _role_changed(self, role: str) -> None:
        # A slave delivers no timers: its master does, and a record of its own would fork its log. Its timers
        # follow the log (store.timer_service): promoted, it delivers exactly those whose delivery it lacks.
        if role == "master":
            # Before the first write it accepts: subscriptions stored while it was a slave came as records, and the
            # filters the old master indexed for are held until the proxies take their interest again.
            self.claims.reload()  # the claims and epoch mark replication wrote, before any claim or write
            self.state.native.engine.reload()  # the consumer cursors and in-flight entries, likewise
            self.interest.became_master()
            self.local.restore()
            self.keeper.restart()  # the group's held sessions: wills and expiry from their stored due times
            self.state.timers.start()
        else:
            self.keeper.stop()  # a slave ends no session and publishes no will: its master does
            self.state.timers.pause()

    def start_replication(self) -> defer.Deferred | None:
        """After recovery: a slave starts replicating; a master with ha listeners begins its next epoch."""
        cluster = self.cfg.cluster
        if self.replica_agent is not None:  # registers and takes the role the controllers answer
            return self.replica_agent.start()
        if cluster.ha_master:
            return self.replication.become_slave(cluster.ha_master)
        if any(listener.key == "ha" for listener in self.cfg.listeners):
            return self.replication.become_master()
        self.interest.became_master()  # no replication: restarted, it waits for the proxies' interest the same way
        return None


    def stop_replication(self) -> defer.Deferred:
        stops = [self.replication.stop()]
        if self.replica_agent is not None:
            stops.append(self.replica_agent.stop())
        return defer.gatherResults(stops)


def broker_tree(parts: BrokerParts) -> RoleService:
    """The broker's service tree: the store half, then the listeners, then the ready line."""
    cfg = parts.cfg
    root = RoleService("broker", parts.reactor, START_ERRORS, cfg.log.file)

    def announce():
        log.info("broker_ready version=%s node_id=%s group=%s cluster=%s config=%s data_dir=%s", twistmq_version(),
                 cfg.cluster.node_id, cfg.cluster.group, cfg.cluster.cluster_id, cfg.source, cfg.node.data_dir)

    children = [
        # systemctl reload sends SIGHUP, whose default action ends the process: a broker has no password file,
        # ACL or certificate to re-read, so it only says it heard.
        SignalService("reload", signal.SIGHUP, lambda: log.info("reload_ok role=broker files=none"), parts.reactor),
        *([parts.mongodb] if parts.mongodb is not None else []),
        *parts.state.tree_parts(),
        Part("session-interest", start=parts.local.restore, stop=parts.interest.stop),
        *bridge_parts(parts.bridges),
        Part("session-keeper", start=parts.keeper.start, stop=parts.keeper.stop),  # before proxies connect
        *[svc for svc in parts.listeners if svc.listener.key == "ha"],
        # After the ha listeners: one refuses slaves until this broker serves as master; a slave's store refuses
        # writes from the start. Its timers only follow on a slave, whose master delivers. With controllers it
        # fires once they named the role: only then do the RPC and HTTP listeners open, so a proxy that dials a
        # restarted broker never re-takes its watches and filters while the broker does not know what it is.
        Part("replication", start=parts.start_replication, stop=parts.stop_replication),
        *[svc for svc in parts.listeners if svc.listener.key != "ha"],
        Part("rpc-goodbye", stop=parts.rpc.stop),  # stops before the listeners close: peers hear why
        *([parts.agent] if parts.agent is not None else []),  # registers once the listeners are bound
        Part("collector", start=parts.state.collector.start, stop=parts.state.collector.stop),  # after recovery
        ReadyLine(parts.listeners, announce),
    ]
    for child in children:
        child.setServiceParent(root)
    return root


def build_broker(options: BrokerOptions, reactor) -> RoleService:
    """Build the broker from its options; a bad config or a locked data dir raises one of START_ERRORS."""
    cfg = broker_config(options)
    observer = node_log.configure(cfg.log)
    root = broker_tree(BrokerParts(reactor, cfg))
    root.log_observer = observer
    return root
