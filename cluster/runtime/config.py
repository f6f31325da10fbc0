"""The node-wide config (``[node]``, ``[log]``), and reading a TOML file (or none: the built-in defaults)
into every package's config dataclasses, settled for a node.

Which file, as Mosquitto looks for its own (``find_config``): ``--config FILE``, else
``$TWISTMQ_CONFIG``, else ``/etc/twistmq/twistmq.toml`` when it exists, else no file at all:
the dataclasses' defaults, which are the one source of truth (``conf/twistmq.toml`` is
generated from them and only documents them). An unset ``data_dir`` becomes
``/var/lib/twistmq/ROLE`` (``with_data_dir``).

Each section maps to one dataclass; an unknown section or key, or a value of
the wrong type, is a ConfigError that names it, so the node can exit with one
line instead of starting half-configured.

Paths: relative paths in the file (``data_dir``, ``mqtt_tls_ca``,
``password_file``, ``acl_file``, ``log.file``, the files inside ``ssl:``
listeners) start at the file's directory; command-line values start at the
working directory. ``settle`` makes every path absolute, checks that the files
exist (the message names the key and the path it looked at), parses the
listeners and applies the exposure rule of ``cluster.runtime.listeners``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass

from cluster.admin.config import AdminConfig
from cluster.bridges.config import BridgeConfig, bridge_values
from cluster.controller.config import ControllerConfig
from cluster.discovery.config import DiscoveryConfig
from cluster.mongodb.config import MongoConfig, check_usable
from cluster.runtime.listeners import (
    FLAGS,
    Listener,
    check_exposure,
    parse_listener,
    resolve_path,
)
from mqtt_proxy.auth.config import AuthConfig, MongoAuthConfig
from mqtt_proxy.config import LimitsConfig, MQTTConfig
from store.config import ConfigError, StoreConfig, from_mapping


@dataclass(frozen=True)
class NodeConfig:
    """The ``[node]`` section: where the node keeps its data and what it listens on."""

    data_dir: str = ""
    """Data directory (commit log, indexes, sessions); a relative path starts at the config file's directory. Empty: /var/lib/twistmq/ROLE (node, broker), made if missing; where it cannot be made the role stops and asks for --data-dir."""
    mqtt: tuple[str, ...] = ("tcp:1883:interface=127.0.0.1",)
    """MQTT over TCP listeners, as Twisted endpoint descriptions (``tcp:PORT:interface=ADDRESS``; without ``interface=`` a listener faces every interface, see allow_anonymous)."""
    mqtt_tls: tuple[str, ...] = ()
    """MQTT over TLS listeners (``ssl:8883:privateKey=KEY:certKey=CERT``); relative file names in ssl: listeners of this file start at its directory."""
    mqtt_tls_ca: str = ""
    """CA file: when set, TLS clients must present a certificate it signed. A relative path starts at the config file's directory."""
    mqtt_ws: tuple[str, ...] = ()
    """MQTT over WebSocket listeners (``tcp:`` plain, ``ssl:`` secure)."""
    ws_path: str = "/mqtt"
    """URL path of the WebSocket endpoint."""
    use_identity_as_username: bool = False
    """With mutual TLS, the client certificate's CN (or first SAN) becomes the username."""
    native: tuple[str, ...] = ()
    """Native JSON protocol over TCP listeners."""
    native_udp: tuple[str, ...] = ()
    """Native JSON protocol over UDP, as ``[HOST:]PORT``."""
    http: tuple[str, ...] = ("tcp:8080:interface=127.0.0.1",)
    """HTTP listeners: /health and /metrics (without authentication), the admin API and the dashboard (see [admin]). One reachable from other hosts must name its interface (``interface=0.0.0.0`` for all): a bare ``tcp:8080`` is refused."""


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class LogConfig:
    """The ``[log]`` section: where the node's log goes and how much of it."""

    level: str = "INFO"
    """Lowest level written: DEBUG, INFO, WARNING, ERROR or CRITICAL (WARNING drops connect, disconnect and other routine lines)."""
    file: str = ""
    """Log file, appended to and reopened when moved (logrotate); empty: standard error. A relative path starts at the config file's directory."""
    connection_messages: bool = True
    """Log each client's connect and disconnect at INFO (client_connected, client_disconnected, mqtt.auth.ok), as Mosquitto's connection_messages. Refused connects are logged either way."""

    def validate(self) -> None:
        if self.level.upper() not in LOG_LEVELS:
            raise ConfigError(f"level must be one of {', '.join(LOG_LEVELS)}, not {self.level!r}")


CLIENT_ENDPOINT_TYPES = ("tcp:", "tcp6:", "unix:", "ssl:", "tls:")
"""Client endpoint strings RPC dials: plain, or TLS (``tls:HOST:PORT:trustRoots=DIR`` checks the host name,
``ssl:host=H:port=P:caCertsDir=DIR`` only the chain)."""


def is_client_endpoint(text: str) -> bool:
    """A client endpoint description of a kind RPC dials, with something after its type."""
    kind, _, rest = text.partition(":")
    return f"{kind}:" in CLIENT_ENDPOINT_TYPES and ":" in rest or (kind == "unix" and bool(rest))


@dataclass(frozen=True)
class MemberConfig:
    """One ``[[cluster.members]]`` table: a member of the static membership."""

    id: str
    """The member's node id (its ``cluster.node_id``)."""
    role: str
    """broker or proxy."""
    rpc: str = ""
    """How to reach its RPC listener: a Twisted client endpoint string, e.g. tcp:127.0.0.1:7800 (brokers), or tls:HOST:PORT:trustRoots=DIR for an ssl: listener."""
    group: str = ""
    """Its broker group (brokers only)."""

    def validate(self) -> None:
        if not self.id:
            raise ConfigError("id must not be empty")
        if self.role not in ("broker", "proxy"):
            raise ConfigError(f"role must be broker or proxy, not {self.role!r}")
        if self.role == "broker" and not self.group:
            raise ConfigError(f"group must be set for broker {self.id!r}")
        if (self.rpc or self.role == "broker") and not is_client_endpoint(self.rpc):
            raise ConfigError(f"rpc must be a client endpoint like tcp:127.0.0.1:7800 (or tls:HOST:PORT:trustRoots=DIR "
                              f"for an ssl: listener), not {self.rpc!r}")


@dataclass(frozen=True)
class ClusterConfig:
    """The ``[cluster]`` section: who this process is in a cluster of proxies and brokers, and how they talk (RPC)."""

    cluster_id: str = "twistmq"
    """Cluster name, checked in every RPC handshake: a node of another cluster is refused."""
    node_id: str = ""
    """This process's member id, kept across restarts; empty: the name of the data directory given by --data-dir or node.data_dir, else the host name."""
    zone: str = ""
    """This process's zone (data centre, cloud region), listed in its member record; its number (0-15: the sum of the name's UTF-8 bytes mod 16, so the same in every process) is the 4-bit zone field of the snowflake ids it makes. Worker ids are leased cluster-wide, so two zones sharing a number never share an id."""
    group: str = "g1"
    """The broker group a broker serves (every queue position it hands out names it)."""
    rpc: tuple[str, ...] = ("tcp:7800:interface=127.0.0.1",)
    """A broker's RPC listeners (``--rpc``), as Twisted endpoint descriptions (``ssl:`` for TLS). Off loopback, [cluster] secret is required: members prove it in the handshake."""
    call_timeout: float = 5.0
    """Seconds an RPC call (and a handshake) may take before it fails with Unavailable."""
    heartbeat_interval: float = 1.0
    """Seconds between RPC heartbeats (carrying the health flag); a peer silent for three intervals is dropped."""
    max_frame_bytes: int = 16 << 20
    """Largest RPC frame accepted; a bigger one closes the connection."""
    max_load_per_core: float = 4.0
    """Health flag (Turms' isHealthy, sent in RPC and controller heartbeats): unhealthy while the 1-minute load average per core is above this. Peers send calls without a fixed target elsewhere; cluster/members shows healthy false."""
    min_free_memory: float = 0.05
    """Health flag: unhealthy while less than this fraction of memory is available (MemAvailable / MemTotal, 0-1)."""
    slots: dict = dataclasses.field(default_factory=dict)
    """Hash slots (0-1023) of each broker group, as ``group = "0-511,700"``; empty: even contiguous ranges in group-name order. Every slot must be assigned once."""
    routes: dict = dataclasses.field(default_factory=dict)
    """Explicit routes: a first topic level to the group that stores it (``sensors = "g2"``); they win over the slots."""
    group_numbers: dict = dataclasses.field(default_factory=dict)
    """The number of each broker group in native msg_ids (0-32767, above its 48-bit commit-log offset), as ``g2 = 1``; groups not listed take the lowest free numbers in group-name order. Group 0's msg_ids are plain offsets. Pin the numbers before adding a group whose name sorts before an existing one: a group's number must never change while its ids are in use."""
    secret: str = ""
    """The cluster's shared secret: the key of the RPC handshake's mutual HMAC-SHA256 challenge (a member with another secret, or none, is refused and both ends log it) and the password of the controllers' Raft traffic (pysyncobj encrypts and authenticates with it). Required as soon as an RPC listener or a controller's raft address is not on loopback; the same on every member (a rolling change is not possible). It proves who connects, not the bytes after: use ssl: RPC endpoints across untrusted networks."""
    controllers: tuple[str, ...] = ()
    """The controllers' RPC addresses, as client endpoint strings (``tcp:127.0.0.1:7910``, or ``tls:HOST:PORT:trustRoots=DIR`` for an ssl: listener). When set, brokers and proxies register with them, heartbeat every [discovery] heartbeat_interval and learn the metadata (listed in the controllers' cluster/members, evicted when silent for a lease); a proxy then routes by the controllers' slots, routes and broker addresses (pushed, and polled with each heartbeat): the brokers listed here are where it starts, and on their first start the controllers take slots and routes from this file, afterwards theirs win. The admin role needs them. Empty: the static membership below only."""
    advertise_rpc: str = ""
    """The RPC address members are told to dial (a client endpoint string), when it differs from the one bound (NAT, a relay); empty: the first RPC listener's bound address."""
    advertise: dict = dataclasses.field(default_factory=dict)
    """Client-facing addresses listed in this process's member record instead of the ones it binds, by listener kind (``mqtt = "tcp:mqtt.example.com:1883"``; kinds: mqtt, mqtt_tls, mqtt_ws, native, native_udp, http), for a load balancer, NAT or relay in front of it; a kind not listed shows its bound address. The RPC address is advertise_rpc."""
    ha: tuple[str, ...] = ()
    """A broker's replication listeners (``--ha``), as Twisted endpoint descriptions (``ssl:`` works): while it is its group's master, the group's slaves connect here and both ends prove ``secret`` to each other (HMAC-SHA256). Empty: no replication. A listener off loopback needs ``secret``."""
    ha_master: str = ""
    """The master a broker replicates from (``--ha-master``), as a client endpoint string (``tcp:127.0.0.1:7850``, or ``tls:HOST:PORT:trustRoots=DIR`` for an ``ssl:`` listener). Empty: the broker is its group's master and begins a new epoch at each start. A slave refuses client writes. With ``controllers`` (and an ``ha`` listener) the controllers decide the role instead: the broker registers before it serves, and this key only says, on its first start (no epoch yet), that it may not master an empty group; a killed master relaunched with it empty comes back as a slave of the master elected meanwhile."""
    ha_max_time_slave_not_catchup: float = 15.0
    """Seconds a slave may stay behind its master before the master drops it from the SyncStateSet (RocketMQ's haMaxTimeSlaveNotCatchup); a disconnected slave is dropped at once."""
    ha_async_learner: bool = False
    """A slave that replicates but never joins the SyncStateSet (RocketMQ's asyncLearner): the confirm offset never waits for it and it is never elected master (a copy in another data centre)."""
    members: tuple = ()
    """The static membership, as ``[[cluster.members]]`` tables with ``id``, ``role`` (broker or proxy), ``group`` (brokers) and ``rpc`` (a client endpoint string like tcp:127.0.0.1:7800)."""

    def validate(self) -> None:
        if not self.cluster_id:
            raise ConfigError("cluster_id must not be empty")
        if not self.group:
            raise ConfigError("group must not be empty")
        if self.zone != self.zone.strip() or len(self.zone) > 64:
            raise ConfigError(f"zone must be a name of at most 64 characters without surrounding spaces, not {self.zone!r}")
        for key in ("call_timeout", "heartbeat_interval"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, not {getattr(self, key)!r}")
        if self.secret != self.secret.strip() or any(ch in self.secret for ch in "\r\n"):
            raise ConfigError("secret must not have surrounding spaces or line breaks")
        if self.max_load_per_core < 0:
            raise ConfigError(f"max_load_per_core must not be negative, not {self.max_load_per_core!r}")
        if not 0 <= self.min_free_memory <= 1:
            raise ConfigError(f"min_free_memory must be a fraction from 0 to 1, not {self.min_free_memory!r}")
        if self.ha_max_time_slave_not_catchup <= 0:
            raise ConfigError("ha_max_time_slave_not_catchup must be positive, not "
                              f"{self.ha_max_time_slave_not_catchup!r}")
        if self.ha_master and (not self.ha_master.startswith(("tcp:", "tcp6:", "ssl:", "tls:", "unix:"))
                               or ":" not in self.ha_master[4:]):
            raise ConfigError(f"ha_master must be a client endpoint like tcp:127.0.0.1:7850, not {self.ha_master!r}")
        if self.max_frame_bytes < 1024:
            raise ConfigError(f"max_frame_bytes must be at least 1024, not {self.max_frame_bytes!r}")
        for endpoint in (*self.controllers, *((self.advertise_rpc,) if self.advertise_rpc else ())):
            if not is_client_endpoint(endpoint):
                key = "controllers" if endpoint in self.controllers else "advertise_rpc"
                raise ConfigError(f"{key} must be client endpoints like tcp:127.0.0.1:7910, not {endpoint!r}")
        if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in self.advertise.items()):
            raise ConfigError("advertise maps listener kinds to addresses (advertise.mqtt = \"tcp:host:1883\")")
        if "rpc" in self.advertise:
            raise ConfigError("advertise.rpc: the RPC address members dial is advertise_rpc")
        ids = [m.id for m in self.members]
        if len(set(ids)) != len(ids):
            raise ConfigError("members: a member id is listed twice")
        for name, table in (("slots", self.slots), ("routes", self.routes)):
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
                raise ConfigError(f"{name} maps names to strings ({name}.g1 = \"...\")")
        try:
            self.slot_assignment()
        except ValueError as exc:
            raise ConfigError(f"slots: {exc}") from None
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                   for k, v in self.group_numbers.items()):
            raise ConfigError("group_numbers maps broker groups to integers (group_numbers.g2 = 1)")
        numbers = list(self.group_numbers.values())
        if len(set(numbers)) != len(numbers):
            raise ConfigError("group_numbers gives two groups the same number")
        if any(not 0 <= n <= 32767 for n in numbers):
            raise ConfigError(f"group_numbers must be 0-32767, not {[n for n in numbers if not 0 <= n <= 32767][0]}")

    def slot_assignment(self) -> dict:
        """``slots`` parsed into ranges per group (empty: the default even split)."""
        from cluster.routing import (
            parse_ranges,  # routing is pure; imported here to keep config light
        )
        return {group: parse_ranges(text) for group, text in self.slots.items()}


def _cluster_values(values: dict) -> dict:
    """``[cluster]`` as read, its ``members`` array of tables built into ``MemberConfig``s (naming a bad one)."""
    values = dict(values)
    for key in ("rpc", "controllers", "ha"):
        if isinstance(values.get(key), str):
            values[key] = (values[key],)
        elif isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    members = values.get("members", [])
    if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
        raise ConfigError("config key cluster.members must be an array of tables ([[cluster.members]])")
    values["members"] = tuple(from_mapping(MemberConfig, f"cluster.members[{i}]", m) for i, m in enumerate(members))
    return values


CONFIG_ENV = "TWISTMQ_CONFIG"
SYSTEM_CONFIG = "/etc/twistmq/twistmq.toml"
CONFIG_HELP = f"TOML config file (default: ${CONFIG_ENV}, else {SYSTEM_CONFIG} if it exists, else built-in defaults)"
DATA_ROOT = "/var/lib/twistmq"
"""Where an unset ``data_dir`` goes: one directory per role, as the systemd unit's StateDirectory."""


def find_config(flag: str | None, environ=os.environ, system_path: str = SYSTEM_CONFIG) -> str | None:
    """The config file to read: ``--config``, else ``$TWISTMQ_CONFIG``, else *system_path* when it exists;
    None: no file, the built-in defaults."""
    if flag:
        return flag
    if environ.get(CONFIG_ENV):
        return environ[CONFIG_ENV]
    return system_path if os.path.exists(system_path) else None


@dataclass(frozen=True)
class Config:
    """Every section of the node's configuration."""

    node: NodeConfig
    store: StoreConfig
    mqtt: MQTTConfig
    limits: LimitsConfig
    native: dict  # raw [native] section: the native package builds its own dataclass from it
    base_dir: str  # directory of the config file: relative paths start here
    log: LogConfig = LogConfig()
    cluster: ClusterConfig = ClusterConfig()
    path: str = ""  # the config file itself, for messages; empty: none was read (the built-in defaults)
    listeners: tuple[Listener, ...] = ()  # filled by settle(): every listener, checked, in opening order
    admin: AdminConfig = AdminConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    controller: ControllerConfig = ControllerConfig()
    mongodb: MongoConfig = MongoConfig()
    auth: AuthConfig = AuthConfig()
    auth_mongodb: MongoAuthConfig = MongoAuthConfig()
    bridge: BridgeConfig = BridgeConfig()

    @property
    def source(self) -> str:
        """What the settings came from, for the ready log line: the file's path, or ``defaults``."""
        return self.path or "defaults"


SECTIONS = {"node": NodeConfig, "store": StoreConfig, "mqtt": MQTTConfig, "limits": LimitsConfig,
            "log": LogConfig, "cluster": ClusterConfig, "admin": AdminConfig, "discovery": DiscoveryConfig,
            "controller": ControllerConfig, "auth": AuthConfig, "auth.mongodb": MongoAuthConfig,
            "mongodb": MongoConfig, "bridge": BridgeConfig}
"""Section name to dataclass, in the documented file's order; ``auth.mongodb`` is the ``[auth.mongodb]`` table."""

_FILE_KEYS = (("node", "mqtt_tls_ca"), ("mqtt", "password_file"), ("mqtt", "acl_file"), ("log", "file"))
"""(section, key) of every setting that names a file; each must exist except the log file."""


def load_config(path: str | None) -> Config:
    """Parse and check the TOML file at ``path``; None: no file, every key at its default."""
    if path is None:
        return _build({}, "", os.getcwd())
    path = os.path.abspath(path)
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory") from None
    except PermissionError:
        raise ConfigError(f"config file {path} is not readable (permission denied)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for section in raw:
        if section not in SECTIONS and section != "native":
            raise ConfigError(f"unknown config section [{section}] in {path}")
        if not isinstance(raw[section], dict):
            raise ConfigError(f"config key {section} must be a [section]")
    return _build(raw, path, os.path.dirname(path))


def _build(raw: dict, path: str, base_dir: str) -> Config:
    """The dataclasses from the parsed file (*raw*); relative paths of the file start at *base_dir*."""
    built = {}
    for name, cls in SECTIONS.items():
        values = dict(_section(raw, name))
        if name == "node":
            for key, value in values.items():
                if isinstance(value, str) and key not in ("data_dir", "mqtt_tls_ca", "ws_path"):
                    values[key] = (value,)  # one listener may be written as a plain string
                elif isinstance(value, list):
                    values[key] = tuple(value)
        if name == "cluster":
            values = _cluster_values(values)
        if name == "bridge":
            values = bridge_values(values)
        if name in ("controller", "auth"):  # arrays in TOML, tuples in the frozen dataclass
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
        built[name] = from_mapping(cls, name, values)
    # Relative paths of the file start at its directory, whatever the node's working directory.
    node = built["node"]
    if node.data_dir:
        built["node"] = dataclasses.replace(node, data_dir=resolve_path(node.data_dir, base_dir))
    for section, key in _FILE_KEYS:
        value = getattr(built[section], key)
        if value:
            built[section] = dataclasses.replace(built[section], **{key: resolve_path(value, base_dir)})
    return Config(built["node"], built["store"], built["mqtt"], built["limits"], dict(raw.get("native", {})),
                  base_dir, built["log"], built["cluster"], path, admin=built["admin"],
                  discovery=built["discovery"], controller=built["controller"], mongodb=built["mongodb"],
                  auth=built["auth"], auth_mongodb=built["auth.mongodb"], bridge=built["bridge"])


def _section(raw: dict, name: str) -> dict:
    """The table of section *name* in the parsed file; ``[auth]`` without its ``[auth.mongodb]`` sub-table."""
    if name == "auth.mongodb":
        table = raw.get("auth", {}).get("mongodb", {})
        if not isinstance(table, dict):
            raise ConfigError("config key auth.mongodb must be a [section]")
        return table
    table = raw.get(name, {})
    if name == "auth":
        table = {k: v for k, v in table.items() if k != "mongodb"}
    return table


def with_flags(cfg: Config, node_changes: dict) -> Config:
    """Apply command-line values to ``[node]``; their relative paths start at the working directory."""
    changes = dict(node_changes)
    for key in ("data_dir", "mqtt_tls_ca"):
        if changes.get(key):
            changes[key] = resolve_path(changes[key], None)
    return dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, **changes))


def with_data_dir(cfg: Config, role: str, root: str = DATA_ROOT) -> Config:
    """An unset ``data_dir`` becomes ``root/ROLE``, made if missing; a ConfigError asking for --data-dir
    when it cannot be made (not root, no /var/lib/twistmq of its own)."""
    if cfg.node.data_dir:
        return cfg
    path = os.path.join(root, role)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"no data directory given and {path} cannot be made ({exc.strerror}): "
                          "pass --data-dir DIR or set node.data_dir") from None
    return dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, data_dir=path))


def settle(cfg: Config, from_flags: set[str] = frozenset()) -> Config:
    """Check files and listeners, apply the exposure rule, then fix ``allow_anonymous`` to a bool.

    *from_flags* holds the ``[node]`` keys the command line set, so messages name the flag, not the key.
    """
    for section, key in _FILE_KEYS:
        path = getattr(getattr(cfg, section), key)
        if path and key != "file" and not os.path.isfile(path):
            name = _FLAG_NAMES.get(key) if key in from_flags else f"{section}.{key}"
            state = "is not a file" if os.path.exists(path) else "does not exist"
            raise ConfigError(f"{name}: {path} {state}")
    listeners = []
    for key in FLAGS:
        flag = key in from_flags
        for description in getattr(cfg.node, key):
            listeners.append(parse_listener(key, description, None if flag else cfg.source,
                                            None if flag else cfg.base_dir))
    mqtt = _auth_sources(cfg)
    native_token = cfg.native.get("token", "")  # checked as a string when the native service is built
    check_exposure(listeners, mqtt.allow_anonymous, mqtt.anonymous_allowed, cfg.node.mqtt_tls_ca,
                   native_token=native_token if isinstance(native_token, str) else "")
    # From here on allow_anonymous is what it means, so every consumer reads a plain bool.
    mqtt = dataclasses.replace(mqtt, allow_anonymous=mqtt.anonymous_allowed)
    node = cfg.node
    for key in FLAGS:
        node = dataclasses.replace(node, **{key: tuple(l.description for l in listeners if l.key == key)})
    return dataclasses.replace(cfg, mqtt=mqtt, node=node, listeners=tuple(listeners))


def _auth_sources(cfg: Config) -> MQTTConfig:
    """Check ``[auth] backends`` against the files and MongoDB; return ``[mqtt]`` with ``allow_anonymous``
    defaulted to false when a source besides the password file authenticates clients."""
    mqtt, auth = cfg.mqtt, cfg.auth
    if "file" not in auth.backends:
        for key in ("password_file", "acl_file"):
            if getattr(mqtt, key):
                raise ConfigError(f'mqtt.{key} is set but auth.backends does not name "file"')
    if auth.mongodb:
        check_usable(cfg.mongodb, "auth.backends")
        if mqtt.allow_anonymous is None:
            mqtt = dataclasses.replace(mqtt, allow_anonymous=False)
    return mqtt


_FLAG_NAMES = {"mqtt_tls_ca": "--mqtt-tls-ca", "data_dir": "--data-dir"}
