"""The MQTT front end: what a connection talks to, over the session registry, router and delivery pump.

Connections (``protocol.py``) are admitted here (connection count, rate,
shutdown) and hand decoded packets on: CONNECT/DISCONNECT to the
``SessionRegistry``, SUBSCRIBE/UNSUBSCRIBE to the ``SubscriptionRouter``,
PUBLISH/PUBREL to the ``Publisher``. Every part reaches the broker only through
a ``store.api.Store`` (in-process, or remote), so a proxy runs the same front
end as a node. ``build_front_end`` builds the parts over a store, for the
composition root and for tests.
"""

from __future__ import annotations

from twisted.internet import defer

from mqtt_proxy.auth.acl import ACL
from mqtt_proxy.auth.authenticator import AuthResult
from mqtt_proxy.codec import ReasonCode
from mqtt_proxy.config import LimitsConfig, MQTTConfig
from mqtt_proxy.deadlines import DeadlineWheel
from mqtt_proxy.delivery import DeliveryPump, SessionContext
from mqtt_proxy.inbound import InboundBatcher
from mqtt_proxy.publish import Publisher
from mqtt_proxy.router import SubscriptionRouter
from mqtt_proxy.sessions import SessionRegistry
from mqtt_proxy.stats import BrokerStats
from push.read_cache import ReadCache
from push.watches import QueueWatches
from store.api import Store


class AllowAll:
    """The authenticator used when none is given (unit tests): everyone is accepted, unverified."""

    def authenticate(self, username, password, client_id, peer_host, cert_identity=None):
        return defer.succeed(AuthResult(True, username, "OK", False))


class MQTTFrontEnd:
    """Admission of connections, and the parts their packets go to."""

    def __init__(self, registry: SessionRegistry, router: SubscriptionRouter, publisher: Publisher) -> None:
        self.registry = registry
        self.router = router
        self.publisher = publisher
        self.clock = registry.clock
        self.config = registry.config
        self.limits = registry.limits
        self.stats = registry.stats
        self.acl = registry.acl
        self.auth = registry.auth
        self.connections: set = set()
        self.deadlines = DeadlineWheel(self.clock)  # every connection's CONNECT and keep-alive deadline
        self.started_at = self.clock.seconds()
        self._rate: dict[str, tuple[int, int]] = {}  # address -> (second, connections in it)
        self.closing = False

    @property
    def sessions(self):
        """Client id -> Session, connected or not ($SYS, /metrics)."""
        return self.registry.sessions

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    def restore(self):
        """Bring persistent sessions back (before listeners open)."""
        return self.registry.restore()

    def owed(self):
        """Retention holder: what sessions and shared groups still owe (see SessionRegistry.owed)."""
        return self.registry.owed()

    # -- connection admission ---------------------------------------------------------------

    def admit(self, peer_host: str) -> int | None:
        """None if a new connection from ``peer_host`` may proceed, else the reason code to refuse it."""
        if self.closing:
            return ReasonCode.SERVER_UNAVAILABLE
        if len(self.connections) >= self.limits.max_connections:
            return ReasonCode.QUOTA_EXCEEDED
        rate = self.limits.max_connection_rate
        if rate > 0:
            second = int(self.clock.seconds())
            start, count = self._rate.get(peer_host, (second, 0))
            if start != second:
                start, count = second, 0
                if len(self._rate) > 10000:
                    self._rate.clear()
            count += 1
            self._rate[peer_host] = (start, count)
            if count > rate:
                return ReasonCode.CONNECTION_RATE_EXCEEDED
        return None

    def connect(self, conn, packet):
        return self.registry.connect(conn, packet)

    def disconnect(self, conn, packet) -> None:
        self.registry.disconnect(conn, packet)

    def connection_lost(self, conn) -> None:
        self.connections.discard(conn)
        self.registry.connection_lost(conn)

    def server_disconnect(self, conn, reason: int, reason_string: str | None = None) -> None:
        """Close one client with a reason (v5 DISCONNECT first); its will is published."""
        self.registry.conn_gone(conn, publish_will=True)
        conn.close(reason, reason_string)

    def shutdown(self) -> None:
        """Tell v5 clients the server is going away, and close every connection."""
        self.closing = True
        for conn in list(self.connections):
            if conn.session is not None:
                self.registry.conn_gone(conn, publish_will=False)
            conn.close(ReasonCode.SERVER_SHUTTING_DOWN)


def build_front_end(store: Store, clock, config: MQTTConfig, limits: LimitsConfig, auth=None, acl=None,
                    holder: str = "node", read_cache: ReadCache | None = None, deliver_latency=None,
                    log_connections: bool = True, left_wills: bool = False) -> MQTTFrontEnd:
    """Delivery pump, router, registry, publisher and front end over ``store``; ``holder`` claims sessions;
    ``deliver_latency`` (an object with ``observe(seconds)``) hears publish-to-deliver times;
    ``log_connections``: log each client's connect and disconnect (``[log] connection_messages``); ``left_wills``:
    the restore publishes the wills the holder's last life left (``SessionRegistry.restore``)."""
    acl = acl or ACL.allow_all()
    stats = BrokerStats()
    read_cache = read_cache or ReadCache(store)
    pump = DeliveryPump(read_cache, QueueWatches(store, before_news=read_cache.news), clock, stats, deliver_latency)
    ctx = SessionContext(pump, store, config.max_inflight)
    inbound = InboundBatcher(store, clock)
    router = SubscriptionRouter(store, ctx, acl, limits)
    publisher = Publisher(inbound, store, acl, config, limits, stats, clock)
    registry = SessionRegistry(ctx, router, inbound, auth or AllowAll(), acl, config, limits, holder, publisher,
                               log_connections, left_wills)
    return MQTTFrontEnd(registry, router, publisher)
