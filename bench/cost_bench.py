"""CPU cost per message, old code against new (issue 14's cost check): fan-in, fan-out and native.

    ./dev python -m bench.cost_bench --base 5d57ef3 --reps 5
    ./dev python -m bench.cost_bench --base main --reps 3 --fan-in 20000 --fan-out 500 --native-pairs 500
    ./dev python -m bench.cost_bench --repo /path/to/other/checkout --reps 1

"old" is a ``git archive`` of ``--base`` in a temp directory (or ``--repo``),
"new" is this checkout; both run on this venv, and per repetition every
scenario runs once on each side, the order of the sides alternating. Each run
starts a fresh node (``twistd -n twistmq node`` through bench/stall_node.py,
whose reactor probe is set to one tick a second so it costs next to nothing)
with explicit listeners on 127.0.0.1 and an empty config file (each side's own
defaults), pinned to CPU 0; the load runs pinned to CPU 1:

- fan-in: bench/loadgen.py scenario 2, 4 QoS 1 publishers (window 100) -> 1 QoS 1 subscriber;
- fan-in-0: scenario 1, the same at QoS 0 (``--fan-in`` messages too);
- fan-out: scenario 3, 1 QoS 0 publisher -> ``--subscribers`` (default 100) subscribers on dev/#;
  the cost is per delivery;
- native: bench/native_bench.py's client, 8 connections each doing produce then consume;
  the cost is per pair (one message produced and consumed).

The node's CPU time (utime + stime of all its threads, /proc/PID/stat) is read
right before the load process starts and right after it exits, so connecting
and subscribing the clients are inside the figure (they are the same on both
sides and small beside the messages). CPU-µs per message is that difference
over the messages delivered. The table shows each side's median over the
repetitions, the ratio new/old and whether new is at most 10 % worse. Every
run is bounded by message counts and ``--cap`` seconds.
"""

import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.brokers import REPO, free_port
from bench.loadgen import cpu_seconds, machine_busy_seconds
from bench.stall_bench import extract, start_node, stop_node

SCENARIOS = ("fan-in", "fan-in-0", "fan-out", "native")
TOLERANCE = 1.10  # issue 14: no more than 10 % worse
PROBE_MS = 1000.0  # stall_node's probe: one tick a second, negligible beside the load
NATIVE_CONCURRENCY = 8
MIN_CPU_S = 0.5  # /proc counts CPU in clock ticks (10 ms): below this a run's figure is too coarse to compare


def _load_argv(scenario, ports, node_pid, args):
    """The load process for ``scenario`` against the node's ``ports``."""
    if scenario == "native":
        return [sys.executable, "-m", "bench.native_bench", "--drive", str(ports["native"]),
                str(NATIVE_CONCURRENCY), str(args.native_pairs)]
    number, params = {"fan-in": (2, {"messages": args.fan_in}), "fan-in-0": (1, {"messages": args.fan_in}),
                      "fan-out": (3, {"messages": args.fan_out, "subscribers": args.subscribers})}[scenario]
    return [sys.executable, "-m", "bench.loadgen", "--port", str(ports["mqtt"]), "--scenario", str(number),
            "--cap", str(args.cap), "--broker-pid", str(node_pid), "--params", json.dumps(params)]


def _delivered(scenario, out):
    """Messages delivered (fan-out: deliveries; native: consumed pairs) and an error text or None."""
    if scenario == "native":
        pairs = out.get("requests", 0) // 2
        return pairs, (f"{out['errors']} failed pairs" if out.get("errors") else None)
    error = out.get("error") or ("; ".join(out["errors"][:3]) if out.get("errors") else None)
    if out.get("partial"):
        error = (error + "; " if error else "") + "partial (hit --cap)"
    return out.get("delivered", 0), error


def run_once(label, repo, scenario, args, workdir):
    """One fresh node from ``repo`` under one bounded load; returns its CPU cost figures."""
    ports = {"mqtt": free_port(), "native": free_port(), "http": free_port()}
    node_args = ["--mqtt", f"tcp:{ports['mqtt']}:interface=127.0.0.1",
                 "--native", f"tcp:{ports['native']}:interface=127.0.0.1",
                 "--http", f"tcp:{ports['http']}:interface=127.0.0.1"]
    node = start_node(label, repo, workdir, node_args, samples=workdir / "lag.json", probe_ms=PROBE_MS,
                      node_cpu=args.node_cpu, config="")
    try:
        load = _load_argv(scenario, ports, node.pid, args)
        if shutil.which("taskset"):
            load = ["taskset", "-c", str(args.gen_cpu)] + load
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy0, wall0 = machine_busy_seconds(), time.monotonic()
        cpu0 = cpu_seconds(node.pid)
        try:
            proc = subprocess.run(load, cwd=REPO, capture_output=True, text=True, timeout=3 * args.cap + 120)
            stdout, rc, stderr = proc.stdout, proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            stdout, rc, stderr = "", "timeout", ""
        cpu1 = cpu_seconds(node.pid)
        busy1, wall = machine_busy_seconds(), time.monotonic() - wall0
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        alive = node.poll() is None
    finally:
        stop_node(node)
    try:
        out = json.loads(stdout.strip().splitlines()[-1])
        delivered, error = _delivered(scenario, out)
    except (IndexError, json.JSONDecodeError):
        delivered, error = 0, f"load failed ({rc}): {stderr.strip()[-300:]}"
    if not alive:
        error = f"node exited during the run ({node.returncode})"
    node_cpu = cpu1 - cpu0
    load_cpu = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
    other = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0 - node_cpu - load_cpu) / wall)
    return {"label": label, "scenario": scenario, "delivered": delivered, "node_cpu_s": node_cpu,
            "us_per_msg": 1e6 * node_cpu / delivered if delivered and not error else None,
            "wall_s": wall, "other_cpu": other, "error": error}


def summary(results, revs):
    """The markdown table: per scenario, each side's median CPU-µs/msg, the ratio and the verdict."""
    lines = [f"| scenario | old ({revs['old']}) CPU-µs/msg | new ({revs['new']}) CPU-µs/msg | new/old "
             "| within 10 % | runs old/new | other CPU (median, cores) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for scenario in SCENARIOS:
        medians, counts, others = {}, {}, []
        for side in ("old", "new"):
            rs = [r for r in results if r["scenario"] == scenario and r["label"] == side]
            costs = [r["us_per_msg"] for r in rs if r["us_per_msg"] is not None]
            medians[side] = statistics.median(costs) if costs else None
            counts[side] = f"{len(costs)}" if len(costs) == len(rs) else f"{len(costs)} of {len(rs)}"
            others += [r["other_cpu"] for r in rs if r["other_cpu"] is not None]
        old, new = medians["old"], medians["new"]
        ratio = new / old if old and new is not None else None
        verdict = "-" if ratio is None else ("yes" if ratio <= TOLERANCE else "**no**")
        lines.append(f"| {scenario} | {_fmt(old)} | {_fmt(new)} | {_fmt(ratio, 3)} | {verdict} "
                     f"| {counts['old']}/{counts['new']} | {_fmt(statistics.median(others) if others else None, 2)} |")
    return "\n".join(lines)


def _fmt(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--base", help="git ref measured as 'old' (git archive into a temp directory)")
    where.add_argument("--repo", help="a checkout measured as 'old' instead of --base")
    parser.add_argument("--reps", type=int, default=5, help="runs of each side per scenario (default 5)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset of "
                        + ", ".join(SCENARIOS))
    parser.add_argument("--fan-in", type=int, default=40_000, help="fan-in messages per run, QoS 1 and QoS 0 (default 40000)")
    parser.add_argument("--fan-out", type=int, default=1_000,
                        help="fan-out messages per run, each delivered to every subscriber (default 1000)")
    parser.add_argument("--subscribers", type=int, default=100, help="fan-out subscribers (default 100)")
    parser.add_argument("--native-pairs", type=int, default=1_000,
                        help=f"native produce+consume pairs per connection, {NATIVE_CONCURRENCY} connections "
                             "(default 1000)")
    parser.add_argument("--cap", type=float, default=30.0, help="seconds of sending per MQTT run (default 30)")
    parser.add_argument("--node-cpu", type=int, default=0)
    parser.add_argument("--gen-cpu", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (node logs)")
    args = parser.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown or args.reps < 1:
        parser.error(f"unknown scenario {unknown[0]!r}" if unknown else "--reps must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="twistmq-cost-"))
    try:
        if args.repo:
            old = Path(args.repo).resolve()
            revs = {"old": old.name}
        else:
            old = tmp / "old-src"
            try:
                revs = {"old": extract(args.base, old)}
            except subprocess.CalledProcessError as e:
                raise SystemExit(f"cost_bench: cannot extract --base {args.base!r}: "
                                 f"{(e.stderr or b'').decode(errors='replace').strip()}")
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        revs["new"] = head + ("+dirty" if dirty else "")
        sides = [("old", old), ("new", REPO)]
        results = []
        started, load_before = time.time(), os.getloadavg()
        for rep in range(args.reps):
            for scenario in scenarios:
                for label, repo in (sides if rep % 2 == 0 else sides[::-1]):
                    r = run_once(label, repo, scenario, args, tmp / f"{label}-{scenario}-{rep}")
                    print(f"rep {rep + 1} {scenario} {label}: {_fmt(r['us_per_msg'])} CPU-µs/msg "
                          f"({r['node_cpu_s']:.2f} s over {r['delivered']:,} in {r['wall_s']:.1f} s, other CPU "
                          f"{_fmt(r['other_cpu'], 2)}){' ERROR ' + r['error'] if r['error'] else ''}",
                          file=sys.stderr, flush=True)
                    results.append(r)
        load_after = os.getloadavg()
        print(f"## Node CPU per message, old vs new "
              f"({datetime.datetime.now():%Y-%m-%d %H:%M}, {time.time() - started:.0f} s)\n")
        print(f"median of {args.reps} interleaved runs per side; fan-in {args.fan_in:,} QoS 1 messages "
              f"(4 publishers -> 1 subscriber); fan-out {args.fan_out:,} QoS 0 messages x {args.subscribers} "
              f"subscribers (per delivery); native {NATIVE_CONCURRENCY} x {args.native_pairs:,} produce+consume "
              f"pairs (per pair); node on CPU {args.node_cpu}, load on CPU {args.gen_cpu}; load average "
              f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; 'other CPU' is what the rest of the "
              "machine used during the load phase\n")
        print(summary(results, revs))
        short = sorted({r["scenario"] for r in results if r["node_cpu_s"] < MIN_CPU_S})
        if short:
            print(f"\nunder {MIN_CPU_S:g} CPU-s per run (10 ms ticks), too coarse to compare: {', '.join(short)}; "
                  "raise the message counts")
        failed = [r for r in results if r["error"]]
        for r in failed:
            print(f"\n{r['scenario']} {r['label']}: {r['error']}")
    finally:
        if args.keep:
            print(f"\nkept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
