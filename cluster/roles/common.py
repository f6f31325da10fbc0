"""What the roles share: the options and listeners of the roles that serve clients, member ids, and bridges.

``node`` and ``proxy`` terminate clients: the same listener flags, the same
config settling, the same MQTT/native/HTTP listeners and the same SIGHUP
reload; ``node`` and ``broker`` hold a store, and run its bridges
(``store_bridges``). No role module imports another; they meet here.
"""

from __future__ import annotations

import os
import secrets
import socket

from twisted.internet import endpoints
from twisted.python import usage

from cluster.bridges.service import Bridges, bridges_directory
from cluster.discovery.agent import MemberAgent
from cluster.discovery.members import MemberRecord
from cluster.mongodb.client import MongoPool
from cluster.mongodb.config import check_usable
from cluster.rpc.dispatch import Dispatcher
from cluster.rpc.frames import RPC_VERSION, Hello
from cluster.rpc.health import HealthLimits, HealthProbe
from cluster.rpc.metrics import RpcMetrics
from cluster.rpc.peer import PeerClient
from cluster.rpc.protocol import RpcSettings
from cluster.rpc.server import RpcServerFactory
from cluster.runtime.config import CONFIG_HELP, find_config, load_config, settle, with_data_dir, with_flags
from cluster.runtime.services import Part, address
from cluster.runtime.listeners import check_cluster_exposure, parse_listener
from cluster.runtime.reuseport import server_endpoint
from cluster.runtime.services import DatagramListenerService, ListenerService
from cluster.runtime.version import print_version, twistmq_version
from mqtt_proxy import tls
from mqtt_proxy.auth.acl import load_acl
from mqtt_proxy.auth.authenticator import Authenticator
from mqtt_proxy.auth.chain import ChainACL, FileSource, MongoSource, PasswordChain
from mqtt_proxy.auth.mongodb import MongoUserSource
from mqtt_proxy.auth.passwords import PasswordFile
from mqtt_proxy.auth.reload import Reloader, security_targets
from mqtt_proxy.protocol import MQTTServerFactory
from mqtt_proxy.websocket import websocket_factory
from store.config import ConfigError
from store.executor import ThreadPoolExecutor

LISTEN_BACKLOG = 4096
LISTENER_FLAGS = ("mqtt", "mqtt-tls", "mqtt-ws", "native", "native-udp", "http")


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
    """The config file with the command line applied on top, checked (see ``cluster.runtime.config.settle``).

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


def mongodb_pool(reactor, cfg) -> MongoPool | None:
    """The process's one MongoDB client when something in the config uses MongoDB ([auth] backends, the
    bridges), else None."""
    return MongoPool(reactor, cfg.mongodb) if cfg.auth.mongodb or cfg.bridge.mongodb else None


class ClientSecurity:
    """The services behind authentication: the password-check pool, and MongoDB's cached users and rules."""

    def __init__(self, executor, pool: MongoPool | None = None, users: MongoUserSource | None = None) -> None:
        self.executor = executor
        self.pool = pool
        self.users = users

    def start(self) -> None:
        self.executor.start()
        if self.users is not None:
            self.users.start()
            self.pool.watch((self.users.collection, self.users.acl_collection), self.users.changed,
                            self.users.restarted)

    def stop(self) -> None:
        if self.users is not None:
            self.users.stop()
        self.executor.stop()


def client_security(reactor, cfg, mongodb: MongoPool | None = None):
    """``(ClientSecurity, Authenticator, ACL)`` of a role that serves clients, from ``[mqtt]``, ``[node]`` and
    ``[auth]``; *mongodb* is the process's MongoDB client (``mongodb_pool``) when ``[auth] backends`` names it.

    scrypt runs on its own small pool so password checks never queue behind fsyncs.
    """
    mqtt, chain_config = cfg.mqtt, cfg.auth
    executor = ThreadPoolExecutor(reactor, max_threads=2, name="twistmq-auth")
    passwords = PasswordFile.load(mqtt.password_file) if mqtt.password_file else None
    acl = load_acl(mqtt.acl_file or None, client_ids_bound=mqtt.use_username_as_clientid)
    users = chain = None
    if chain_config.mongodb:
        section = cfg.auth_mongodb
        users = MongoUserSource(mongodb.call, reactor, section.collection, section.acl_collection,
                                section.cache_ttl)
        acl = ChainACL(acl if acl.configured else None, users, nomatch=chain_config.acl_nomatch == "allow")
    elif chain_config.acl_nomatch == "allow":
        acl = ChainACL(acl if acl.configured else None, None, nomatch=True)
    auth = None
    if chain_config.mongodb:
        sources = [FileSource(lambda: auth.password_file, executor) if name == "file"
                   else MongoSource(users, executor) for name in chain_config.backends]
        chain = PasswordChain(sources, executor)
    auth = Authenticator(passwords, allow_anonymous=mqtt.allow_anonymous, clock=reactor, executor=executor,
                         use_identity_as_username=cfg.node.use_identity_as_username,
                         base_delay=mqtt.auth_fail_delay, max_delay=mqtt.auth_fail_delay_max,
                         address_limit=mqtt.auth_fail_address_limit, forget_after=mqtt.auth_fail_window,
                         chain=chain, acl_loader=acl.load if users is not None else None,
                         log_ok=cfg.log.connection_messages)
    return ClientSecurity(executor, mongodb, users), auth, acl


def security_reloader(front, streams) -> Reloader:
    """SIGHUP's work: re-read the password file, the ACL and the TLS listeners' certificates."""
    contexts = [(svc.listener.key.replace("_", "-"), svc.endpoint.context_factory)
                for svc in streams if isinstance(svc.endpoint, tls.TLSServerEndpoint)]
    acl = getattr(front.acl, "file_acl", front.acl)  # a chain's file part is what SIGHUP re-reads
    return Reloader(security_targets(front.auth.password_file, acl, contexts))


def _backlog(description: str) -> str:
    """Twisted listens with a backlog of 50: a burst of device reconnects overflows it and each
    dropped SYN costs the device a one-second retry, so MQTT listeners ask for more unless told."""
    if description.split(":", 1)[0] in ("tcp", "ssl") and "backlog=" not in description:
        return description + ":backlog=" + str(LISTEN_BACKLOG)
    return description


def rpc_and_http_listeners(cfg, role: str, rpc: list[str], http: list[str], flags: bool, example: str) -> tuple:
    """The listeners of a role served over RPC (``broker``, ``controller``), checked: RPC first, then HTTP (which
    must name its interface); at least one RPC listener, and off loopback only with ``[cluster] secret``.
    *flags*: they came from the command line."""
    listeners = []
    for key, descriptions in (("rpc", rpc), ("http", http)):
        for description in descriptions:
            listener = parse_listener(key, description, None if flags else cfg.source, None if flags else cfg.base_dir)
            if key == "http" and not listener.interface and listener.kind != "unix":
                raise ConfigError(f"{listener.where}: an HTTP listener must name its interface "
                                  "(interface=127.0.0.1, or interface=0.0.0.0 for all)")
            listeners.append(listener)
    if not any(listener.key == "rpc" for listener in listeners):
        raise ConfigError(f"a {role} needs an RPC listener: for example --rpc {example}")
    check_cluster_exposure(listeners, cfg.cluster.secret)
    return tuple(listeners)


def rpc_server_listeners(reactor, cfg, descriptions, node_type: str, health, register) -> list[ListenerService]:
    """RPC listeners (``--rpc``) of a role that answers calls besides a broker's: ``register(dispatcher)`` adds
    them (a proxy's admin calls)."""
    if not descriptions:
        return []
    cluster = cfg.cluster
    dispatcher = Dispatcher(reactor, RpcMetrics())
    register(dispatcher)
    settings = RpcSettings(cluster.call_timeout, cluster.heartbeat_interval, cluster.max_frame_bytes,
                           cluster.secret)
    factory = RpcServerFactory(Hello(cluster.cluster_id, cluster.node_id, node_type, RPC_VERSION), settings, reactor,
                               dispatcher, health=health)
    listeners = [parse_listener("rpc", description, None, None) for description in descriptions]
    check_cluster_exposure(listeners, cluster.secret)  # it can kick clients and end sessions
    return [ListenerService(listener, endpoints.serverFromString(reactor, listener.description), factory)
            for listener in listeners]


BOOT = secrets.token_hex(8)
"""This process's life: in its member record and in the HELLO of its connections to brokers, so a broker tells
the connections (and the claims) of a member restarted under the same id from those of its evicted old life."""


def default_node_id(data_dir: str) -> str:
    """A member id when none is configured: the data directory's name, else (none, or /) the host name."""
    return (os.path.basename(os.path.normpath(data_dir)) if data_dir else "") or socket.gethostname()


def member_agent(reactor, cfg, node_type: str, listeners, health) -> MemberAgent | None:
    """The agent that registers this broker or proxy with ``[cluster] controllers`` (None when there are none).

    Its record is made at each register from the bound *listeners*: ``rpc_address`` is
    ``[cluster] advertise_rpc`` or the first RPC listener's address, ``addresses`` every other listener's,
    or what ``[cluster] advertise`` says for its kind (a load balancer, NAT or relay in front).
    """
    cluster = cfg.cluster
    if not cluster.controllers:
        return None
    settings = RpcSettings(cluster.call_timeout, cluster.heartbeat_interval, cluster.max_frame_bytes,
                           cluster.secret)
    hello = Hello(cluster.cluster_id, cluster.node_id, node_type, RPC_VERSION)
    controllers = [PeerClient(f"controller-{i + 1}", endpoints.clientFromString(reactor, endpoint), hello, settings,
                              reactor, health=health)
                   for i, endpoint in enumerate(cluster.controllers)]

    def record() -> MemberRecord:
        bound = [(svc.listener.key, address(svc.port)) for svc in listeners if getattr(svc, "port", None)]
        rpc = cluster.advertise_rpc or next((f"tcp:{addr}" for key, addr in bound if key == "rpc"), "")
        return MemberRecord(cluster.cluster_id, cluster.node_id, node_type, zone=cluster.zone,
                            version=twistmq_version(), rpc_address=rpc,
                            addresses={**{key: addr for key, addr in bound if key != "rpc"}, **cluster.advertise},
                            group=cluster.group if node_type == "broker" else "", healthy=bool(health()),
                            boot=BOOT)

    return MemberAgent(reactor, controllers, record, cfg.discovery.heartbeat_interval, health)


def health_probe(cfg) -> HealthProbe:
    """The health flag of this process, with ``[cluster]``'s limits."""
    return HealthProbe(HealthLimits(cfg.cluster.max_load_per_core, cfg.cluster.min_free_memory))


def store_bridges(reactor, cfg, state, store, pool: MongoPool | None) -> Bridges | None:
    """The ``[[bridge.mongodb]]`` bridges of a broker-side role over its ``StoreParts`` *state* and store
    interface *store* (one broker group), inserting through the process's MongoDB *pool* (``mongodb_pool``);
    None without bridges. A bridge without pymongo or a usable ``[mongodb] uri`` is a ConfigError (exit 2).
    Retention keeps what the bridges owe from here on."""
    if not cfg.bridge.mongodb:
        return None
    check_usable(cfg.mongodb, "bridge.mongodb")
    bridges = Bridges(cfg.bridge.mongodb, store, state.index.max_offset, bridges_directory(cfg.node.data_dir),
                      state.executor, pool.call, reactor, cfg.cluster.group)
    state.store.retention.add_holder(bridges.owed)
    return bridges


def bridge_parts(bridges: Bridges | None) -> list:
    """The service-tree child of ``store_bridges``' result: after the store opens (and the MongoDB pool
    starts) and before any listener binds; it stops first, finishing the insert in flight."""
    if bridges is None:
        return []
    return [Part("bridges", start=bridges.start, stop=bridges.stop)]
