"""The cluster's data path beside the node and Mosquitto: fan-in, fan-out, proxy-hop latency, connect rate, CPU.

Usage::

    ./dev python -m bench.cluster_bench                  # every setup x 3 scenarios, one run, ~4 min
    ./dev python -m bench.cluster_bench --reps 3 --scale 0.25

Setups, each fresh for every scenario and started in turn on the same 2 cores
(nothing pinned: the cluster's processes and the load generator share both):

- ``mosquitto``: Mosquitto 2 (one process, its queue limit lifted);
- ``node``: twistmq in one process (the embedded default);
- ``1 proxy``: a broker process + one proxy process (``./dev cluster up --proxies 1``);
- ``2 proxies``: a broker + two proxies sharing the MQTT port (``--shared-port``, SO_REUSEPORT);
- ``2x2``: two broker groups + two proxies on one port (topics hash over both groups): the
  projection's second point, one group and one proxy per core;
- ``2x1``: two broker groups + one proxy, the connect rate only (a CONNECT claims the
  session in every group).

Scenarios (``bench/loadgen.py``): fan-in QoS 1 (4 publishers, window 100 → one
``dev/+/temp`` subscriber), fan-out (1 QoS 0 publisher → 500 subscribers),
QoS 1 latency at 1,000 msg/s (p50/p99 send-to-delivery) and the connect rate
(10,000 clients, 100 handshakes at once). The proxy hop is the latency of
``1 proxy`` minus ``node``'s. Figures are from one run of each setup per
repetition (medians over repetitions); the machine is shared, so compare
ratios within one run.

CPU: user + system seconds of the data path's processes (brokers and proxies,
read from ``/proc/PID/stat`` before and after each run, connection set-up
included, the same for the node), per message delivered; the controllers'
CPU over the same run is reported beside it, never inside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import engine_rows
from bench.brokers import BROKERS
from cluster.tools import launcher

SCENARIOS = {2: "fan-in QoS 1, msg/s", 3: "fan-out 1 -> 500, deliveries/s", 4: "QoS 1 latency at 1k msg/s, ms",
             5: "connect rate, connections/s"}
CPU_SCENARIOS = {2: "CPU per fan-in QoS 1 message, µs", 3: "CPU per fan-out delivery, µs"}
# As the node's (bench/brokers.py): no log line per client connecting or leaving, in every process.
BASE_CONFIG = "[mqtt]\nallow_anonymous = true\n\n[log]\nconnection_messages = false\n"
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids) -> float:
    """User + system CPU seconds of the processes still alive among ``pids``."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICKS
    return total


class ClusterSetup:
    """``groups`` brokers and ``proxies`` proxies from the launcher; MQTT on the first proxy's port (shared if 2)."""

    def __init__(self, proxies: int, groups: int = 1, only=None) -> None:
        self.proxies = proxies
        self.groups = groups
        self.only = only  # the scenarios this setup runs (None: every one)
        self.name = f"{proxies} prox{'y' if proxies == 1 else 'ies'}" if groups == 1 else f"{groups}x{proxies}"

    def start(self, workdir: Path):
        base = workdir / "base.toml"
        base.write_text(BASE_CONFIG)
        doc = launcher.up(str(workdir / "c"), groups=self.groups, proxies=self.proxies,
                          shared_port=self.proxies > 1, base_config=str(base))
        self.root = str(workdir / "c")
        proxy = [p for p in doc["processes"] if p["role"] == "proxy"][0]
        self.pids = [p["pid"] for p in doc["processes"] if p["role"] in ("broker", "proxy")]
        self.side_pids = [p["pid"] for p in doc["processes"] if p["role"] not in ("broker", "proxy")]
        return proxy["ports"]["mqtt"]

    def stop(self) -> None:
        launcher.down(self.root)


class SingleSetup:
    def __init__(self, broker_name: str, label: str) -> None:
        self.broker = BROKERS[broker_name]
        self.name = label

    def start(self, workdir: Path):
        self.running = self.broker.start(workdir)
        self.pids = [self.running.pid]
        self.side_pids = []
        return self.running.port

    def stop(self) -> None:
        self.running.stop(self.broker.stop_timeout)


def run_scenario(scenario: int, port: int, scale: float, cap: float) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.loadgen", "--scenario", str(scenario), "--port", str(port),
                          "--scale", str(scale), "--cap", str(cap)], capture_output=True, text=True,
                         timeout=cap * 4 + 120)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def figure(result: dict, scenario: int):
    figures = result.get("figures") or {}
    if scenario == 4:
        return figures.get("p50_ms"), figures.get("p99_ms")
    if scenario == 5:
        return figures.get("connect_rate")
    return figures.get("rate")


def cpu_per_message(result: dict):
    """µs of data-path CPU per message delivered (None without a count)."""
    delivered = result.get("delivered") or 0
    cpu = result.get("cluster_cpu_s")
    return None if not delivered or cpu is None else cpu / delivered * 1e6


def build_setups(wanted) -> list:
    setups = []
    if "mosquitto" in wanted:
        ok, reason = BROKERS["mosquitto"].available()
        if ok:
            setups.append(SingleSetup("mosquitto", "mosquitto"))
        else:
            print(f"cluster_bench: no mosquitto: {reason}", file=sys.stderr)
    if "node" in wanted:
        setups.append(SingleSetup("twistmq", "node"))
    setups += [ClusterSetup(int(n)) for n in ("1", "2") if n in wanted]
    if "2x2" in wanted:
        setups.append(ClusterSetup(2, groups=2))
    if "2x1" in wanted:
        setups.append(ClusterSetup(1, groups=2, only=(5,)))
    return setups


# Fan-out runs 4x the messages of the others (2,000 at scale 0.5: a million deliveries). With 1,000 its 0.3 s
# run was a quarter the set-up of its 500 clients (CONNECT, claim, SUBSCRIBE, release), which is no part of
# a delivery's cost and costs a cluster more than a node: its CPU per delivery read 1.37-1.49x the node's,
# against 1.16x with 4x the messages (2026-11-26, 3 runs each).
SCENARIO_SCALE = {3: 4.0}


def run_all(setups, reps: int = 1, scale: float = 0.5, cap: float = 15.0, scenarios=tuple(SCENARIOS)) -> dict:
    """Every scenario on every setup, setups rotating per repetition; {(scenario, setup name): [result]}."""
    results: dict = {}
    for rep in range(reps):
        for scenario in scenarios:
            for setup in setups[rep % len(setups):] + setups[:rep % len(setups)]:
                if scenario not in (getattr(setup, "only", None) or (scenario,)):
                    continue
                with tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
                    port = setup.start(Path(tmp))
                    try:
                        before, side = cpu_seconds(setup.pids), cpu_seconds(setup.side_pids)
                        result = run_scenario(scenario, port, scale * SCENARIO_SCALE.get(scenario, 1.0), cap)
                        result["cluster_cpu_s"] = cpu_seconds(setup.pids) - before
                        result["side_cpu_s"] = cpu_seconds(setup.side_pids) - side
                    finally:
                        setup.stop()
                results.setdefault((scenario, setup.name), []).append(result)
                cpu = cpu_per_message(result)
                print(f"cluster rows: rep {rep + 1} {SCENARIOS[scenario]:34} {setup.name:10} "
                      f"{figure(result, scenario)!s}" + (f" cpu {cpu:.2f} µs/msg" if cpu is not None else "")
                      + f" (controllers {result.get('side_cpu_s', 0):.2f} s)", file=sys.stderr, flush=True)
    return results


SECTION_START, SECTION_END = "<!-- cluster-rows:start -->", "<!-- cluster-rows:end -->"


def render(setups, results, date: str, scale: float) -> str:
    """The markdown section for docs/benchmarks.md."""
    lines = [SECTION_START, "## Proxies and brokers as processes", "",
             f"Run {date} by `bench/cluster_bench.py` (`./dev bench`; `--no-cluster-rows` skips it), loadgen scale "
             f"{scale:g} (fan-out {scale * SCENARIO_SCALE[3]:g}: its clients' set-up, counted in its CPU, is then "
             "a small part of a run), every setup fresh per scenario, nothing pinned: the processes and the "
             "generator share the 2 cores. `1 proxy` and `2 proxies` are one broker plus proxies (`./dev cluster "
             "up --groups 1`, the two proxies on one port with SO_REUSEPORT); `2x2` two broker groups and two "
             "proxies on one port; `2x1` two broker groups and one proxy, run for the connect rate only (a CONNECT "
             "claims and reads the session in its home group; a fresh client id is claimed in the other group at "
             "its session's first write there).", ""]
    lines += table_lines(setups, results)
    lines += ["", SECTION_END, ""]
    return "\n".join(lines)


def write_section(doc: Path, section: str) -> None:
    """Put ``section`` into ``doc``, replacing an earlier one."""
    engine_rows.write_section(doc, section, SECTION_START, SECTION_END)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--scale", type=float, default=0.5, help="multiplies message counts (loadgen --scale)")
    parser.add_argument("--cap", type=float, default=15.0, help="seconds of sending per phase")
    parser.add_argument("--setups", default="mosquitto,node,1,2,2x2,2x1")
    parser.add_argument("--scenarios", default="2,3,4,5", help="of " + ", ".join(f"{k}: {v}" for k, v in
                                                                              SCENARIOS.items()))
    args = parser.parse_args(argv)
    setups = build_setups(args.setups.split(","))
    results = run_all(setups, args.reps, args.scale, args.cap, [int(s) for s in args.scenarios.split(",")])
    print("\n".join(table_lines(setups, results)))
    return 0


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table_lines(setups, results) -> list[str]:
    names = [s.name for s in setups]
    out = ["| scenario | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    ran = sorted({scenario for scenario, _ in results})
    for scenario in ran:
        cells = []
        for name in names:
            runs = [r for r in results.get((scenario, name), []) if "error" not in r]
            if scenario == 4:
                p50 = _median([figure(r, 4)[0] for r in runs])
                p99 = _median([figure(r, 4)[1] for r in runs])
                cells.append("-" if p50 is None else f"{p50:.2f} / {p99:.2f}")
            else:
                rate = _median([figure(r, scenario) for r in runs])
                cells.append("-" if rate is None else f"{rate:,.0f}")
        out.append(f"| {SCENARIOS[scenario]} | " + " | ".join(cells) + " |")
    for scenario, title in CPU_SCENARIOS.items():
        if scenario not in ran:
            continue
        cells = []
        for name in names:
            cpu = _median([cpu_per_message(r) for r in results.get((scenario, name), []) if "error" not in r])
            cells.append("-" if cpu is None else f"{cpu:.2f}")
        out.append(f"| {title} (brokers + proxies) | " + " | ".join(cells) + " |")
    out += _ratio_lines(names, results, ran)
    return out


def _ratio_lines(names, results, ran) -> list[str]:
    """Each cluster setup over the node (same run): throughput, CPU per message, the proxy hop's latency."""
    if "node" not in names:
        return []

    def med(scenario, name, fn):
        return _median([fn(r) for r in results.get((scenario, name), []) if "error" not in r])

    out = [""]
    for name in names:
        if name in ("node", "mosquitto"):
            continue
        parts = []
        for scenario in (2, 3, 5):
            if scenario in ran:
                node, this = med(scenario, "node", lambda r: figure(r, scenario)), \
                    med(scenario, name, lambda r: figure(r, scenario))
                if node and this:
                    parts.append(f"{SCENARIOS[scenario].split(',')[0]} {this / node:.2f}× the node's")
        for scenario in (2, 3):
            if scenario in ran:
                node, this = med(scenario, "node", cpu_per_message), med(scenario, name, cpu_per_message)
                if node and this:
                    parts.append(f"CPU per {'fan-in message' if scenario == 2 else 'fan-out delivery'} "
                                 f"{this / node:.2f}× the node's")
        if 4 in ran:
            node = results.get((4, "node"), [])
            hop = results.get((4, name), [])
            if node and hop:
                p50 = _median([figure(r, 4)[0] for r in hop]) - _median([figure(r, 4)[0] for r in node])
                p99 = _median([figure(r, 4)[1] for r in hop]) - _median([figure(r, 4)[1] for r in node])
                parts.append(f"QoS 1 latency at 1k msg/s p50 {p50:+.2f} ms, p99 {p99:+.2f} ms over the node")
        if parts:
            out.append(f"- {name}: " + "; ".join(parts) + ".")
    out += _projection_lines(names, results, ran, med)
    return out


def _projection_lines(names, results, ran, med, cores: int = 16) -> list[str]:
    """Fan-in throughput per added core, from the CPU per message measured with 1 and with 2 groups (+ proxies)."""
    if 2 not in ran or "node" not in names:
        return []
    node_rate = med(2, "node", lambda r: figure(r, 2))
    costs = {name: med(2, name, cpu_per_message) for name in names if name not in ("node", "mosquitto")}
    costs = {name: c for name, c in costs.items() if c}
    if not costs or not node_rate:
        return []
    worst = max(costs.values())  # the dearer of the setups measured: no credit for a cheaper small setup
    projected = cores * 1e6 / worst
    mosquitto = med(2, "mosquitto", lambda r: figure(r, 2)) if "mosquitto" in names else None
    line = ("- projection (fan-in QoS 1): the data path costs " + ", ".join(f"{c:.2f} µs per message with {n}"
                                                                           for n, c in costs.items())
            + f"; a core carries about {1e6 / worst:,.0f} msg/s of it, so {cores} cores ({cores // 2} groups + "
            f"{cores // 2} proxies, topics spread over the groups) would carry about {projected:,.0f} msg/s: "
            f"{projected / node_rate:.1f}× one node ({node_rate:,.0f} msg/s, one core)")
    if mosquitto:
        line += f" and {projected / mosquitto:.1f}× Mosquitto ({mosquitto:,.0f} msg/s, one thread)"
    line += (". What 2 cores cannot show: the generator's own limit, contention between more processes on one "
             "port, memory bandwidth, and fan-out across groups (each proxy then reads every group).")
    return [line]


if __name__ == "__main__":
    sys.exit(main())
