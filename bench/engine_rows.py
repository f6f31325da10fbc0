"""The native protocol, timer and Spark rows of ``./dev bench``: each figure beside its reference, from one run.

    ./dev bench                                   # the broker comparison, then these rows
    ./dev bench --scenarios none                  # these rows only (about 6 minutes)
    ./dev python -m bench.engine_rows [--quick]   # the same, without the broker comparison

Rows (the issue that set the targets: native at queue_server's speed, timers on
time, Spark at Parquet speed):

- native: ``bench.native_bench``: a server process pinned to CPU 0, the client
  (8 connections x 10,000 produce+consume pairs, one request in flight each)
  pinned to CPU 1; TPS counts requests; reference queue_server's ~14,000 TPS at
  0.6 ms (C++, 4 cores, no persistence: every twistmq message is in the commit log);
- timer: ``bench.timer_bench``: 1,000,000 delayed messages due over 120 s,
  lateness of each put back; reference RocketMQ's second-level precision;
- Spark: ``bench/spark_bench.py``: the data source's batch read of a store vs
  Spark reading Parquet of the same rows, in the same session (``local[2]``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTION_START = "<!-- engine-rows:start -->"
SECTION_END = "<!-- engine-rows:end -->"


def run_native(pairs: int) -> dict:
    from bench import native_bench

    return native_bench.bench_queue(8, pairs)


def run_timer(count: int, window: float) -> dict:
    from bench import timer_bench

    return timer_bench.run_child(count, window)


def run_spark(messages: int, reps: int) -> dict:
    child = subprocess.run([sys.executable, str(REPO / "bench" / "spark_bench.py"), "--messages", str(messages),
                            "--reps", str(reps)], capture_output=True, text=True, cwd=REPO)
    if child.returncode != 0:
        tail = (child.stderr or child.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"spark_bench exited {child.returncode}: {tail[0][:200]}"}
    return json.loads(child.stdout.strip().splitlines()[-1])


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def rows(native: dict, timer: dict, spark: dict) -> list[tuple[str, str, str, str, str, str]]:
    """(path, twistmq, reference, must reach, aim, verdict) for each figure."""
    out = []
    if "error" in native:
        out.append(("native, 8 x produce+consume", native["error"], "", "", "", "not run"))
    else:
        tps, avg = native["tps"], native["avg_ms"]
        label = f"native, 8 connections x {native['requests'] // 8:,} requests, one in flight each"
        out.append((f"{label}: TPS", f"{tps:,.0f}", "queue_server ~14,000", ">= 10,000", "14,000",
                    _met(tps >= 10_000) + ("; aim met" if tps >= 14_000 else "")))
        out.append(("native: average latency", f"{avg:.2f} ms (p99 {native['p99_ms']:.2f} ms)",
                    "queue_server 0.6 ms", "< 0.8 ms", "< 0.6 ms",
                    _met(avg < 0.8) + ("; aim met" if avg < 0.6 else "")))
        out.append(("native: server CPU per request", f"{native['server_cpu_us_per_request']:.0f} µs "
                    f"({native['server_cpu_share']:.0%} of its core)", "", "", "", ""))
        if "client_cpu_us_per_request" in native:
            out.append((f"native: client CPU per request ({native.get('client', 'socket')} client)",
                        f"{native['client_cpu_us_per_request']:.0f} µs", "", "", "", ""))
    if "error" in timer:
        out.append(("timer", timer["error"], "", "", "", "not run"))
    else:
        p99 = timer["p99_ms"]
        out.append((f"timer: {timer['count']:,} delayed messages, lateness p99 (p50 / max)",
                    f"{p99:.0f} ms ({timer['p50_ms']:.0f} / {timer['max_ms']:.0f} ms), "
                    f"{timer['delivered']:,} delivered", "RocketMQ timer: second-level precision", "<= 200 ms",
                    "<= 100 ms", _met(p99 <= 200 and timer["delivered"] == timer["count"])
                    + ("; aim met" if p99 <= 100 else "")))
    if "error" in spark:
        out.append(("Spark batch read vs Parquet", spark["error"], "", "", "", "not run"))
    else:
        ratio = spark["ratio_source_to_parquet"]
        out.append((f"Spark batch read of {spark['messages']:,} rows vs Parquet of the same rows",
                    f"{spark['source_rows_per_s']:,} rows/s ({ratio:.2f}x)",
                    f"Parquet {spark['parquet_rows_per_s']:,} rows/s", ">= 0.5x", ">= 0.8x",
                    _met(ratio >= 0.5) + ("; aim met" if ratio >= 0.8 else "")))
    return out


def render(table: list[tuple[str, ...]], date: str, load: str) -> str:
    """The markdown section (between the markers, so a later run replaces it)."""
    lines = [SECTION_START, "## Native protocol, timers, Spark", "",
             f"Run {date} by `bench/engine_rows.py` (`./dev bench`), load average before: {load}. "
             "Server and client pinned to separate cores; one run, so on a shared machine expect noise.", "",
             "| path | twistmq | reference | must reach | aim | |", "| --- | --- | --- | --- | --- | --- |"]
    lines += ["| " + " | ".join(r) + " |" for r in table]
    lines.append(SECTION_END)
    return "\n".join(lines) + "\n"


def write_section(doc: Path, section: str, start: str = SECTION_START, end: str = SECTION_END) -> None:
    """Put ``section`` (which begins with ``start`` and ends with ``end``) into ``doc``, replacing an earlier one."""
    text = doc.read_text() if doc.exists() else "# twistmq benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    doc.write_text(text)


def run_all(quick: bool = False) -> tuple[list[tuple[str, ...]], dict]:
    """Run the three benches (``quick``: smaller counts) and return the table rows and raw figures."""
    pairs, count, window, messages = (3_000, 100_000, 20.0, 100_000) if quick else (10_000, 1_000_000, 120.0,
                                                                                      300_000)
    raw = {}
    for name, fn in (("native", lambda: run_native(pairs)), ("timer", lambda: run_timer(count, window)),
                     ("spark", lambda: run_spark(messages, 2))):
        print(f"engine rows: running {name}", file=sys.stderr, flush=True)
        try:
            raw[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one failed bench leaves a row saying so, not a traceback
            raw[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return rows(raw["native"], raw["timer"], raw["spark"]), raw


def main(argv=None) -> int:
    import datetime

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3,000 pairs, 100,000 timers over 20 s, 100,000 rows")
    ap.add_argument("--no-write", action="store_true", help="do not write docs/benchmarks.md")
    args = ap.parse_args(argv)
    load = f"{os.getloadavg()[0]:.2f}"
    table, raw = run_all(args.quick)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = render(table, date, load)
    if not args.no_write:
        write_section(REPO / "docs" / "benchmarks.md", section)
    print(section)
    print(json.dumps(raw, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
