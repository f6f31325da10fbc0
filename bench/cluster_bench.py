"""Fan-in, fan-out and proxy-hop latency through 1 and 2 proxy processes against one broker, beside Mosquitto.

Usage::

    ./dev python -m bench.cluster_bench                  # every setup x 3 scenarios, one run, ~4 min
    ./dev python -m bench.cluster_bench --reps 3 --scale 0.25

Setups, each fresh for every scenario and started in turn on the same 2 cores
(nothing pinned: the cluster's processes and the load generator share both):

- ``mosquitto``: Mosquitto 2 (one process, its queue limit lifted);
- ``node``: twistmq in one process (the embedded default);
- ``1 proxy``: a broker process + one proxy process (``./dev cluster up --proxies 1``);
- ``2 proxies``: a broker + two proxies sharing the MQTT port (``--shared-port``, SO_REUSEPORT).

Scenarios (``bench/loadgen.py``): fan-in QoS 1 (4 publishers, window 100 → one
``dev/+/temp`` subscriber), fan-out (1 QoS 0 publisher → 500 subscribers) and
QoS 1 latency at 1,000 msg/s (p50/p99 send-to-delivery). The proxy hop is
the latency of ``1 proxy`` minus ``node``'s. Figures are from one run of each
setup per repetition (medians over repetitions); the machine is shared, so
compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import engine_rows
from bench.brokers import BROKERS
from cluster.tools import launcher

SCENARIOS = {2: "fan-in QoS 1, msg/s", 3: "fan-out 1 -> 500, deliveries/s", 4: "QoS 1 latency at 1k msg/s, ms"}
BASE_CONFIG = "[mqtt]\nallow_anonymous = true\n"


class ClusterSetup:
    """A broker and ``proxies`` proxies from the launcher; MQTT on the first proxy's port (shared if 2)."""

    def __init__(self, proxies: int) -> None:
        self.proxies = proxies
        self.name = f"{proxies} prox{'y' if proxies == 1 else 'ies'}"

    def start(self, workdir: Path):
        base = workdir / "base.toml"
        base.write_text(BASE_CONFIG)
        doc = launcher.up(str(workdir / "c"), groups=1, proxies=self.proxies, shared_port=self.proxies > 1,
                          base_config=str(base))
        self.root = str(workdir / "c")
        proxy = [p for p in doc["processes"] if p["role"] == "proxy"][0]
        self.pids = [p["pid"] for p in doc["processes"]]
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
    return figures.get("rate")


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
    return setups


def run_all(setups, reps: int = 1, scale: float = 0.5, cap: float = 15.0) -> dict:
    """Every scenario on every setup, setups rotating per repetition; {(scenario, setup name): [result]}."""
    results: dict = {}
    for rep in range(reps):
        for scenario in SCENARIOS:
            for setup in setups[rep % len(setups):] + setups[:rep % len(setups)]:
                with tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
                    port = setup.start(Path(tmp))
                    try:
                        result = run_scenario(scenario, port, scale, cap)
                    finally:
                        setup.stop()
                results.setdefault((scenario, setup.name), []).append(result)
                print(f"cluster rows: rep {rep + 1} {SCENARIOS[scenario]:34} {setup.name:10} "
                      f"{figure(result, scenario)!s}", file=sys.stderr, flush=True)
    return results


SECTION_START, SECTION_END = "<!-- cluster-rows:start -->", "<!-- cluster-rows:end -->"


def render(setups, results, date: str, scale: float) -> str:
    """The markdown section for docs/benchmarks.md."""
    lines = [SECTION_START, "## Proxies and brokers as processes", "",
             f"Run {date} by `bench/cluster_bench.py` (`./dev bench`; `--no-cluster-rows` skips it), loadgen scale "
             f"{scale:g}, every setup fresh per scenario, nothing pinned: the processes and the generator share the "
             "2 cores. `1 proxy` and `2 proxies` are one broker plus proxies (`./dev cluster up --groups 1`, the "
             "two proxies on one port with SO_REUSEPORT).", ""]
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
    parser.add_argument("--setups", default="mosquitto,node,1,2")
    args = parser.parse_args(argv)
    setups = build_setups(args.setups.split(","))
    results = run_all(setups, args.reps, args.scale, args.cap)
    print("\n".join(table_lines(setups, results)))
    return 0


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table_lines(setups, results) -> list[str]:
    names = [s.name for s in setups]
    out = ["| scenario | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for scenario, title in SCENARIOS.items():
        cells = []
        for name in names:
            runs = results.get((scenario, name), [])
            if scenario == 4:
                p50 = _median([figure(r, 4)[0] for r in runs if "error" not in r])
                p99 = _median([figure(r, 4)[1] for r in runs if "error" not in r])
                cells.append("-" if p50 is None else f"{p50:.2f} / {p99:.2f}")
            else:
                rate = _median([figure(r, scenario) for r in runs if "error" not in r])
                cells.append("-" if rate is None else f"{rate:,.0f}")
        out.append(f"| {title} | " + " | ".join(cells) + " |")
    if "node" in names and "1 proxy" in names:
        node = results.get((4, "node"), [])
        hop = results.get((4, "1 proxy"), [])
        if node and hop:
            p50 = _median([figure(r, 4)[0] for r in hop]) - _median([figure(r, 4)[0] for r in node])
            p99 = _median([figure(r, 4)[1] for r in hop]) - _median([figure(r, 4)[1] for r in node])
            out += ["", f"Proxy hop (1 proxy minus node, QoS 1 at 1k msg/s): p50 {p50:+.2f} ms, p99 {p99:+.2f} ms."]
    return out


if __name__ == "__main__":
    sys.exit(main())
