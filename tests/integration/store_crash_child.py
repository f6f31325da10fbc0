"""Child process for the store crash test: append under load until SIGKILLed.

Four producers put messages whose topics match 0, 1 or 20 subscribed filters;
each acknowledged put is printed as ``ACK producer seq offset`` and flushed, so
the parent knows exactly what was acknowledged when it kills us.
Usage: python store_crash_child.py DATA_DIR RUN_ID
"""

import sys

from twisted.internet import reactor

import lightqueue
from store.config import StoreConfig
from store.executor import ThreadPoolExecutor
from store.message_store import MessageStore
from store.record import Message

FILTERS = ["crash/one"] + [f"crash/many/{'+' if i % 2 else 'x'}/{i}/#" if i < 10 else "crash/many/#" for i in range(19)] \
    + ["crash/many/x/+/y"]
TOPICS = ["crash/none", "crash/one", "crash/many/x/0/y"]


def main() -> None:
    data_dir, run_id = sys.argv[1], sys.argv[2]
    executor = ThreadPoolExecutor(reactor)
    executor.start()
    store = MessageStore(data_dir, StoreConfig(segment_size=256 * 1024, index_flush_s=0.2, flush_interval_ms=50),
                         reactor, executor)
    lightqueue.attach(store)
    store.open()
    for f in FILTERS:
        store.add_filter(f)
    out = sys.stdout

    def produce(producer: int, seq: int) -> None:
        topic = TOPICS[(producer + seq) % len(TOPICS)]
        body = f"{run_id}:{producer}:{seq}".encode()
        d = store.put(Message(topic=topic, body=body, qos=1, client_id=f"p{producer}"))

        def acked(result):
            if result.ok:
                out.write(f"ACK {run_id}:{producer}:{seq} {result.offset}\n")
                out.flush()
            reactor.callLater(0.002, produce, producer, seq + 1)  # bounded rate keeps verification quick

        d.addCallback(acked)

    for p in range(4):
        for k in range(3):  # several puts in flight per producer: ticks batch them
            produce(p, k * 1_000_000)
    out.write("READY\n")
    out.flush()
    reactor.run()


if __name__ == "__main__":
    main()
