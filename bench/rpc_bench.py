"""RPC cost of the remote store: one broker process, one RemoteStore client, bounded in count and time.

Usage (from the repository root)::

    ./dev python -m bench.rpc_bench [--count 2000] [--window 64] [--cap 20]

Measures, against a real ``twistd twistmq broker`` on 127.0.0.1: the latency
of sequential ``append`` calls (one in flight: p50/p99 of the round trip, what
a proxy hop adds to a QoS 1 publish) and the throughput of ``append`` calls
with ``--window`` in flight, plus the same for ``read_queue``. Not a test.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from twisted.internet import defer, endpoints

from cluster.remote.store import RemoteStore
from cluster.rpc.frames import RPC_VERSION, Hello
from cluster.rpc.peer import PeerClient
from cluster.rpc.protocol import RpcSettings
from store.record import Message, RecordKind
from tests.integration.node import NodeProcess


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--cap", type=float, default=20.0, help="seconds per phase at most")
    args = ap.parse_args()
    from twisted.internet import reactor

    with tempfile.TemporaryDirectory() as tmp:
        conf = os.path.join(tmp, "broker.toml")
        with open(conf, "w") as f:
            f.write(f"[store]\nsegment_size = {64 << 20}\n")
        broker = NodeProcess(os.path.join(tmp, "b"), listeners=("rpc",), role="broker",
                             extra_args=["--config", conf]).start()
        try:
            peer = PeerClient("b", endpoints.clientFromString(reactor, f"tcp:127.0.0.1:{broker.port('rpc')}"),
                              Hello("twistmq", "bench", "proxy", RPC_VERSION), RpcSettings(), reactor)
            store = RemoteStore(peer)
            results: dict = {}

            @defer.inlineCallbacks
            def run():
                peer.startService()
                yield peer.when_connected()
                queue = yield store.add_filter("bench/#")
                (start,) = yield store.end_positions(queue)
                body = b"x" * 64
                lat = []
                deadline = time.monotonic() + args.cap
                for i in range(args.count):
                    t0 = time.perf_counter()
                    yield store.append(Message("bench/%d" % (i % 16), body, RecordKind.MQTT_PUBLISH, 1))
                    lat.append(time.perf_counter() - t0)
                    if time.monotonic() > deadline:
                        break
                results["sequential append"] = (len(lat), pct(lat, 0.5), pct(lat, 0.99))
                for name, make in (("append", lambda i: store.append(Message("bench/%d" % (i % 16), body,
                                                                             RecordKind.MQTT_PUBLISH, 1))),
                                   ("read_queue 32", lambda i: store.read_queue(start, 32))):
                    done = 0
                    t0 = time.perf_counter()
                    deadline = time.monotonic() + args.cap
                    while done < args.count and time.monotonic() < deadline:
                        n = min(args.window, args.count - done)
                        yield defer.gatherResults([make(done + k) for k in range(n)])
                        done += n
                    results[f"{name}, {args.window} in flight"] = (done, done / (time.perf_counter() - t0))
                yield peer.stopService()

            def finish(_):
                reactor.stop()

            reactor.callWhenRunning(lambda: run().addBoth(finish))
            reactor.run()
        finally:
            broker.stop()
    n, p50, p99 = results.pop("sequential append")
    print(f"sequential append over RPC: {n} calls, p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
    for name, (n, rate) in results.items():
        print(f"{name}: {n} calls, {rate:,.0f} calls/s")


if __name__ == "__main__":
    main()
