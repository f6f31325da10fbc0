"""The comparison report: per-figure medians and ranges, ratios, and docs/benchmarks.md.

``render()`` turns the raw results of ``bench/compare.py`` (broker -> scenario
-> list of loadgen result dicts, one per repetition) into markdown: the table
first, then CPU use, the scenarios as run, machine, versions and every broker
setting. To re-render a saved run (``bench/out/results-*.json``)::

    python -m bench.report bench/out/results-STAMP.json [--write]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench.loadgen import params_for

HIGHER, LOWER = "higher", "lower"


def _rows(scale):
    """(scenario, figure key, label, unit, better) for every table row."""
    p = {n: params_for(n, scale) for n in range(1, 9)}
    return [
        (1, "rate", f"1 fan-in QoS 0, 4 pub -> 1 sub, {p[1]['messages']:,} msgs", "msg/s", HIGHER),
        (1, "loss", "1 fan-in QoS 0: loss", "%", LOWER),
        (2, "rate", f"2 fan-in QoS 1, window 100, {p[2]['messages']:,} msgs", "msg/s", HIGHER),
        (2, "accept_rate", "2 fan-in QoS 1: publishes accepted (PUBACKed)", "msg/s", HIGHER),
        (2, "loss", "2 fan-in QoS 1: loss", "%", LOWER),
        (3, "rate", f"3 fan-out QoS 0, 1 pub -> {p[3]['subscribers']} subs on dev/#, "
                    f"{p[3]['messages']:,} msgs", "deliveries/s", HIGHER),
        (3, "loss", "3 fan-out: loss", "%", LOWER),
        (4, "p50_ms", f"4 latency QoS 1 at {p[4]['rate']:,} msg/s for {p[4]['seconds']:g} s: p50", "ms",
         LOWER),
        (4, "p99_ms", "4 latency: p99", "ms", LOWER),
        (4, "max_ms", "4 latency: max", "ms", LOWER),
        (4, "loss", "4 latency: loss", "%", LOWER),
        (5, "rss_per_conn", f"5 {p[5]['connections']:,} idle connections: broker RSS per connection",
         "bytes", LOWER),
        (5, "connect_rate", "5 idle connections: connect rate", "conn/s", HIGHER),
        (6, "drain_s", f"6 offline persistent sub, {p[6]['messages']:,} QoS 1 msgs: drain time", "s", LOWER),
        (6, "rss_growth", "6 offline: broker RSS growth while offline", "MB", LOWER),
        (6, "accept_rate", "6 offline: publishes accepted (PUBACKed) while offline", "msg/s", HIGHER),
        (6, "loss", "6 offline: loss", "%", LOWER),
        (7, "rate", f"7 fan-in QoS 0 with {p[7]['filters']:,} other filters, "
                    f"{p[7]['messages']:,} msgs: routed", "msg/s", HIGHER),
        (7, "loss", "7 wildcard fan-in: loss", "%", LOWER),
        (8, "accept_rate", f"8 offline fan-out: {p[8]['sessions']:,} offline persistent sessions x "
                           f"{p[8]['messages']:,} QoS 1 msgs of {p[8]['payload']} B: accepted", "msg/s", HIGHER),
        (8, "rss_growth", "8 offline fan-out: broker RSS growth", "MB", LOWER),
        (8, "disk_growth", "8 offline fan-out: bytes written to disk", "MB", LOWER),
        (8, "loss", f"8 offline fan-out: loss ({p[8]['sample']} sessions reconnect)", "%", LOWER),
    ]


def _fmt(value, unit):
    if value is None:
        return "n/a"
    if unit == "bytes":
        return f"{value / 1024:,.1f} KB" if abs(value) >= 10240 else f"{value:,.0f} B"
    if unit == "MB":
        return f"{value / 1e6:,.1f}"
    if unit == "%":
        return "0" if value == 0 else f"{value:.3g}"
    if unit == "ms":
        return f"{value:.3g}" if value < 100 else f"{value:,.0f}"
    if unit == "s":
        return f"{value:.3g}"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def summarise(runs, key):
    """``(median, lo, hi, partial, n_ok)`` of figure ``key`` over ``runs``; None when no value."""
    ok = [r for r in runs if "error" not in r]
    values = [r["figures"].get(key) for r in ok]
    values = [v for v in values if v is not None]
    partial = any(r.get("partial") for r in ok)
    if not values:
        return None, None, None, partial, len(ok)
    return statistics.median(values), min(values), max(values), partial, len(ok)


def cell(runs, key, unit, state):
    """The table cell for one broker and figure."""
    if state:
        return state
    if not runs:
        return "not run"
    if all("error" in r for r in runs):
        return "error"
    med, lo, hi, partial, _ = summarise(runs, key)
    mark = "\\*" if partial else ""
    if med is None:
        return "n/a" + mark
    text = _fmt(med, unit) + mark
    if len([r for r in runs if "error" not in r]) > 1 and lo != hi:
        text += f" ({_fmt(lo, unit)}–{_fmt(hi, unit)})"
    return text


def ratio(a_runs, b_runs, key, unit):
    """twistmq median / other median, or an em dash when either is missing."""
    if unit == "%":
        return "—"
    a = summarise(a_runs, key)[0] if a_runs else None
    b = summarise(b_runs, key)[0] if b_runs else None
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}×"


def table(results, states, scale):
    """The markdown table: one row per figure, a column per broker and the two ratios."""
    labels = {"twistmq": "twistmq", "mosquitto": "Mosquitto", "amqtt": "amqtt"}
    head = ["figure", "unit", "better", *labels.values(), "twistmq/Mosquitto", "twistmq/amqtt"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    scenarios = {s for b in results.values() for s in b}
    for scenario, key, label, unit, better in _rows(scale):
        if scenario not in scenarios:
            continue
        runs = {name: results.get(name, {}).get(scenario, []) for name in labels}
        cells = [cell(runs[name], key, unit, states.get(name)) for name in labels]
        tw = runs["twistmq"] if not states.get("twistmq") else []
        lines.append("| " + " | ".join([
            label, unit, better, *cells,
            ratio(tw, runs["mosquitto"], key, unit), ratio(tw, runs["amqtt"], key, unit),
        ]) + " |")
    return "\n".join(lines)


def cpu_table(results, states):
    """Median CPU share of one core, broker and generator, per scenario and broker."""
    labels = {"twistmq": "twistmq", "mosquitto": "Mosquitto", "amqtt": "amqtt"}
    names = [n for n in labels if results.get(n) and not states.get(n)]
    if not names:
        return ""
    lines = ["| scenario | " + " | ".join(labels[n] for n in names) + " |", "|" + " --- |" * (len(names) + 1)]
    for scenario in sorted({s for n in names for s in results[n]}, key=int):
        cells = []
        for n in names:
            runs = [r for r in results[n].get(scenario, []) if "error" not in r]
            b = [r["broker_cpu"] for r in runs if r.get("broker_cpu") is not None]
            g = [r["gen_cpu"] for r in runs if r.get("gen_cpu") is not None]
            o = [r["other_cpu"] for r in runs if r.get("other_cpu") is not None]
            text = f"{statistics.median(b):.0%} / {statistics.median(g):.0%}" if b and g else "n/a"
            cells.append(text + (f" / {statistics.median(o):.0%}" if o and b and g else ""))
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(meta, results, states, settings):
    """The whole of docs/benchmarks.md."""
    out = [
        "# twistmq benchmarks",
        "",
        f"Run {meta['date']} with `{meta['command']}`: {meta['reps']} repetition(s) per broker, "
        f"brokers alternating, scale {meta['scale']:g}, sending capped at {meta['cap']:g} s per phase; "
        f"took {meta['duration_min']:.1f} min. Generated by `bench/compare.py`; do not edit by hand.",
        "",
        table(results, states, meta["scale"]),
        "",
        "Cells are the median with the min–max over repetitions in brackets. `*`: partial, the broker "
        f"did not finish within the cap ({meta['cap']:g} s of sending per phase, less for some later "
        "repetitions if the time budget required it: see the notes) and the figure is what it reached by "
        "then (loss is n/a for such runs). Ratios are twistmq's median over the other broker's; where "
        "lower is better, a ratio below 1 favours twistmq. \"not run\": the broker was not selected "
        "(`--brokers`); \"unavailable\"/\"failed to start\": see the notes.",
        "",
        "## CPU use",
        "",
        "Share of one core used during the measured phase: broker / load generator / every other process "
        "on the machine (medians; scenario 6: the busier of its two phases). A broker near 100% set the "
        "pace; the generator near 100% would mean the figure is the generator's limit; other processes "
        "above a few % mean the machine was not quiet.",
        "",
        cpu_table(results, states),
        "",
        "## Scenarios as run",
        "",
    ]
    out += [f"- {line}" for line in meta["scenario_notes"]]
    out += ["", "## Machine and versions", ""]
    out += [f"- {k}: {v}" for k, v in meta["machine"].items()]
    out += ["", "## Settings", ""]
    for name, lines in settings.items():
        out.append(f"**{name}**")
        out.append("")
        out += [f"- {line}" for line in lines]
        out.append("")
    out += ["## Notes", ""]
    out += [f"- {line}" for line in meta["notes"]] or ["- none"]
    out.append("")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description="re-render a saved comparison (bench/out/results-*.json)")
    parser.add_argument("results", type=Path)
    parser.add_argument("--write", action="store_true", help="also write docs/benchmarks.md")
    args = parser.parse_args(argv)
    saved = json.loads(args.results.read_text())
    results = {b: {int(s): runs for s, runs in by_s.items()} for b, by_s in saved["results"].items()}
    settings = saved.get("settings")
    if settings is None:  # saved before settings were kept: today's (the same unless bench/ changed)
        import resource

        from bench.compare import all_settings
        settings = all_settings((0, 1), resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    doc = render(saved["meta"], results, saved["states"], settings)
    if args.write:
        out = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(doc)
    print(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
