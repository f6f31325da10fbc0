"""What an idle MQTT connection holds in a node: tracemalloc's allocations per connection, by line.

Usage::

    ./dev python -m bench.conn_memory [--connections 10000] [--top 25] [--frames 1]
    ./dev python -m bench.conn_memory --no-trace        # RSS growth per connection only

Runs a node in this process (the ``twistd twistmq node`` service, fresh data
dir, MQTT on a free loopback port), lets a child process open the idle
connections (``bench/loadgen.py``'s clients: MQTT 3.1.1, clean session, keep-alive
300 s, at most 100 handshakes at once) and keep them open, and compares two
tracemalloc snapshots taken before and after (after a collection). Prints the
lines that allocated the most per connection (with ``--frames N`` > 1, grouped
by the N innermost frames, innermost first), the total per connection by tracemalloc, and the
RSS growth per connection of this process (tracemalloc's own bookkeeping
inflates it: ``--no-trace`` measures RSS alone). Unlike ``bench/compare.py``'s
scenario 5, no probe connection comes and goes before the idle clients.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

CHILD = r"""
import sys, time
from bench.loadgen import _client
from bench.netloop import Loop
port, n, prefix = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
loop = Loop(port)
conns = [_client(f"idle{i}", f"{prefix}-idle{i}") for i in range(n)]
ok = loop.open_many(conns, time.monotonic() + 120, window=100)
print(loop.ready_count if ok else -1, flush=True)
sys.stdin.readline()
loop.close_all()
"""


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _short(filename: str) -> str:
    """A frame's file relative to the repository or to site-packages."""
    for marker in ("site-packages/", "/lib/python3."):
        if marker in filename:
            return filename.split(marker, 1)[1]
    root = str(Path(__file__).resolve().parent.parent) + "/"
    return filename[len(root):] if filename.startswith(root) else filename


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--frames", type=int, default=1, help="innermost frames per group (1: by line)")
    parser.add_argument("--no-trace", action="store_true", help="RSS growth only, without tracemalloc")
    args = parser.parse_args(argv)

    from twisted.internet import reactor, task, threads

    from bench.brokers import free_port
    from cluster.tap import Options, makeService

    if not args.no_trace:
        tracemalloc.start(max(args.frames, 1))
    tmp = tempfile.TemporaryDirectory(prefix="conn-memory-")
    port = free_port()
    config = Path(tmp.name) / "twistmq.toml"
    config.write_text("[log]\nconnection_messages = false\n")
    options = Options()
    options.parseOptions(["node", "--mqtt", f"tcp:{port}:interface=127.0.0.1", "--data-dir",
                          str(Path(tmp.name) / "data"), "--config", str(config)])
    service = makeService(options, reactor)
    report = {}

    def snapshot():
        gc.collect()
        if args.no_trace:
            return None
        return tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])

    def measure():
        before, rss0 = snapshot(), rss_bytes()
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(port), str(args.connections), "mem"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        d = threads.deferToThread(child.stdout.readline)

        def opened(line):
            ready = int(line.strip() or -1)
            if ready <= 0:
                report["error"] = "the clients did not all connect"
                return finish(child)
            # one second for the reactor to finish every CONNACK's aftermath
            return task.deferLater(reactor, 1.0, compare, ready, child)

        def compare(ready, child):
            after, rss1 = snapshot(), rss_bytes()
            stats = after.compare_to(before, "traceback" if args.frames > 1 else "lineno") if after else []
            total = sum(s.size_diff for s in stats)
            report.update(connections=ready, tracemalloc_per_conn=round(total / ready, 1),
                          rss_per_conn=round((rss1 - rss0) / ready, 1), top=[])
            for s in stats[:args.top]:
                where = " <- ".join(f"{_short(f.filename)}:{f.lineno}" for f in reversed(s.traceback))
                report["top"].append((round(s.size_diff / ready, 1), round(s.count_diff / ready, 2), where))
            return finish(child)

        d.addCallback(opened)
        d.addErrback(lambda f: (report.setdefault("error", f.getTraceback()), finish(child)))

    def finish(child):
        if child.poll() is None:
            child.stdin.write("\n")
            child.stdin.flush()
            child.wait(timeout=60)
        if reactor.running:
            # the service's thread pools stop with it, before the reactor does
            service.stopService().addBoth(lambda _: reactor.stop())

    service.startService()
    reactor.callLater(1.0, measure)
    reactor.run()
    tmp.cleanup()
    if "error" in report:
        print(report["error"], file=sys.stderr)
        return 1
    if args.no_trace:
        print(f"{report['connections']:,} idle connections: RSS {report['rss_per_conn']:,} B per connection")
    else:
        print(f"{report['connections']:,} idle connections: tracemalloc {report['tracemalloc_per_conn']:,} B "
              f"per connection, RSS {report['rss_per_conn']:,} B (inflated by tracemalloc)")
    print("  B/conn  blocks/conn  where")
    for size, count, where in report["top"]:
        print(f"{size:8.1f} {count:12.2f}  {where}")
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
