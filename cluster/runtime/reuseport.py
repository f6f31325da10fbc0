"""A TCP server endpoint that sets ``SO_REUSEPORT``, so several proxy processes serve one port.

Twisted's ``tcp:`` endpoint has no option for it, so this binds the socket
itself and hands it to the reactor (``adoptStreamPort``). The kernel spreads
new connections across every process listening on the port. Listener
descriptions opt in with ``reuseport=yes`` (``tcp:1883:interface=127.0.0.1:reuseport=yes``);
``server_endpoint`` builds the right endpoint for any description.
"""

from __future__ import annotations

import socket

from twisted.internet import defer, endpoints, interfaces
from zope.interface import implementer

from mqtt_proxy.tls import parse_description

TRUE = ("yes", "true", "1", "on")
FALSE = ("no", "false", "0", "off")


@implementer(interfaces.IStreamServerEndpoint)
class ReusePortTCPEndpoint:
    """``listen(factory)`` on ``interface:port`` with SO_REUSEADDR and SO_REUSEPORT set."""

    def __init__(self, reactor, port: int, interface: str = "", backlog: int = 50, ipv6: bool = False) -> None:
        self.reactor = reactor
        self.port = port
        self.interface = interface
        self.backlog = backlog
        self.family = socket.AF_INET6 if ipv6 or ":" in interface else socket.AF_INET

    def listen(self, factory) -> defer.Deferred:
        return defer.execute(self._listen, factory)

    def _listen(self, factory):
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.interface or ("::" if self.family == socket.AF_INET6 else "0.0.0.0"), self.port))
            sock.listen(self.backlog)
            sock.setblocking(False)
            # The reactor duplicates the descriptor: ours is closed below either way.
            return self.reactor.adoptStreamPort(sock.fileno(), self.family, factory)
        finally:
            sock.close()


def server_endpoint(reactor, description: str):
    """The server endpoint of a stream listener description: ours for ``reuseport=yes``, Twisted's otherwise."""
    kind, args, kwargs = parse_description(description)
    flag = kwargs.pop("reuseport", None)
    if flag is None:
        return endpoints.serverFromString(reactor, description)
    if flag.lower() not in TRUE + FALSE:
        raise ValueError(f"reuseport must be yes or no, not {flag!r}")
    if flag.lower() in FALSE:
        rest = [kind, *args] + [f"{k}={v}" for k, v in kwargs.items()]
        return endpoints.serverFromString(reactor, ":".join(rest))
    if kind not in ("tcp", "tcp6"):
        raise ValueError(f"reuseport is for tcp listeners, not {kind}")
    port = int(args[0] if args else kwargs["port"])
    return ReusePortTCPEndpoint(reactor, port, kwargs.get("interface", ""), int(kwargs.get("backlog", 50)),
                                ipv6=kind == "tcp6")
