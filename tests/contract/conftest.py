"""The store-interface contract: one fixture, every implementation.

``store`` is a ``Harness`` around a real store in a tmp dir (commit log, light
queues, retained index, timer service, session KV, native engine and notifier,
wired as the node wires them) on a ``task.Clock``, served by each
implementation of ``store.api.Store`` in turn: ``LocalStore`` in-process and
``LoopbackStore`` through the RPC codec. No sleeps, no sockets.
"""

from __future__ import annotations

import os

import pytest
from twisted.internet import defer, task
from twisted.python.failure import Failure

import lightqueue
from cluster.local_store import LocalStore
from cluster.loopback_store import LoopbackStore
from lightqueue.native_engine import NativeEngine
from lightqueue.retained_index import RetainedIndex
from cluster.session_store import SessionStore
from push.notifier import Notifier
from store.config import NativeConfig, StoreConfig
from store.executor import SynchronousExecutor
from store.kv import DurableKV
from store.message_store import MessageStore
from store.timer_service import TimerService

T0 = 1_800_000_000.0
GROUP = "g1"
RETAINED_LIMIT = 3
MAX_TICKS = 50  # zero-length clock steps allowed for one result (loopback: a few per call)


class Parts:
    """The in-process parts of one broker group, built and opened as the node does."""

    def __init__(self, path: str, clock: task.Clock) -> None:
        self.store = MessageStore(path, StoreConfig(segment_size=1 << 20), clock, SynchronousExecutor())
        lightqueue.attach(self.store)
        self.retained = RetainedIndex(os.path.join(path, "retained"), max_messages=RETAINED_LIMIT)
        self.store.register_dispatcher(self.retained)
        self.timers = TimerService(self.store, os.path.join(path, "timer"), clock, 100, slot_count=600)
        self.kv = DurableKV(os.path.join(path, "sessions"), clock)
        self.notifier = Notifier(clock)
        self.store.add_listener(self.notifier.notify)
        self.store.read_soon = self.notifier.watched
        self.native_kv = DurableKV(os.path.join(path, "native"), clock)
        self.engine = NativeEngine(self.store, self.native_kv, NativeConfig(), clock, self.timers)
        self.store.add_listener(self.engine.note_queues)
        self.store.open()
        self.timers.start()
        self.engine.open()

    def local(self) -> LocalStore:
        return LocalStore(self.store, self.notifier, self.retained, self.timers, SessionStore(self.kv), self.engine,
                          group=GROUP)

    def close(self, clock: task.Clock) -> None:
        self.timers.stop()
        self.store.close()
        clock.advance(0)
        self.kv.close()
        self.native_kv.close()


class Harness:
    """An implementation under test plus the clock that drives it."""

    def __init__(self, impl, clock: task.Clock, parts: Parts) -> None:
        self.store = impl
        self.clock = clock
        self.parts = parts

    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    def _settle(self, d: defer.Deferred):
        out: list = []
        d.addBoth(out.append)
        for _ in range(MAX_TICKS):
            if out:
                break
            self.clock.advance(0)
        assert out, "the store never answered"
        return out[0]

    def wait(self, d: defer.Deferred):
        """The result ``d`` fires with once the clock has turned (raises what it failed with)."""
        result = self._settle(d)
        if isinstance(result, Failure):
            result.raiseException()
        return result

    def error(self, d: defer.Deferred) -> BaseException:
        """The exception ``d`` fails with (it must fail)."""
        result = self._settle(d)
        assert isinstance(result, Failure), f"expected a failure, got {result!r}"
        return result.value

    def run_for(self, seconds: float, step: float = 0.1) -> None:
        for _ in range(int(round(seconds / step))):
            self.clock.advance(step)


def _harness(path: str, variant: str):
    clock = task.Clock()
    clock.advance(T0)
    parts = Parts(path, clock)
    local = parts.local()
    impl = local if variant == "local" else LoopbackStore(local, clock)
    yield Harness(impl, clock, parts)
    parts.close(clock)


@pytest.fixture(params=["local", "loopback"])
def store(request, tmp_path):
    """Each implementation of the store interface over a fresh store."""
    yield from _harness(str(tmp_path), request.param)


@pytest.fixture
def local(tmp_path):
    """The in-process implementation alone (tests of what the loopback adds wrap it themselves)."""
    yield from _harness(str(tmp_path), "local")
