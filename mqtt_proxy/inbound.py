"""Inbound publishes stored per tick: every PUBLISH of one reactor tick goes to the store in one append_batch.

A device fleet publishes thousands of messages a second, each its own call if
sent one by one; one ``append_batch`` per tick costs one call (one RPC frame to
a remote store) and keeps the arrival order, which MQTT's per-topic order needs.
Whatever must reach the store after the publishes already taken (a retained
message, a delayed one) calls ``flush`` first.
"""

from __future__ import annotations

import logging
from typing import Callable

from store.api import AppendResult, AppendStatus, MessageLog
from store.record import Message

log = logging.getLogger("twistmq.mqtt.inbound")

MAX_BATCH = 1000  # messages in one append_batch (a bigger tick is sent in several)


class InboundBatcher:
    """Collects (message, on_done) per tick and appends them in one batch, in arrival order."""

    def __init__(self, store: MessageLog, clock) -> None:
        self._store = store
        self._clock = clock
        self._messages: list[Message] = []
        self._callbacks: list[Callable[[AppendResult], None]] = []
        self._call = None

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
        self._store.append_batch(messages).addCallbacks(_answer, _refused, callbackArgs=(callbacks,),
                                                        errbackArgs=(callbacks,))


def _answer(results, callbacks) -> None:
    for on_done, result in zip(callbacks, results):
        on_done(result)


def _refused(failure, callbacks) -> None:
    log.error("append_batch_failed messages=%d error=%s", len(callbacks), failure.getErrorMessage())
    result = AppendResult(AppendStatus.SERVICE_NOT_AVAILABLE, reason=failure.getErrorMessage())
    for on_done in callbacks:
        on_done(result)
