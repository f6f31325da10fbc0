"""A test process: MQTT front ends over ``LoopbackStore``s of one in-process broker group, on real sockets.

Usage: ``python loopback_front.py DATA_DIR PROXIES EVENTS``. It builds the
broker side as the node does (commit log, light queues, retained index,
timers, session KV, notifier, native engine) behind one ``LocalStore``, then
PROXIES front ends, each over its own ``LoopbackStore`` (every call and event
through the RPC codec, answered ticks later) and claiming sessions as holder
``proxy-<n>``, each on its own MQTT listener on 127.0.0.1. With EVENTS = ``yes``
a claim that takes a session from another holder is told to that holder's
front end (as the RPC layer will carry it); with ``no`` the old holder learns
only from its next write being ``Fenced``. It prints one
``twistmq ready mqtt=127.0.0.1:P ...`` line and stops on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from twisted.internet import reactor  # noqa: E402

import lightqueue  # noqa: E402
from cluster.local.store import LocalStore  # noqa: E402
from lightqueue.native_engine import NativeEngine  # noqa: E402
from lightqueue.retained_index import RetainedIndex  # noqa: E402
from mqtt_proxy.config import LimitsConfig, MQTTConfig  # noqa: E402
from mqtt_proxy.front_end import build_front_end  # noqa: E402
from mqtt_proxy.protocol import MQTTServerFactory  # noqa: E402
from push.notifier import Notifier  # noqa: E402
from store.config import NativeConfig, StoreConfig  # noqa: E402
from store.executor import SynchronousExecutor  # noqa: E402
from store.kv import DurableKV  # noqa: E402
from store.dispatch import StoreObserver  # noqa: E402
from store.message_store import MessageStore  # noqa: E402
from store.session_store import SessionStore  # noqa: E402
from store.timer_service import TimerService  # noqa: E402
from tests.contract.loopback_store import LoopbackStore  # noqa: E402


class _Watched(StoreObserver):
    """Keeps appends in memory for the queues the notifier's watchers read (the notifier is made after the store)."""

    watched = staticmethod(lambda queues: True)

    def read_soon(self, queues, excluding=None) -> bool:
        return self.watched(queues)


def main(data_dir: str, proxies: int, events: bool) -> None:
    os.makedirs(data_dir, exist_ok=True)
    observer = _Watched()
    store = MessageStore(data_dir, StoreConfig(), reactor, SynchronousExecutor(), observer)
    lightqueue.attach(store)
    retained = RetainedIndex(os.path.join(data_dir, "retained"))
    store.register_dispatcher(retained)
    timers = TimerService(store, os.path.join(data_dir, "timer"), reactor)
    kv = DurableKV(os.path.join(data_dir, "sessions"), reactor)
    native_kv = DurableKV(os.path.join(data_dir, "native"), reactor)
    notifier = Notifier(reactor)
    store.add_listener(notifier.notify_now)
    observer.watched = notifier.watched
    store.open()
    timers.start()
    engine = NativeEngine(store, native_kv, NativeConfig(), reactor, timers)
    store.add_listener(engine.note_queues)
    engine.open()
    local = LocalStore(store, notifier, retained, timers, SessionStore(kv), engine)

    fronts = {}
    ports = []
    for n in range(1, proxies + 1):
        holder = f"proxy-{n}"
        front = build_front_end(LoopbackStore(local, reactor), reactor, MQTTConfig(sys_interval=0), LimitsConfig(),
                                holder=holder)
        fronts[holder] = front
        front.restore()
        port = reactor.listenTCP(0, MQTTServerFactory(front, reactor), interface="127.0.0.1")
        ports.append(port.getHost().port)
    if events:
        def told(client_id: str, old_holder: str, epoch: int) -> None:
            old = fronts.get(old_holder)
            if old is not None:
                reactor.callLater(0, old.registry.taken_over, client_id, epoch)  # an RPC event: a tick later
        local.add_claim_listener(told)

    def stop() -> None:
        for front in fronts.values():
            front.shutdown()
        timers.stop()
        store.close()
        kv.close()
        native_kv.close()

    reactor.addSystemEventTrigger("before", "shutdown", stop)
    signal.signal(signal.SIGTERM, lambda *_: reactor.callFromThread(reactor.stop))

    def ready() -> None:
        print("twistmq ready " + " ".join(f"mqtt=127.0.0.1:{p}" for p in ports), flush=True)

    reactor.callWhenRunning(lambda: reactor.callLater(0.2, ready))  # after the restores ran
    reactor.run()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "yes")
