"""Inbound publishes stored per tick: every PUBLISH of one reactor tick goes to the store in one append_batch.

A device fleet publishes thousands of messages a second, each its own call if
sent one by one; one ``append_batch`` per tick costs one call (one RPC frame to
a remote store) and keeps the arrival order, which MQTT's per-topic order needs.
Whatever must reach the store after the publishes already taken (a retained
message, a delayed one) calls ``flush`` first. A ``listener`` answers a whole
batch at once, so it can send what the answers produce (the PUBACKs of one
connection) in one write instead of one per message.
"""

from __future__ import annotations

import logging
from typing import Callable, Protocol

from store.api import AppendResult, AppendStatus, MessageLog
from store.record import Message

log = logging.getLogger("twistmq.mqtt.inbound")

MAX_BATCH = 1000  # messages in one append_batch (a bigger tick is sent in several)


class BatchListener(Protocol):
    """Answers the messages of one batch, each with what it was submitted with (its origin)."""

    def batch_stored(self, origins: list, results: tuple[AppendResult, ...]) -> None: ...


class InboundBatcher:
    """Collects (message, origin) per tick and appends them in one batch, in arrival order.

    An origin is a callable ``on_done(result)``, or, when a ``listener`` is set,
    anything the listener knows how to answer (the publisher passes plain
    publishes as tuples and answers a whole batch in one loop).
    """

    def __init__(self, store: MessageLog, clock) -> None:
        self._store = store
        self._clock = clock
        self._messages: list[Message] = []
        self._origins: list = []
        self._call = None
        self.listener: BatchListener | None = None

    def submit(self, message: Message, origin: Callable[[AppendResult], None] | object) -> None:
        """Store ``message`` with this tick's batch; its origin is answered once the store answered."""
        self._messages.append(message)
        self._origins.append(origin)
        if len(self._messages) >= MAX_BATCH:
            self.flush()
        elif self._call is None:
            self._call = self._clock.callLater(0, self.flush)

    def submit_many(self, messages: list[Message], origins: list) -> None:
        """``submit`` for each pair of ``messages`` and ``origins``, in order (one read's publishes)."""
        while True:
            room = MAX_BATCH - len(self._messages)
            if len(messages) < room:
                break
            self._messages += messages[:room]
            self._origins += origins[:room]
            messages, origins = messages[room:], origins[room:]
            self.flush()
        if messages:
            self._messages += messages
            self._origins += origins
            if self._call is None:
                self._call = self._clock.callLater(0, self.flush)

    def flush(self) -> None:
        """Send what was collected now (before a call that must reach the store after it)."""
        if self._call is not None:
            if self._call.active():
                self._call.cancel()
            self._call = None
        if not self._messages:
            return
        messages, origins = tuple(self._messages), self._origins
        self._messages, self._origins = [], []
        self._store.append_batch(messages).addCallbacks(self._answer, self._refused, callbackArgs=(origins,),
                                                        errbackArgs=(origins,))

    def _answer(self, results, origins) -> None:
        if self.listener is not None:
            self.listener.batch_stored(origins, results)
            return
        for on_done, result in zip(origins, results):
            on_done(result)

    def _refused(self, failure, origins) -> None:
        log.error("append_batch_failed messages=%d error=%s", len(origins), failure.getErrorMessage())
        result = AppendResult(AppendStatus.SERVICE_NOT_AVAILABLE, reason=failure.getErrorMessage())
        self._answer((result,) * len(origins), origins)
