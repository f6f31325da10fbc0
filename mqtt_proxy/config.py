"""Configuration of the MQTT front end: the ``[mqtt]`` and ``[limits]`` sections."""

from __future__ import annotations

from dataclasses import dataclass

from store.config import ConfigError


@dataclass(frozen=True)
class MQTTConfig:
    """The ``[mqtt]`` section: protocol behaviour and server-side defaults."""

    max_keep_alive: int = 0
    """Server Keep Alive (v5): when > 0, clients asking for longer (or 0) are told this value instead."""
    receive_maximum: int = 1024
    """Inbound QoS 1/2 PUBLISHes a client may have unacknowledged (v5 Receive Maximum we announce)."""
    max_inflight: int = 100
    """Outbound QoS 1/2 messages in flight per session (further capped by the client's Receive Maximum)."""
    session_expiry_max: int = 86400 * 7
    """Longest session expiry (seconds) honoured; v3.1.1 persistent sessions get this too."""
    topic_alias_maximum: int = 64
    """Topic aliases a v5 client may use towards us (0 disables inbound aliases)."""
    sys_interval: float = 10.0
    """Seconds between $SYS/broker/... updates (0 disables them)."""
    retain_available: bool = True
    """Accept retained messages."""
    allow_anonymous: bool | None = None
    """Accept clients that send no username (or, without a password file, a username nothing can verify). Unset (the default): accepted unless password_file is set, and the node refuses to start while an MQTT, WebSocket or native listener is reachable from other hosts without authentication (password_file, or mqtt_tls_ca on an ssl: listener). true: accepted on every listener; this also lets native listeners without a ``[native] token`` face other hosts. false: refused everywhere."""
    password_file: str = ""
    """Path of the password file (scrypt hashes, see twistmq-admin passwd); empty: no password check. A relative path starts at the config file's directory."""
    acl_file: str = ""
    """Path of the ACL file; empty: everything is allowed. Once set, anything it does not allow is denied. A relative path starts at the config file's directory."""
    use_username_as_clientid: bool = False
    """Bind client ids to identities, as Mosquitto's option of that name: the client id becomes the verified username (the certificate identity with use_identity_as_username), and clients without one are refused. Needed for ACL rules keyed by client id (client sections, %c): without it an ACL holding them is refused, since clients choose their ids."""
    auth_fail_delay: float = 1.0
    """Seconds a failed login for a username waits before it is answered, and the username's next attempt before it is checked; doubles with each further failure for that username (from any address) until a login as that username succeeds."""
    auth_fail_delay_max: float = 30.0
    """Cap of that delay, in seconds (also of an address's delay past auth_fail_address_limit)."""
    auth_fail_address_limit: int = 100
    """Failed logins from one address within auth_fail_window before that address's attempts are slowed down too (doubling per failure over the limit). High, so the mistakes of one device do not lock out every client behind the same NAT; a success from the address does not reset it."""
    auth_fail_window: float = 600.0
    """Seconds over which an address's failures drain (auth_fail_address_limit per window), and after which a quiet username's or address's count is forgotten."""

    def validate(self) -> None:
        if not 1 <= self.receive_maximum <= 65535:
            raise ConfigError("receive_maximum must be within 1..65535")
        if not 1 <= self.max_inflight <= 65535:
            raise ConfigError("max_inflight must be within 1..65535")
        if not 0 <= self.topic_alias_maximum <= 65535:
            raise ConfigError("topic_alias_maximum must be within 0..65535")
        if self.max_keep_alive < 0 or self.session_expiry_max < 0 or self.sys_interval < 0:
            raise ConfigError("max_keep_alive, session_expiry_max and sys_interval must be >= 0")
        if self.auth_fail_delay < 0 or self.auth_fail_delay_max < self.auth_fail_delay:
            raise ConfigError("auth_fail_delay must be >= 0 and auth_fail_delay_max >= auth_fail_delay")
        if self.auth_fail_address_limit < 1:
            raise ConfigError("auth_fail_address_limit must be >= 1")
        if self.auth_fail_window <= 0:
            raise ConfigError("auth_fail_window must be > 0")

    @property
    def anonymous_allowed(self) -> bool:
        """What ``allow_anonymous`` means once defaulted: unset accepts anonymous clients only without a password file."""
        if self.allow_anonymous is None:
            return not self.password_file
        return self.allow_anonymous


@dataclass(frozen=True)
class LimitsConfig:
    """The ``[limits]`` section: what any one client may cost the broker."""

    max_connections: int = 100000
    """Connections open at once; more are refused (CONNACK 0x97 in v5, closed in v3.1.1)."""
    max_connection_rate: float = 0.0
    """New connections per second from one address (0: unlimited)."""
    max_packet_size: int = 1 << 20
    """Largest packet accepted, in bytes (announced as Maximum Packet Size in v5)."""
    max_connect_bytes: int = 65536
    """Largest packet accepted before CONNACK, in bytes: the CONNECT and anything pipelined behind it. A larger one closes the connection, so an unauthenticated peer holds at most this much buffer."""
    max_topic_length: int = 1024
    """Longest topic name or filter, in bytes."""
    max_topic_levels: int = 32
    """Most levels in a topic name or filter."""
    max_subscriptions: int = 1000
    """Subscriptions per client."""
    max_queued_bytes: int = 1 << 20
    """Bytes written to one client's socket and not yet sent before the broker stops pushing to it."""
    max_retained_messages: int = 100000
    """Retained messages kept (0: unlimited)."""
    max_retained_bytes: int = 256 << 20
    """Bytes of retained payloads kept (0: unlimited)."""
    max_payload: int = 1 << 20
    """Largest PUBLISH payload accepted, in bytes."""
    max_pending_puts: int = 2000
    """Publishes of one connection waiting on the store before the broker stops reading from it."""

    def validate(self) -> None:
        for name in ("max_connections", "max_packet_size", "max_connect_bytes", "max_topic_length",
                     "max_topic_levels", "max_subscriptions", "max_queued_bytes", "max_payload",
                     "max_pending_puts"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.max_packet_size > 268435460:
            raise ConfigError("max_packet_size must be at most 268435460 (the MQTT maximum)")
        if self.max_connect_bytes < 16:
            raise ConfigError("max_connect_bytes must be at least 16 (no CONNECT is smaller)")
