"""The building blocks of a role's service tree: ordered start and stop, parts, listeners, the ready line.

A role is an ``OrderedServices`` (a ``MultiService``) whose children start one
after another, each waiting for the Deferred the previous one's
``startService`` returned (stores open and recover before anything reads them,
listeners bind last), and stop in reverse, each waiting for the one after it
(listeners close first, the store closes last). Twisted's own ``MultiService``
starts its children without waiting and binds ``StreamServerEndpointService``s
in ``privilegedStartService``, before recovery: hence this class.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from twisted.application import internet, service
from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.logger import ILogObserver

from store.config import ConfigError

log = logging.getLogger("twistmq.node")

STOP_BOUND = 30.0
"""Seconds a failed start may spend stopping what did start before the process exits anyway."""


class OrderedServices(service.MultiService):
    """A MultiService whose children start in order, each after the previous one's Deferred; stop reversed."""

    def privilegedStartService(self) -> None:
        service.Service.privilegedStartService(self)  # children bind in startService, in tree order

    def startService(self) -> defer.Deferred:
        service.Service.startService(self)
        return self._start_children()

    @defer.inlineCallbacks
    def _start_children(self):
        for child in list(self):
            yield defer.maybeDeferred(child.startService)

    def stopService(self) -> defer.Deferred:
        service.Service.stopService(self)
        return self._stop_children()

    @defer.inlineCallbacks
    def _stop_children(self):
        """Stop every running child, last first; one that fails to stop is logged, the rest still stop."""
        for child in reversed(list(self)):
            if not child.running:
                continue
            try:
                yield defer.maybeDeferred(child.stopService)
            except Exception as exc:  # noqa: BLE001 - the others must still stop
                log.error("stop_failed service=%s reason=%s", child.name or type(child).__name__, exc)


class RoleService(OrderedServices):
    """The root of one role: a failed start prints one line, stops what started, exits 2 (1 for a bug).

    *start_errors* are the exceptions a bad configuration raises (exit 2, no traceback).
    """

    def __init__(self, role: str, reactor, start_errors: tuple, log_file: str = "") -> None:
        super().__init__()
        self.role = role
        self.reactor = reactor
        self.start_errors = start_errors
        self.log_file = log_file
        self.log_observer = None  # twistd's log observer, set by the composition (see setServiceParent)

    def setServiceParent(self, parent):  # noqa: N802 - Twisted interface
        # twistd takes its log observer from the application this service joins, if it has one:
        # ours sends Twisted's events to the node's own log handler, so every event has one format.
        if self.log_observer is not None and hasattr(parent, "setComponent"):
            parent.setComponent(ILogObserver, self.log_observer)
        return super().setServiceParent(parent)

    def startService(self) -> defer.Deferred:
        return super().startService().addErrback(self._start_failed)

    @defer.inlineCallbacks
    def stopService(self):
        yield super().stopService()
        log.info("%s_stopped", self.role)

    @defer.inlineCallbacks
    def _start_failed(self, failure):
        expected = failure.check(*self.start_errors)
        reason = failure.getErrorMessage() if expected else f"cannot start: {failure.getErrorMessage()}"
        print(f"twistmq: {reason}", file=sys.__stderr__, flush=True)
        if expected and self.log_file:
            log.error("start_failed %s", failure.getErrorMessage())  # the file says why the node stopped
        elif not expected:
            log.error("start_failed %s", failure.getTraceback())  # a bug: the traceback is the useful part
        code = 2 if expected else 1
        self.reactor.callLater(STOP_BOUND, os._exit, code)  # a stop that hangs must not keep the process
        try:
            yield self._stop_children()  # close what opened (store, KVs): nothing left half-written
        finally:
            os._exit(code)


class Part(service.Service):
    """A stateful part as a child service: ``start()`` when the tree reaches it, ``stop()`` when it unwinds.

    Either may return a Deferred; the tree waits for it.
    """

    def __init__(self, name: str, start=None, stop=None) -> None:
        self.setName(name)
        self._start, self._stop = start, stop

    def startService(self):
        service.Service.startService(self)
        return self._start() if self._start else None

    def stopService(self):
        service.Service.stopService(self)
        return self._stop() if self._stop else None


class ListenerService(internet.StreamServerEndpointService):
    """One stream listener: binds when the tree starts it (not in privilegedStartService), and keeps its port.

    A port that cannot be bound is a ConfigError naming *listener* (a ``cluster.runtime.listeners.Listener``).
    """

    def __init__(self, listener, endpoint, factory) -> None:
        super().__init__(endpoint, factory)
        self.listener = listener
        self.port = None

    def privilegedStartService(self) -> None:
        service.Service.privilegedStartService(self)

    def startService(self) -> defer.Deferred:
        service.Service.startService(self)
        self._waitingForPort = bind(self.listener, lambda: self.endpoint.listen(self.factory))
        return self._waitingForPort.addCallbacks(self._bound, self._not_bound)

    def _bound(self, port):
        self.port = port
        prepare = getattr(self.factory, "prepare_port", None)  # the factory's say in how the port serves
        if prepare is not None:
            prepare(port)
        return port

    def _not_bound(self, failure):
        self.running = False  # nothing to stop
        return failure

    def stopService(self) -> defer.Deferred:
        service.Service.stopService(self)
        port, self.port = self.port, None
        return defer.maybeDeferred(port.stopListening) if port is not None else defer.succeed(None)


class DatagramListenerService(service.Service):
    """One UDP listener (Twisted has no UDP endpoints): ``listenUDP`` when the tree starts it."""

    def __init__(self, listener, protocol, reactor) -> None:
        self.listener = listener
        self.protocol = protocol
        self.reactor = reactor
        self.port = None

    def startService(self) -> defer.Deferred:
        service.Service.startService(self)
        d = bind(self.listener, lambda: self.reactor.listenUDP(self.listener.port, self.protocol,
                                                               interface=self.listener.interface))
        return d.addCallbacks(self._bound, self._not_bound)

    def _bound(self, port):
        self.port = port
        return port

    def _not_bound(self, failure):
        self.running = False
        return failure

    def stopService(self) -> defer.Deferred:
        service.Service.stopService(self)
        port, self.port = self.port, None
        return defer.maybeDeferred(port.stopListening) if port is not None else defer.succeed(None)


class ReadyLine(service.Service):
    """The last child: prints ``twistmq ready`` and every bound listener, once the tree reaches it."""

    def __init__(self, listeners, announce=None, extra=()) -> None:
        self.setName("ready")
        self.listeners = listeners
        self.announce = announce  # called after the line: the role's own log line
        self.extra = tuple(extra)  # "key=value" of addresses bound outside Twisted (a controller's raft)

    def startService(self) -> None:
        service.Service.startService(self)
        bound = [f"{name(svc.listener)}={address(svc.port)}" for svc in self.listeners]
        print("twistmq ready " + " ".join(bound + list(self.extra)), file=sys.__stdout__, flush=True)
        if self.announce is not None:
            self.announce()


class SignalService(service.Service):
    """Runs *handler* on the reactor when *signum* arrives, while the service runs (main thread only)."""

    def __init__(self, name: str, signum: int, handler, reactor) -> None:
        self.setName(name)
        self.signum, self.handler, self.reactor = signum, handler, reactor
        self._previous = None

    def startService(self) -> None:
        service.Service.startService(self)
        if threading.current_thread() is threading.main_thread():  # signal.signal works there only
            # The handler runs between two bytecodes of the reactor's thread: hand the work to the reactor.
            self._previous = signal.signal(self.signum,
                                           lambda _signum, _frame: self.reactor.callFromThread(self.handler))

    def stopService(self) -> None:
        service.Service.stopService(self)
        if self._previous is not None:
            signal.signal(self.signum, self._previous)
            self._previous = None


def bind(listener, listen) -> defer.Deferred:
    """Call *listen*; a port that cannot be bound is a ConfigError naming the listener, no traceback."""
    def failed(failure):
        failure.trap(CannotListenError)
        reason = failure.value.socketError
        reason = getattr(reason, "strerror", None) or str(reason)
        raise ConfigError(f"cannot listen on {listener.where}: {reason}")
    return defer.maybeDeferred(listen).addErrback(failed)


def address(port) -> str:
    """A bound port's address for the ready line: HOST:PORT, or a unix socket's path."""
    host = port.getHost()
    if hasattr(host, "name"):  # a unix socket
        return host.name.decode() if isinstance(host.name, bytes) else str(host.name)
    return f"{getattr(host, 'host', '?')}:{getattr(host, 'port', '?')}"


def name(listener) -> str:
    """The listener's name in the ready line: its flag without dashes (mqtt, mqtt-tls, native-udp, ...)."""
    return listener.key.replace("_", "-")
