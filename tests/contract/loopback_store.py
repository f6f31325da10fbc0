"""``LoopbackStore``: any store behind the RPC codec, in one process.

Every call is packed into a call frame and unpacked again before the wrapped
store sees it; every result (or error) is packed and unpacked on its way back
and fires on a later reactor tick (``clock.callLater(0, ...)``). Calls reach
the wrapped store in the order they were made, a tick after they were made,
as over one RPC connection. So a caller that relies on a synchronous result or
on a side effect being done when its call returns, or passes anything the
codec cannot carry, fails against this store the way it would against a
remote one; the contract tests run unchanged against both.

Notify events travel back through the codec too: ``watch_queue``'s callback
stays here (it is the RPC's event stream), and each event's queue name is
packed, unpacked and delivered a tick later.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

from twisted.internet import defer

from cluster.remote import codec as store_codec
from store import api


class LoopbackStore:
    """``store.api.Store`` wrapping ``inner`` behind the codec, on ``clock``."""

    def __init__(self, inner: api.Store, clock) -> None:
        self._inner = inner
        self._clock = clock
        self._outbox: collections.deque = collections.deque()  # (call frame, reply Deferred, local args)
        self._sending = None
        self.calls = 0
        self.events = 0

    # -- calls ----------------------------------------------------------------------------------------

    def _call(self, name: str, args: tuple, kwargs: dict, local: tuple = ()) -> defer.Deferred:
        reply: defer.Deferred = defer.Deferred()
        try:
            frame = store_codec.pack_call(name, args, kwargs)
        except store_codec.CodecError as exc:
            self._later(reply.errback, api.InvalidArgument(str(exc)))
            return reply
        self._outbox.append((frame, reply, local))
        if self._sending is None:
            self._sending = self._clock.callLater(0, self._send)
        return reply

    def _send(self) -> None:
        self._sending = None
        batch, self._outbox = self._outbox, collections.deque()
        for frame, reply, local in batch:
            self.calls += 1
            name, args = store_codec.unpack_call(frame)
            d = defer.maybeDeferred(getattr(self._inner, name), *args, *local)
            d.addCallbacks(self._answer, self._refuse, callbackArgs=(name, reply), errbackArgs=(reply,))

    def _answer(self, value: Any, name: str, reply: defer.Deferred) -> None:
        try:
            frame = store_codec.pack_result(name, value)
        except store_codec.CodecError as exc:  # the wrapped store broke the interface: say so, as an RPC would
            self._later(self._fail_with, reply, store_codec.pack_error(api.InternalError(str(exc))))
            return
        self._later(self._succeed_with, reply, name, frame)

    def _refuse(self, failure, reply: defer.Deferred) -> None:
        self._later(self._fail_with, reply, store_codec.pack_error(failure.value))

    @staticmethod
    def _succeed_with(reply: defer.Deferred, name: str, frame: bytes) -> None:
        reply.callback(store_codec.unpack_result(name, frame))

    @staticmethod
    def _fail_with(reply: defer.Deferred, frame: bytes) -> None:
        reply.errback(store_codec.unpack_error(frame))

    def _later(self, fn: Callable, *args: Any) -> None:
        self._clock.callLater(0, fn, *args)

    # -- notify ---------------------------------------------------------------------------------------

    def watch_queue(self, queue: str, callback: Callable[[str], None]) -> defer.Deferred:
        """As ``Queues.watch_queue``; each event crosses the codec and arrives a tick later."""
        def relay(name: str) -> None:
            self._later(self._event, callback, store_codec.pack(name, str))

        return self._call("watch_queue", (queue, callback), {}, local=(relay,))

    def _event(self, callback: Callable[[str], None], frame: bytes) -> None:
        self.events += 1
        callback(store_codec.unpack(frame, str))


def _forwarder(name: str) -> Callable:
    op = store_codec.OPERATIONS[name]

    def call(self: LoopbackStore, *args: Any, **kwargs: Any) -> defer.Deferred:
        return self._call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"As ``store.api.Store.{name}{op.signature}``, through the codec."
    return call


# One forwarder per interface operation, from the codec's table (the Protocols): the loopback is generic by
# nature, like the RPC client it stands in for; only watch_queue, whose callback stays local, is written out.
for _name in store_codec.OPERATIONS:
    if _name not in LoopbackStore.__dict__:
        setattr(LoopbackStore, _name, _forwarder(_name))
del _name
