"""Reactor stalls under load: how late the node's reactor runs, before and after a change.

    ./dev python -m bench.stall_bench                  # before = where this branch left main; 2 repetitions
    ./dev python -m bench.stall_bench --base main --reps 3 --messages 100000
    ./dev python -m bench.stall_bench --repo /path/to/other/checkout

Each run starts a real node (``twistd -n twistmq node`` through
``bench/stall_node.py``, which adds a probe on the reactor every 10 ms and
records how late each probe ran) with ``kv_sync = true`` and 1 MiB commit-log
segments, pinned to CPU 0, and drives it with the load generator pinned to
CPU 1: scenario 2's fan-in, 4 QoS 1 publishers (window 100) to one QoS 1
subscriber on ``dev/+/temp`` whose session is persistent, so its offsets and
in-flight state go to the durable KV on every tick. Counts and time are
bounded (``--messages``, ``--cap``). Lateness percentiles come from the probe
samples taken while the load ran.

"before" is a checkout of ``--base`` (default: the merge base of ``main`` and
HEAD, i.e. the code this branch started from; ``git archive`` into a temp
directory, no worktree, nothing in .git changes) or ``--repo``; "after" is
this checkout. The two alternate (the order rotates per repetition) in one run,
on the same venv. For "after", the node's own ``twistmq_reactor_lag_seconds``
gauge (max since start, from /metrics) is shown beside the probe's figures.
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.brokers import REPO, free_port, probe

CONFIG = """\
[store]
kv_sync = true
segment_size = 1048576
"""
READY_TIMEOUT = 60.0


def extract(ref, into):
    """A plain copy of ``ref``'s tree (``git archive``): no worktree, nothing written under .git."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", ref], capture_output=True,
                          text=True, check=True).stdout.strip()


def percentile(sorted_values, q):
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


def scrape_lag(http_port):
    """The node's own reactor-lag gauges from /metrics, {quantile: seconds} (empty if it has none)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith("twistmq_reactor_lag_seconds{"):
            labels, value = line.rsplit(" ", 1)
            q = labels.split('quantile="', 1)[1].split('"', 1)[0]
            out[q] = float(value)
    return out


def start_node(label, repo, workdir, node_args, *, samples, probe_ms=10.0, node_cpu=None, config=CONFIG):
    """Start ``twistd -n twistmq node`` from ``repo`` (through stall_node.py) and wait until it serves MQTT.

    ``node_args`` are the node's own flags after ``--config`` and ``--data-dir``
    (at least ``--mqtt tcp:PORT:interface=127.0.0.1``, whose port is probed);
    the node is pinned to ``node_cpu`` when taskset exists. Returns the Popen.
    """
    workdir.mkdir(parents=True)
    conf = workdir / "twistmq.toml"
    conf.write_text(config)
    port = int(node_args[node_args.index("--mqtt") + 1].split(":")[1])
    node_argv = [sys.executable, str(REPO / "bench" / "stall_node.py"), "--repo", str(repo),
                 "--samples", str(samples), "--probe-ms", str(probe_ms), "--",
                 "--config", str(conf), "--data-dir", str(workdir / "data")] + list(node_args)
    if node_cpu is not None and shutil.which("taskset"):
        node_argv = ["taskset", "-c", str(node_cpu)] + node_argv
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(repo))
    log_path = workdir / "node.log"
    with open(log_path, "wb") as log:
        node = subprocess.Popen(node_argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT
    while not ("twistmq ready" in log_path.read_text(errors="replace") and probe(port)):
        if node.poll() is not None or time.monotonic() > deadline:
            stop_node(node)
            tail = log_path.read_text(errors="replace")[-500:]
            raise RuntimeError(f"{label} node did not start: {tail}")
        time.sleep(0.05)
    return node


def stop_node(node):
    """SIGTERM the node, wait for it (kill it after 30 s)."""
    if node.poll() is None:
        node.send_signal(signal.SIGTERM)
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait(10)


def run_once(label, repo, args, workdir):
    """One node from ``repo`` under one bounded load; returns a result dict."""
    port, http = free_port(), free_port()
    samples_path = workdir / "lag.json"
    node = start_node(label, repo, workdir,
                      ["--mqtt", f"tcp:{port}:interface=127.0.0.1", "--http", f"tcp:{http}:interface=127.0.0.1"],
                      samples=samples_path, probe_ms=args.probe_ms, node_cpu=args.node_cpu)
    try:
        params = {"messages": args.messages, "sub_clean": False}
        gen = [sys.executable, "-m", "bench.loadgen", "--port", str(port), "--scenario", "2",
               "--cap", str(args.cap), "--broker-pid", str(node.pid), "--params", json.dumps(params)]
        if shutil.which("taskset"):
            gen = ["taskset", "-c", str(args.gen_cpu)] + gen
        t0 = time.time()
        proc = subprocess.run(gen, cwd=REPO, capture_output=True, text=True, timeout=3 * args.cap + 120)
        t1 = time.time()
        try:
            load = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            load = {"error": f"load generator failed ({proc.returncode}): {proc.stderr.strip()[-300:]}"}
        gauge = scrape_lag(http)
    finally:
        stop_node(node)
    try:
        samples = json.loads(samples_path.read_text())
    except (OSError, json.JSONDecodeError):
        samples = []
    late = sorted(lag for at, lag in samples if t0 <= at <= t1)
    return {
        "label": label, "samples": len(late),
        "p50_ms": _ms(percentile(late, 0.50)), "p99_ms": _ms(percentile(late, 0.99)),
        "max_ms": _ms(late[-1] if late else None),
        "rate": load.get("rate"), "accept_rate": load.get("accept_rate"), "delivered": load.get("delivered"),
        "sent": load.get("sent"), "partial": load.get("partial"), "error": load.get("error"),
        "broker_cpu": load.get("broker_cpu"), "gauge_max_ms": _ms(gauge.get("1")),
        "gauge_p99_ms": _ms(gauge.get("0.99")), "rc": node.returncode,
    }


def _ms(seconds):
    return None if seconds is None else seconds * 1000.0


def _fmt(value, digits=1):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def table(results, revs):
    lines = ["| run | code | probe p50 ms | probe p99 ms | probe max ms | node gauge p99 / max ms "
             "| delivered msg/s | PUBACKed msg/s | delivered | node CPU |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(results, 1):
        gauge = "-" if r["gauge_max_ms"] is None else f"{_fmt(r['gauge_p99_ms'])} / {_fmt(r['gauge_max_ms'])}"
        delivered = f"{r['delivered']:,}/{r['sent']:,}" if r.get("sent") is not None else "-"
        if r.get("partial"):
            delivered += " (partial)"
        if r.get("error"):
            delivered += f" error: {r['error'][:60]}"
        lines.append(f"| {i} | {r['label']} ({revs[r['label']]}) | {_fmt(r['p50_ms'], 2)} "
                     f"| {_fmt(r['p99_ms'])} | {_fmt(r['max_ms'])} | {gauge} | {_fmt(r['rate'], 0)} "
                     f"| {_fmt(r['accept_rate'], 0)} "
                     f"| {delivered} | {_fmt(r['broker_cpu'], 2)} |")
    lines.append("")
    lines.append("| code | runs | worst probe p99 ms | worst probe max ms | median delivered msg/s |")
    lines.append("| --- | --- | --- | --- | --- |")
    for label in ("before", "after"):
        rs = [r for r in results if r["label"] == label]
        rates = sorted(r["rate"] for r in rs if r["rate"] is not None)
        worst_p99 = max((r["p99_ms"] for r in rs if r["p99_ms"] is not None), default=None)
        worst_max = max((r["max_ms"] for r in rs if r["max_ms"] is not None), default=None)
        lines.append(f"| {label} ({revs[label]}) | {len(rs)} | {_fmt(worst_p99)} | {_fmt(worst_max)} "
                     f"| {_fmt(percentile(rates, 0.5), 0)} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--base", help="git ref measured as 'before' (default: merge base of main and HEAD)")
    where.add_argument("--repo", help="a checkout measured as 'before' instead of --base")
    parser.add_argument("--reps", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument("--messages", type=int, default=300_000,
                        help="QoS 1 messages per run (default 300000: long enough for an index flush)")
    parser.add_argument("--cap", type=float, default=30.0, help="seconds of sending per run (default 30)")
    parser.add_argument("--probe-ms", type=float, default=10.0, help="probe interval (default 10 ms)")
    parser.add_argument("--node-cpu", type=int, default=0)
    parser.add_argument("--gen-cpu", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (node logs, samples)")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="twistmq-stall-"))
    try:
        if args.repo:
            before = Path(args.repo).resolve()
            revs = {"before": before.name}
        else:
            before = tmp / "before-src"
            base = args.base or subprocess.run(["git", "-C", str(REPO), "merge-base", "main", "HEAD"],
                                               capture_output=True, text=True, check=True).stdout.strip()
            revs = {"before": extract(base, before)}
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        revs["after"] = head + ("+dirty" if dirty else "")
        sides = [("before", before), ("after", REPO)]
        results = []
        started = time.time()
        for rep in range(args.reps):
            order = sides if rep % 2 == 0 else sides[::-1]
            for label, repo in order:
                r = run_once(label, repo, args, tmp / f"{label}-{rep}")
                print(f"rep {rep + 1} {label}: p50 {_fmt(r['p50_ms'], 2)} p99 {_fmt(r['p99_ms'])} "
                      f"max {_fmt(r['max_ms'])} ms, {_fmt(r['rate'], 0)} msg/s", file=sys.stderr, flush=True)
                results.append(r)
        load = os.getloadavg()
        print(f"## Reactor lateness under fan-in QoS 1 load "
              f"({datetime.datetime.now():%Y-%m-%d %H:%M}, {time.time() - started:.0f} s)\n")
        print(f"4 QoS 1 publishers -> 1 persistent QoS 1 subscriber, {args.messages:,} messages, "
              f"cap {args.cap:g} s; kv_sync = true, 1 MiB segments; node on CPU {args.node_cpu}, "
              f"load generator on CPU {args.gen_cpu}; probe every {args.probe_ms:g} ms; "
              f"load average after the runs {load[0]:.2f} {load[1]:.2f}\n")
        print(table(results, revs))
    finally:
        if args.keep:
            print(f"\nkept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
