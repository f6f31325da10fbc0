"""Compare twistmq, Mosquitto and amqtt on the scenarios of the benchmark issue (issue 7).

Usage::

    ./dev bench                      # the whole comparison (3 brokers x 8 scenarios x 3 reps, < 20 min)
    python -m bench.compare          # the same, from the repository root with the venv active
    python -m bench.compare --brokers mosquitto,amqtt --scenarios 1,2 --reps 1 --scale 0.1
    python -m bench.compare --brokers twistmq --scenarios 1 --reps 1 --profile   # py-spy flame graph

Options: ``--scenarios 1,2,...`` (default all of 1-8), ``--brokers`` (default
``twistmq,mosquitto,amqtt``), ``--reps N`` (default 3), ``--scale F``
(multiplies message, connection and filter counts and the latency run's
length; for quick runs), ``--cap S`` (seconds of sending per phase, default
20), ``--profile`` (record twistmq with py-spy during every run into
``bench/out/``; ``--profile-brokers`` and ``--profile-format`` adjust it),
``--no-write`` (print only, leave ``docs/benchmarks.md`` alone), ``--no-engine-rows``
(skip the native protocol, timer and Spark rows that follow the comparison:
``bench/engine_rows.py``; ``--scenarios none`` runs those rows alone).

For each scenario and repetition every broker runs in turn (the order rotates
per repetition), each in a fresh process on a fresh port on 127.0.0.1, pinned
to CPU 0, while the load generator (``bench/loadgen.py``) runs pinned to CPU 1.
Mosquitto is installed with apt-get when missing. The table goes to stdout and
to ``docs/benchmarks.md`` with the date, versions, machine and every setting;
raw results go to ``bench/out/results-<stamp>.json``.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import chaos_report, cluster_bench, engine_rows, report
from bench.brokers import BROKERS, REPO, BrokerStartError
from bench.loadgen import params_for

OUT = REPO / "bench" / "out"
MIN_CAP = 5.0         # seconds: the shortest cap the budget may impose
GEN_BUSY = 0.85      # generator CPU share above which a figure is flagged as possibly generator-bound
BUSY_OTHER = 0.15     # CPUs used by other processes during the runs above which the report warns
RUN_OVERHEAD = 6.0    # seconds: broker start, client set-up and stop, per run (a pessimistic guess)
DOC = REPO / "docs" / "benchmarks.md"

COMMON_SETTINGS = [
    "every broker: its own process, fresh for each scenario run, listening on 127.0.0.1 only, "
    "pinned to CPU {broker_cpu} with taskset; RLIMIT_NOFILE raised to the hard limit ({nofile})",
    "load generator: one process (raw non-blocking sockets, epoll, pre-encoded MQTT 3.1.1 packets), "
    "pinned to CPU {gen_cpu}; RLIMIT_NOFILE at the hard limit; TCP_NODELAY on its sockets",
    "every client sends username 'bench' (no password) and keep-alive 300 s; payloads are 16 bytes",
    "QoS 1 publishers keep at most 100 unacknowledged PUBLISHes each, topping the window up once a quarter "
    "of it is free (fewer, larger writes); QoS 0 publishers write as fast as the socket takes",
    "subscribers acknowledge every QoS 1 PUBLISH of a read in the same write; while receiving, the generator "
    "polls its sockets at most every 0.3 ms in scenarios 2 and 6 (drain) and every 20 ms in scenario 3 "
    "(500 sockets), so each read/write carries many packets (otherwise the generator used 90-97% of its "
    "core against Mosquitto); the latency scenario never waits",
]


def _base_interpreter() -> str:
    """The interpreter the venv was made from (its build decides much of twistmq's speed)."""
    base = getattr(sys, "_base_executable", sys.executable)
    return os.path.realpath(base)


def scenario_notes(scale):
    """One line per scenario describing exactly what runs at ``scale``."""
    p = {n: params_for(n, scale) for n in range(1, 9)}
    return [
        f"1: {p[1]['publishers']} QoS 0 publishers on dev/pN/temp -> 1 subscriber on dev/+/temp (QoS 0), "
        f"{p[1]['messages']:,} messages; delivered msg/s (first send to last delivery) and loss",
        f"2: as 1 at QoS 1 (publishers and subscription), window 100 per publisher, "
        f"{p[2]['messages']:,} messages",
        f"3: 1 QoS 0 publisher -> {p[3]['subscribers']} subscribers on dev/# (QoS 0), {p[3]['messages']:,} "
        "messages; deliveries/s over all subscribers and loss",
        f"4: 1 QoS 1 publisher at {p[4]['rate']:,} msg/s for {p[4]['seconds']:g} s -> 1 QoS 1 subscriber; "
        "send-to-delivery latency p50/p99/max (nearest rank)",
        f"5: {p[5]['connections']:,} idle connections (CONNECT/CONNACK, at most 100 handshakes at once); "
        "connect rate, and broker VmRSS after (+1 s settle) minus before, per connection",
        f"6: a clean-session=0 subscriber on dev/+/temp (QoS 1) disconnects; {p[6]['publishers']} publishers "
        f"send {p[6]['messages']:,} QoS 1 messages (window 100); broker VmRSS growth from before the "
        "publishing to 1 s after the last PUBACK; then the subscriber reconnects: time from CONNECT to the "
        "last message; loss counted against PUBACKed messages",
        f"7: {p[7]['filters']:,} other distinct filters subscribed under dev/ (dev/nI/+ and dev/+/tI, "
        f"{p[7]['filters_per_conn']} per connection, none matching), then scenario 1 with "
        f"{p[7]['messages']:,} messages; routed (delivered) msg/s and loss",
        f"8: {p[8]['sessions']:,} persistent sessions (clean session 0) subscribe to fleet/+/cmd (QoS 1) and "
        f"disconnect; 1 publisher sends {p[8]['messages']:,} QoS 1 messages of {p[8]['payload']} B to "
        "fleet/all/cmd (window 100), each owed to every session; PUBACKed msg/s, broker VmRSS growth and "
        "bytes gained on disk (its working directory) from before the publishing to 1 s after the last "
        f"PUBACK; then {p[8]['sample']} of the sessions reconnect and count their messages (loss); sending "
        f"stops if the broker's RSS grows by more than {p[8]['rss_cap_mb']:,} MB",
    ]


def machine_info(brokers, available):
    """Date-independent facts about this machine and the software versions."""
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal"))
        mem = f"{int(mem) / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        mem = "unknown"
    info = {
        "CPU": f"{cpu}, nproc {os.cpu_count()}",
        "memory": mem,
        "kernel": platform.release(),
        "Python": f"{sys.version.split()[0]} ({_base_interpreter()})",
    }
    for b in brokers:
        info[b.label] = b.version() if available.get(b.name) else "unavailable"
    return info


def run_one(broker, scenario, *, scale=1.0, cap=20.0, params=None, cpus=(None, None),
            profile_format=None, rep=0, notes=None):
    """Start ``broker``, run the load generator for ``scenario`` against it, stop it.

    Returns the generator's result dict, or ``{"error": ...}`` (with
    ``start_failed`` when the broker never became ready). ``params`` overrides
    scenario parameters (the smoke test uses it); ``profile_format`` records
    the broker with py-spy.
    """
    notes = [] if notes is None else notes
    workdir = Path(tempfile.mkdtemp(prefix=f"twistmq-bench-{broker.name}-"))
    tag = f"{broker.name}-s{scenario}-r{rep + 1}"
    profiler = None
    try:
        running = broker.start(workdir, cpu=cpus[0], scenario=scenario)
    except BrokerStartError as e:
        kept = keep_log(workdir / f"{broker.name}.log", tag)
        shutil.rmtree(workdir, ignore_errors=True)
        return {"error": f"failed to start: {e}{kept}", "start_failed": True}
    result = {"error": "not run"}
    try:
        if profile_format:
            profiler = start_profiler(running, scenario, rep, profile_format, cpus[1])
        argv = [sys.executable, "-m", "bench.loadgen", "--port", str(running.port),
                "--scenario", str(scenario), "--scale", str(scale), "--cap", str(cap),
                "--broker-pid", str(running.pid), "--params", json.dumps(params or {}),
                "--workdir", str(workdir)]
        if cpus[1] is not None:
            argv = ["taskset", "-c", str(cpus[1])] + argv
        try:
            proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=3 * cap + 150)
        except subprocess.TimeoutExpired:
            result = {"error": "load generator timed out"}
            return result
        lines = proc.stdout.strip().splitlines()
        try:
            result = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            result = {"error": f"load generator failed ({proc.returncode}): {proc.stderr.strip()[-300:]}"}
            return result
        if "error" in result and result.get("errors"):
            result["error"] += ": " + "; ".join(result["errors"][:3])
        if running.proc.poll() is not None:
            result["error"] = (f"broker exited during the run ({running.proc.returncode}): "
                               f"{running.log_tail()}")
        return result
    finally:
        if profiler is not None:
            stop_profiler(profiler, notes)
        rc = running.stop(timeout=broker.stop_timeout)
        unclean = rc not in (0, -signal.SIGTERM) and broker.name == "twistmq"
        if "error" in result or result.get("errors") or unclean:
            kept = keep_log(running.log_path, tag)
            if "error" in result:
                result["error"] += kept
            if unclean:
                notes.append(f"{broker.label}, scenario {scenario} rep {rep + 1}: exit status {rc} "
                             f"after SIGTERM{kept}")
        shutil.rmtree(workdir, ignore_errors=True)


def keep_log(path, tag):
    """Copy a failed run's broker log to bench/out/; return a note saying where it went."""
    try:
        OUT.mkdir(parents=True, exist_ok=True)
        dest = OUT / f"log-{tag}-{datetime.datetime.now():%Y%m%d-%H%M%S}.log"
        shutil.copyfile(path, dest)
    except OSError:
        return ""
    return f" (broker log: {dest.relative_to(REPO)})"


def start_profiler(running, scenario, rep, fmt, cpu=None):
    """py-spy record against the broker process, into bench/out/ (py-spy on the generator's core)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    ext = {"flamegraph": "svg", "speedscope": "json", "raw": "txt"}[fmt]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = OUT / f"profile-{running.name}-s{scenario}-r{rep + 1}-{stamp}.{ext}"
    argv = [spy, "record", "--pid", str(running.pid), "--output", str(path),
            "--format", fmt, "--rate", "250", "--nonblocking"]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu)] + argv
    log = open(OUT / f"{path.stem}.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    time.sleep(0.5)  # let py-spy attach before the load starts
    return proc, path, log


def stop_profiler(profiler, notes):
    proc, path, log = profiler
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log.close()
    notes.append(f"profile: {path.relative_to(REPO)}" if path.exists()
                 else f"profile {path.name} not written (see {path.stem}.log)")


def describe(result):
    """One line about a run, for the progress output."""
    if "error" in result:
        return result["error"][:160]
    figs = ", ".join(f"{k}={v:,.4g}" if isinstance(v, (int, float)) else f"{k}={v}"
                     for k, v in result["figures"].items())
    cpu = (f"; CPU broker {result.get('broker_cpu')}, generator {result.get('gen_cpu')}, "
           f"others {result.get('other_cpu')}")
    return figs + (" (partial)" if result.get("partial") else "") + cpu


def all_settings(cpus, nofile):
    """Every setting, common and per broker, for the report."""
    settings = {"common": [s.format(broker_cpu=cpus[0], gen_cpu=cpus[1], nofile=nofile)
                           for s in COMMON_SETTINGS]}
    for b in BROKERS.values():
        settings[b.label] = b.settings()
    return settings


def rotate(brokers, rep):
    """The brokers in the order they run in repetition ``rep`` (alternating)."""
    k = rep % len(brokers) if brokers else 0
    return brokers[k:] + brokers[:k]


def phases(scenario):
    """Phases of a scenario that the cap bounds (scenario 6: the publishing and the drain)."""
    return 2 if scenario == 6 else 1


def plan_cap(pending, history, remaining, cap):
    """The cap for ``pending[0]`` so that every pending run fits in ``remaining`` seconds.

    A run whose (broker, scenario) has not run yet is assumed to take the full
    ``cap`` (the first repetition always runs at ``cap``); one that finished
    before its cap is assumed to take as long again; one that hit its cap
    keeps its fixed part (start, set-up, stop) and shares what is left of the
    budget with the others that hit it. Never below ``MIN_CAP``.
    """
    _, scenario, broker = pending[0]
    if (broker.name, scenario) not in history:
        return cap
    fixed, variable = 0.0, 0
    for _, s, b in pending:
        known = history.get((b.name, s))
        if known is None:
            fixed += RUN_OVERHEAD + phases(s) * cap
            continue
        duration, used, hit = known
        if hit and s != 4:
            fixed += max(0.0, duration - phases(s) * used)
            variable += phases(s)
        else:
            fixed += duration
    duration, used, hit = history[(broker.name, scenario)]
    if not hit or scenario == 4 or not variable:
        return cap
    return max(MIN_CAP, min(cap, (remaining - fixed) / variable))


def loadavg():
    """The 1-minute load average (0.0 if unknown)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def measure_jitter(cpu):
    """Timer wake-up lateness on the generator's core: the floor under the latency figures."""
    argv = [sys.executable, "-m", "bench.loadgen", "--jitter", "2"]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu)] + argv
    try:
        out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30).stdout
        j = json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, IndexError, ValueError):
        return {}
    return {"timer jitter": "1 ms epoll sleeps on the generator's core wake up late by "
                            f"p50 {j['p50_ms']:.3f} ms, "
                            f"p99 {j['p99_ms']:.2f} ms, max {j['max_ms']:.2f} ms ({j['samples']} samples, "
                            "measured before the runs): latencies below that are noise"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--brokers", default="twistmq,mosquitto,amqtt")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--cap", type=float, default=20.0)
    parser.add_argument("--profile", action="store_true", help="record the broker(s) with py-spy")
    parser.add_argument("--profile-brokers", default="twistmq")
    parser.add_argument("--profile-format", default="flamegraph", choices=["flamegraph", "speedscope", "raw"],
                        help="py-spy output: an SVG flame graph, speedscope JSON, or raw collapsed stacks "
                             "(summarise with python -m bench.profile_summary FILE)")
    parser.add_argument("--budget", type=float, default=18.0,
                        help="minutes for the whole comparison: later repetitions of runs that hit the cap "
                             "get a shorter cap (not below %g s) to stay within it" % MIN_CAP)
    parser.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument("--no-engine-rows", action="store_true",
                        help="skip the native protocol, timer and Spark rows (bench/engine_rows.py, ~6 min; "
                             "smaller counts when --scale < 1)")
    parser.add_argument("--no-cluster-rows", action="store_true",
                        help="skip fan-in, fan-out and latency through 1 and 2 proxy processes (bench/cluster_bench.py, "
                             "~4 min)")
    args = parser.parse_args(argv)
    if args.scenarios.strip().lower() == "none":
        args.scenarios = ""
    args.scenarios = [int(s) for s in args.scenarios.split(",") if s.strip()]
    args.brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    args.profile_brokers = [b.strip() for b in args.profile_brokers.split(",")]
    bad = [s for s in args.scenarios if s not in range(1, 9)] + [b for b in args.brokers if b not in BROKERS]
    if bad:
        parser.error(f"unknown scenario or broker: {bad}")
    return args


def engine_section(args) -> str | None:
    """Run the native, timer and Spark rows (unless skipped); their markdown section."""
    if args.no_engine_rows:
        return None
    load = f"{loadavg():.2f}"
    table, raw = engine_rows.run_all(quick=args.scale < 1)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (OUT / f"engine-rows-{stamp}.json").write_text(json.dumps(raw, indent=1, default=str))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return engine_rows.render(table, date, load)


def cluster_section(args) -> str | None:
    """Run the proxy/broker rows (unless skipped); their markdown section."""
    if args.no_cluster_rows:
        return None
    setups = cluster_bench.build_setups(["mosquitto", "node", "1", "2", "2x2", "2x1"])
    results = cluster_bench.run_all(setups, 1, 0.5 * args.scale, 15.0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return cluster_bench.render(setups, results, date, 0.5 * args.scale)


def main(argv=None):
    args = parse_args(argv)
    if not args.scenarios:  # the engine rows alone
        OUT.mkdir(parents=True, exist_ok=True)
        section = engine_section(args)
        if section is not None:
            if not args.no_write:
                engine_rows.write_section(DOC, section)
            print(section)
        clusters = cluster_section(args)
        if clusters is not None:
            if not args.no_write:
                cluster_bench.write_section(DOC, clusters)
            print(clusters)
        return 0
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cpus = (0, 1) if (os.cpu_count() or 1) >= 2 and shutil.which("taskset") else (None, None)
    brokers = [BROKERS[name] for name in args.brokers]
    states, available, notes = {}, {}, []
    for name in BROKERS:
        if name not in args.brokers:
            states[name] = "not run"
    for b in brokers:
        ok, reason = b.available()
        available[b.name] = ok
        if not ok:
            states[b.name] = "unavailable"
            notes.append(f"{b.label} unavailable: {reason}")
    if cpus[0] is None:
        notes.append("fewer than 2 CPUs or no taskset: broker and generator were NOT pinned")
    results = {b.name: {} for b in brokers}
    load_start = loadavg()
    jitter = measure_jitter(cpus[1])
    deadline = started + args.budget * 60
    runs = [(rep, scenario, b) for rep in range(args.reps) for scenario in args.scenarios
            for b in rotate(brokers, rep) if not states.get(b.name)]
    history, lowered = {}, []
    for done, (rep, scenario, b) in enumerate(runs, 1):
        if states.get(b.name):
            continue
        pending = [r for r in runs[done - 1:] if not states.get(r[2].name)]
        cap = plan_cap(pending, history, deadline - time.monotonic(), args.cap)
        if cap < args.cap:
            lowered.append(cap)
        t0 = time.monotonic()
        profile = args.profile_format if args.profile and b.name in args.profile_brokers else None
        result = run_one(b, scenario, scale=args.scale, cap=cap, cpus=cpus,
                         profile_format=profile, rep=rep, notes=notes)
        result["cap"] = cap
        duration = time.monotonic() - t0
        history[(b.name, scenario)] = (duration, cap, bool(result.get("partial")))
        results[b.name].setdefault(scenario, []).append(result)
        print(f"[{done}/{len(runs)}] scenario {scenario} rep {rep + 1} {b.label}: {describe(result)} "
              f"(cap {cap:.0f} s, {duration:.1f} s)", file=sys.stderr, flush=True)
        if result.get("start_failed"):
            states[b.name] = "failed to start"
            notes.append(f"{b.label} {result['error']}")
        elif "error" in result:
            notes.append(f"{b.label}, scenario {scenario} rep {rep + 1}: {result['error']}")
    if lowered:
        notes.append(f"to finish within the {args.budget:g}-minute budget, {len(lowered)} later run(s) of "
                     "brokers "
                     f"that had hit the cap ran with a cap of {min(lowered):.0f}–{max(lowered):.0f} s "
                     f"instead of {args.cap:g} s (their figures are marked partial either way)")
    other = [r["other_cpu"] for rs in results.values() for runs_ in rs.values() for r in runs_
             if r.get("other_cpu") is not None]
    if other and statistics.mean(other) > BUSY_OTHER:
        notes.append(f"other processes on this machine used {statistics.mean(other):.2f} CPUs on average "
                     f"(up to {max(other):.2f}) during the measured phases, on {os.cpu_count()} CPUs: "
                     "the figures are noisier and lower than on an idle machine")
    for b in brokers:
        busy = {sc: max(r["gen_cpu"] for r in rs if r.get("gen_cpu") is not None)
                for sc, rs in results[b.name].items() if any(r.get("gen_cpu") is not None for r in rs)}
        busy = {sc: v for sc, v in sorted(busy.items()) if v > GEN_BUSY}
        if busy:
            notes.append(f"against {b.label} the generator used up to "
                         + ", ".join(f"{v:.0%} of its core in scenario {sc}" for sc, v in busy.items())
                         + ": those figures may be the generator's limit (a lower bound for the broker)")
    settings = all_settings(cpus, nofile)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.compare " + " ".join(sys.argv[1:] if argv is None else argv),
        "reps": args.reps, "scale": args.scale, "cap": args.cap,
        "duration_min": (time.monotonic() - started) / 60,
        "machine": {**machine_info(brokers, available), **jitter,
                    "load average (1 min) before the runs": f"{load_start:.2f}"},
        "scenario_notes": [n for n in scenario_notes(args.scale) if int(n.split(":")[0]) in args.scenarios],
        "notes": notes,
    }
    doc = report.render(meta, results, states, settings)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (OUT / f"results-{stamp}.json").write_text(json.dumps(
        {"meta": meta, "states": states, "results": results, "settings": settings}, indent=1, default=str))
    section = engine_section(args)
    clusters = cluster_section(args)
    if not args.no_write:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        chaos = chaos_report.kept_section(DOC)  # bench/chaos.py's figures: not rerun here, kept
        DOC.write_text(doc)
        if chaos is not None:
            engine_rows.write_section(DOC, chaos, chaos_report.SECTION_START, chaos_report.SECTION_END)
        if section is not None:
            engine_rows.write_section(DOC, section)
        if clusters is not None:
            cluster_bench.write_section(DOC, clusters)
    print(doc)
    for extra in (section, clusters):
        if extra is not None:
            print(extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
