"""The server side's table of request types: each call goes to its handler, and its answer comes back as
``(ok, body)`` or ``(False, (code, message))``, never as a failure; unknown types are refused by name.

A handler is ``handler(protocol, body) -> bytes | Deferred[bytes]``; it raises
(or fails with) a ``store.api.StoreError`` to answer with that error's code.
Anything else is a bug: logged with its traceback, answered as ``internal``.
Every call is counted and timed in ``RpcMetrics``.
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.internet import defer

from cluster.rpc.frames import Call
from cluster.rpc.metrics import RpcMetrics
from store import api

log = logging.getLogger("twistmq.rpc")

UNKNOWN_REQUEST = "unknown_request"


class Dispatcher:
    """``Dispatcher(clock, metrics)``; ``register(request_type, handler)`` fills the table."""

    def __init__(self, clock, metrics: RpcMetrics | None = None) -> None:
        self.clock = clock
        self.metrics = metrics or RpcMetrics()
        self._handlers: dict[str, Callable] = {}

    def register(self, request_type: str, handler: Callable) -> None:
        if request_type in self._handlers:
            raise ValueError(f"request type {request_type!r} registered twice")
        self._handlers[request_type] = handler

    def dispatch(self, protocol, call: Call) -> defer.Deferred:
        """Serve ``call``; fires with ``(True, body)`` or ``(False, (code, message))``."""
        handler = self._handlers.get(call.request_type)
        if handler is None:
            log.warning("rpc_unknown_request type=%r %s", call.request_type[:80], protocol.describe())
            self.metrics.refuse("unknown_request")
            return defer.succeed((False, (UNKNOWN_REQUEST, f"unknown request type {call.request_type[:80]!r}")))
        started = self.clock.seconds()
        d = defer.maybeDeferred(handler, protocol, call.body)
        d.addCallbacks(lambda body: (True, body), self._failed, errbackArgs=(call.request_type,))
        d.addCallback(self._timed, call.request_type, started)
        return d

    def _failed(self, failure, request_type: str):
        if failure.check(api.StoreError):
            return False, (failure.value.code, str(failure.value))
        log.error("rpc_handler_failed type=%s error=%s", request_type, failure.getTraceback())
        return False, (api.InternalError.code, f"{failure.type.__name__}: {failure.getErrorMessage()}")

    def _timed(self, outcome, request_type: str, started: float):
        self.metrics.observe(request_type, self.clock.seconds() - started, outcome[0])
        return outcome
