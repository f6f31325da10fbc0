"""Inbound publishes stored per tick: every PUBLISH of one reactor tick goes to the store in one append_batch.

A device fleet publishes thousands of messages a second, each its own call if
sent one by one; one ``append_batch`` per tick costs one call (one RPC frame to
a remote store) and keeps the arrival order, which MQTT's per-topic order needs.
Whatever must reach the store after the publishes already taken (a retained
message, a delayed one) calls ``flush`` first. A ``listener`` hears when a
batch's answers start and end, so it can send what they produce (the PUBACKs of
one connection) in one write instead of one per message.
"""

from __future__ import annotations

import logging
from typing import Callable, Protocol

from store.api import AppendResult, AppendStatus, MessageLog
from store.record import Message

log = logging.getLogger("twistmq.mqtt.inbound")

MAX_BATCH = 1000  # messages in one append_batch (a bigger tick is sent in several)


class BatchListener(Protocol):
    """Told around the answers of one batch (every ``on_done`` of it runs in between)."""

    def batch_answering(self) -> None: ...

    def batch_answered(self) -> None: ...


class InboundBatcher:
    """Collects (message, on_done) per tick and appends them in one batch, in arrival order."""

    def __init__(self, store: MessageLog, clock) -> None:
        self._store = store
        self._clock = clock
        self._messages: list[Message] = []
        self._callbacks: list[Callable[[AppendResult], None]] = []
        self._call = None
        self.listener: BatchListener | None = None

    def submit(self, message: Message, on_done: Callable[[AppendResult], None]) -> None:
        """Store ``message`` with this tick's batch; ``on_done(result)`` runs once the store answered."""
        self._messages.append(message)
        self._callbacks.append(on_done)
        if len(self._messages) >= MAX_BATCH:
            self.flush()
        elif self._call is None:
            self._call = self._clock.callLater(0, self.flush)

    def flush(self) -> None:
        """Send what was collected now (before a call that must reach the store after it)."""
        if self._call is not None:
            if self._call.active():
                self._call.cancel()
            self._call = None
        if not self._messages:
            return
        messages, callbacks = tuple(self._messages), self._callbacks
        self._messages, self._callbacks = [], []
        self._store.append_batch(messages).addCallbacks(self._answer, self._refused, callbackArgs=(callbacks,),
                                                        errbackArgs=(callbacks,))

    def _answer(self, results, callbacks) -> None:
        listener = self.listener
        if listener is None:
            for on_done, result in zip(callbacks, results):
                on_done(result)
            return
        listener.batch_answering()
        try:
            for on_done, result in zip(callbacks, results):
                on_done(result)
        finally:
            listener.batch_answered()

    def _refused(self, failure, callbacks) -> None:
        log.error("append_batch_failed messages=%d error=%s", len(callbacks), failure.getErrorMessage())
        result = AppendResult(AppendStatus.SERVICE_NOT_AVAILABLE, reason=failure.getErrorMessage())
        self._answer([result] * len(callbacks), callbacks)
