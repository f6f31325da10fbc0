"""RPC between nodes: one TCP (or TLS) connection per node pair, varint-length msgpack frames, a handshake in
which both ends prove ``[cluster] secret`` (HMAC-SHA256 over both nonces), calls with timeouts, events, heartbeats
carrying a health flag, goodbye.

Layers, bottom up: ``frames`` (the wire vocabulary, sans-IO), ``connection``
(one connection's state machine, sans-IO), ``protocol`` (the Twisted adapter:
transport, Deferreds, timers), ``dispatch`` (the server's table of request
types), ``server`` (the listener's factory), ``peer`` (the client side: a
reconnecting connection per peer, ``call_any``), ``health`` and ``metrics``.
What travels in the bodies is the callers' business: ``cluster.remote.server``
serves the store interface over it and ``cluster.remote.store`` calls it.
"""

from cluster.rpc.dispatch import Dispatcher
from cluster.rpc.frames import Hello
from cluster.rpc.health import HealthLimits, HealthProbe
from cluster.rpc.metrics import RpcMetrics
from cluster.rpc.peer import PeerClient, Peers
from cluster.rpc.protocol import (
           CallTimeout,
           NotConnected,
           RemoteError,
           RpcProtocol,
           RpcSettings,
)
from cluster.rpc.server import RpcServerFactory

__all__ = ["CallTimeout", "Dispatcher", "HealthLimits", "HealthProbe", "Hello", "NotConnected", "PeerClient", "Peers",
           "RemoteError", "RpcMetrics", "RpcProtocol", "RpcServerFactory", "RpcSettings"]
