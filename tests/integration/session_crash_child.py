"""Child process for the session crash test: subscribe, append, SIGKILL before the session KV commits.

``crash`` mode opens the node's store parts (the reactor never runs, so nothing
the reactor would do later happens), stores a persistent session with
``SUBSCRIPTIONS`` subscriptions through the store interface, lets the store
append and dispatch that tick (``drain``), prints ``ACKED n`` (how many of the
writes had been acknowledged) and SIGKILLs itself: the session KV's batch,
committed on the next reactor turn, is never written. ``check`` mode opens the
same data dir and prints the stored session as JSON (``null``: none).
Usage: python session_crash_child.py crash|check DATA_DIR
"""

import json
import os
import signal
import sys

from twisted.internet import reactor

from cluster.local.parts import StoreParts
from cluster.runtime.config import load_config, with_flags
from lightqueue.names import lmq_name
from store import api

CLIENT_ID = "crash-session"
GROUP = "g1"
SUBSCRIPTIONS = 5


def _open(data_dir):
    parts = StoreParts(reactor, with_flags(load_config(None), {"data_dir": data_dir}))
    for part in parts.tree_parts():
        part.startService()
    return parts, parts.local_store(GROUP)


def crash(data_dir) -> None:
    parts, store = _open(data_dir)
    acked = []
    meta = api.SessionMeta(CLIENT_ID, 3600, 5, None, None)
    writes = [store.put_session(meta, 0)]
    for i in range(SUBSCRIPTIONS):
        topic_filter = f"crash/{i}/+"
        position = api.QueuePosition(lmq_name(topic_filter), GROUP, i)
        writes.append(store.put_subscription(CLIENT_ID, api.SubscriptionState(topic_filter, 1, (position,)), 0))
    writes.append(store.put_inbound_qos2(CLIENT_ID, 77, 0))
    for d in writes:
        d.addCallback(acked.append)
    parts.store.drain()  # this tick's appends: written and dispatched; the KV has them staged only
    print(f"ACKED {len(acked)} OF {len(writes)}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def check(data_dir) -> None:
    parts, store = _open(data_dir)
    out = []
    store.get_session(CLIENT_ID).addCallback(out.append)
    state = out[0]
    print(json.dumps(None if state is None else {
        "expiry": state.meta.expiry_s,
        "subscriptions": {s.topic_filter: [s.qos, [p.offset for p in s.positions]] for s in state.subscriptions},
        "inbound_qos2": sorted(state.inbound_qos2),
    }), flush=True)
    os._exit(0)  # read only: nothing to close


if __name__ == "__main__":
    {"crash": crash, "check": check}[sys.argv[1]](sys.argv[2])
