"""Native protocol benchmark: produce+consume TPS and latency at concurrency 8, and timer lateness.

    .venv/bin/python -m bench.native_bench            # --quick (default): ~1-2 min
    .venv/bin/python -m bench.native_bench --full     # 8 x 10,000 request pairs, 1,000,000 timer messages

Part 1 starts a server process (store + light queues + timer + native service on
the real reactor, like a node) pinned to CPU 0 and drives it from a client
process pinned to CPU 1 (taskset, when there are two CPUs) with 8 connections,
each sending produce then consume, one request at a time (the queue_server
test: 8 PHP clients x 10,000 requests, ~14,000 TPS at 0.6 ms). The client is
a lean blocking-socket one by default (``--client twisted``: the project's
Twisted client): with one request in flight per connection its own time per
request adds to the server's in every round trip (see ``drive``). TPS counts
requests (a produce and a consume are two); it also reports the server's and
the client's CPU time per request (from /proc and getrusage), figures that
other load on the machine disturbs less than TPS. Part 2 is
``bench.timer_bench``: N timer messages over a window, how late each one was
put back into the store (lateness = put acknowledged - due time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from bench import timer_bench

QUEUE_SERVER_TPS = 14_000
QUEUE_SERVER_AVG_MS = 0.6


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


# -- server ------------------------------------------------------------------------------------------

def serve(data_dir: str, port: int) -> None:
    """Run a native server on 127.0.0.1:port until killed (prints 'ready').

    The node's own store parts (``cluster.local.parts.StoreParts``) with the
    shipped defaults (``conf/twistmq.toml``), started in the node's order, and
    ``gc.freeze()`` as the node does once started: what a new user's node runs,
    less the MQTT and HTTP listeners.
    """
    import gc

    from twisted.internet import reactor

    from cluster.local.parts import StoreParts
    from cluster.runtime.config import load_config, with_flags

    parts = StoreParts(reactor, with_flags(load_config(None), {"data_dir": data_dir}))
    for part in parts.tree_parts():
        part.startService()
    reactor.listenTCP(port, parts.native.tcp_factory(), interface="127.0.0.1")
    gc.freeze()
    print("ready", flush=True)
    reactor.run()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- client ------------------------------------------------------------------------------------------

def _figures(latencies: list[float], elapsed: float, errors: int) -> dict:
    return dict(requests=len(latencies), seconds=elapsed, tps=len(latencies) / elapsed,
                avg_ms=1000 * sum(latencies) / len(latencies), p99_ms=1000 * _percentile(latencies, 0.99),
                max_ms=1000 * max(latencies), errors=errors)


def drive(port: int, concurrency: int, pairs: int, client: str = "socket") -> dict:
    """Run the load from this process; returns TPS and latency figures.

    With one request in flight per connection, the requests of all the
    connections travel as a wave: the server answers the wave, then the client
    sends the next one, so TPS is about 1 / (server + client time per request)
    and the client's own cost counts as much as the server's. ``socket`` (the
    default) is a lean client like queue_server's test clients: blocking
    sockets, one poll loop, pre-formatted requests, every reply decoded and
    checked (code, seq, and data on a consume). ``twisted`` drives the
    project's Twisted client (``NativeClientProtocol.call``) instead.
    """
    if client == "twisted":
        return _drive_twisted(port, concurrency, pairs)
    import selectors

    import orjson

    perf = time.perf_counter
    data = "x" * 64
    latencies: list[float] = []
    errors = 0
    sel = selectors.DefaultSelector()
    total = 2 * pairs

    class Conn:
        __slots__ = ("sock", "produce", "consume", "n", "t0", "buf")

    conns = []
    for i in range(concurrency):
        c = Conn()
        c.sock = socket.create_connection(("127.0.0.1", port))
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c.produce = ('{"action":1,"queue":"bench%d","data":"%s","seq":%%d}\n' % (i, data)).encode()
        c.consume = ('{"action":2,"queue":"bench%d","seq":%%d}\n' % i).encode()
        c.n, c.buf = 0, b""
        sel.register(c.sock, selectors.EVENT_READ, c)
        conns.append(c)
    t_start = perf()
    for c in conns:
        c.t0 = perf()
        c.sock.sendall(c.produce % 0)
    active = len(conns)
    while active:
        for key, _ev in sel.select():
            c = key.data
            chunk = c.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed a connection")
            buf = c.buf + chunk if c.buf else chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    break
                latencies.append(perf() - c.t0)
                reply = orjson.loads(buf[:nl])
                buf = buf[nl + 1:]
                n = c.n
                if reply.get("code") != 0 or reply.get("seq") != n >> 1 or (n & 1 and "data" not in reply):
                    errors += 1
                n = c.n = n + 1
                if n >= total:
                    sel.unregister(c.sock)
                    c.sock.close()
                    active -= 1
                    break
                c.t0 = perf()
                c.sock.sendall((c.consume if n & 1 else c.produce) % (n >> 1))
            c.buf = buf
    return _figures(latencies, perf() - t_start, errors)


def _drive_twisted(port: int, concurrency: int, pairs: int) -> dict:
    """``drive`` on the project's Twisted client: plain callbacks, no Deferred per request (``call``)."""
    from twisted.internet import defer, reactor

    from mqtt_proxy.native.client import connect

    latencies: list[float] = []
    errors = [0]
    result: dict = {}
    perf = time.perf_counter
    data = "x" * 64

    class Worker:
        def __init__(self, client, queue: str, finished: defer.Deferred) -> None:
            self.client, self.queue, self.finished = client, queue, finished
            self.n = 0
            self.t0 = 0.0

        def send(self) -> None:
            n = self.n
            if n >= 2 * pairs:
                self.client.transport.loseConnection()
                self.finished.callback(None)
                return
            req = {"action": 1, "queue": self.queue, "data": data, "seq": n >> 1} if n % 2 == 0 else \
                {"action": 2, "queue": self.queue, "seq": n >> 1}
            self.t0 = perf()
            self.client.call(req, self.answered)

        def answered(self, reply: dict) -> None:
            latencies.append(perf() - self.t0)
            if reply.get("code") != 0 or (self.n % 2 == 1 and "data" not in reply):
                errors[0] += 1
            self.n += 1
            self.send()

    def start(i: int) -> defer.Deferred:
        finished: defer.Deferred = defer.Deferred()
        connect(reactor, "127.0.0.1", port).addCallback(lambda c: Worker(c, f"bench{i}", finished).send())
        return finished

    def main():
        t0 = perf()

        def done(_):
            result.update(_figures(latencies, perf() - t0, errors[0]))
            reactor.stop()

        defer.gatherResults([start(i) for i in range(concurrency)]).addCallback(done)

    reactor.callWhenRunning(main)
    reactor.run()
    return result


def _pinned(cpu: int | None) -> list[str]:
    """``taskset -c CPU`` when there are two CPUs and taskset exists (the server on one core, the client on the other)."""
    if cpu is None or (os.cpu_count() or 1) < 2 or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(cpu)]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def bench_queue(concurrency: int, pairs: int, cpus: tuple[int | None, int | None] = (0, 1),
                client: str = "socket") -> dict:
    data_dir = tempfile.mkdtemp(prefix="native-bench-")
    port = _free_port()
    server = subprocess.Popen([*_pinned(cpus[0]), sys.executable, "-m", "bench.native_bench", "--serve", data_dir,
                               str(port)], stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError("server did not start")
        cpu0 = _cpu_seconds(server.pid)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        driver = subprocess.run([*_pinned(cpus[1]), sys.executable, "-m", "bench.native_bench", "--drive", str(port),
                                 str(concurrency), str(pairs), "--client", client], capture_output=True, text=True,
                                check=True)
        out = json.loads(driver.stdout.strip().splitlines()[-1])
        out["server_cpu_us_per_request"] = 1e6 * (_cpu_seconds(server.pid) - cpu0) / out["requests"]
        out["server_cpu_share"] = (_cpu_seconds(server.pid) - cpu0) / out["seconds"]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the client only: the server is not reaped yet
        client_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        out["client_cpu_us_per_request"] = 1e6 * client_cpu / out["requests"]
        out["pinned"] = bool(_pinned(cpus[0]))
        out["client"] = client
        return out
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="8 x 10,000 pairs and 1,000,000 timer messages")
    ap.add_argument("--quick", action="store_true", help="the default: 8 x 3,000 pairs and 100,000 timer messages")
    ap.add_argument("--pairs", type=int, help="produce+consume pairs per connection")
    ap.add_argument("--timer-count", type=int, help="timer messages to schedule")
    ap.add_argument("--timer-window", type=float, help="seconds over which they are due")
    ap.add_argument("--client", choices=("socket", "twisted"), default="socket",
                    help="the load's client: lean blocking sockets (default) or the project's Twisted client")
    ap.add_argument("--native-only", action="store_true", help="skip the timer part")
    ap.add_argument("--serve", nargs=2, metavar=("DIR", "PORT"), help=argparse.SUPPRESS)
    ap.add_argument("--drive", nargs=3, metavar=("PORT", "CONC", "PAIRS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return serve(args.serve[0], int(args.serve[1]))
    if args.drive:
        print(json.dumps(drive(int(args.drive[0]), int(args.drive[1]), int(args.drive[2]), args.client)))
        return None
    pairs = args.pairs or (10_000 if args.full else 3_000)
    count = args.timer_count or (1_000_000 if args.full else 100_000)
    window = args.timer_window or (120.0 if args.full else 20.0)
    q = bench_queue(8, pairs, client=args.client)
    print()
    print("| metric | twistmq | queue_server |")
    print("| --- | --- | --- |")
    print(f"| produce+consume TPS, concurrency 8 ({q['requests']:,} requests) | {q['tps']:,.0f} | ~{QUEUE_SERVER_TPS:,} |")
    print(f"| average latency | {q['avg_ms']:.2f} ms | {QUEUE_SERVER_AVG_MS} ms |")
    print(f"| p99 latency | {q['p99_ms']:.2f} ms | - |")
    print(f"| errors | {q['errors']} | 0 |")
    print(f"| CPU per request: server / client ({q['client']} client) | {q['server_cpu_us_per_request']:.0f} / "
          f"{q['client_cpu_us_per_request']:.0f} us | - |")
    if args.native_only:
        return None
    t = timer_bench.run_child(count, window)
    print(f"| timer: scheduled (rate) | {t['count']:,} ({t['schedule_rate']:,.0f}/s) | - |")
    print(f"| timer: delivered | {t['delivered']:,} | - |")
    print(f"| timer lateness p50 / p99 / max | {t['p50_ms']:.0f} / {t['p99_ms']:.0f} / {t['max_ms']:.0f} ms "
          f"(window {window:.0f} s{', overlapping the scheduling' if t['overlapped'] else ''}) | - |")
    return None


if __name__ == "__main__":
    main()
