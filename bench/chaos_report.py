"""The chaos harness's figures as a section of docs/benchmarks.md.

``./dev python -m bench.chaos --seed 1 > chaos.jsonl`` prints one JSON line per injection and a summary line
(stdout); this turns such files (a faulted run, and optionally a fault-free one) into the section between
``<!-- chaos-rows:start -->`` and ``<!-- chaos-rows:end -->``, kept by ``bench.compare`` when it rewrites the
rest of the document::

    ./dev python -m bench.chaos_report chaos.jsonl [--fault-free nofaults.jsonl] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from bench import engine_rows

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SECTION_START, SECTION_END = "<!-- chaos-rows:start -->", "<!-- chaos-rows:end -->"
STAGES = (("rto_s", "RTO"), ("detect_s", "detection"), ("elect_s", "election"), ("role_s", "role change"),
          ("route_s", "route change"), ("first_ack_s", "first ack"), ("sss_full_s", "SyncStateSet full"))


def read_run(path: Path) -> tuple[list[dict], dict]:
    """The injection records and the summary of one run's stdout."""
    records, summary = [], {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("type") == "summary":
            summary = row
        elif "n" in row and "type" in row:
            records.append(row)
    return records, summary


def _cell(values) -> str:
    known = [v for v in values if isinstance(v, (int, float))]
    if not known:
        return "-"
    return f"{statistics.median(known):.2f} / {max(known):.2f}"


def render(records: list[dict], summary: dict, fault_free: dict | None, date: str) -> str:
    """The markdown section."""
    lines = [SECTION_START, "## Failover under chaos", "",
             f"Run {date} with `./dev python -m bench.chaos --seed {summary.get('seed', '?')}` (`bench/chaos.py`: "
             "3 controllers, a group of 3 brokers, 2 proxies, QoS 1 publishers at "
             f"{summary.get('rate', 0):,.0f} msg/s in all and persistent subscribers on the other proxy; one fault at "
             "a time, each verified and healed; every acknowledged message audited after every subscriber "
             "reconnected). Seconds after the fault, median / max; RTO is the last acknowledgement before the fault "
             "to the first after it. Nothing pinned: the 7 processes and the generator share the 2 cores.", "",
             "| fault | n | " + " | ".join(title for _, title in STAGES) + " | elections | lost | duplicates |",
             "| --- | --- |" + " --- |" * (len(STAGES) + 3)]
    for kind in sorted({r["type"] for r in records}):
        rs = [r for r in records if r["type"] == kind]
        lines.append(f"| {kind} | {len(rs)} | " + " | ".join(_cell([r.get(k) for r in rs]) for k, _ in STAGES)
                     + f" | {sum(r.get('elections', 0) for r in rs)} | {sum(r.get('lost', 0) for r in rs)}"
                     f" | {sum(r.get('duplicates', 0) for r in rs)} |")
    lines += ["", f"Total: {summary.get('acked', 0):,} acknowledged, **{summary.get('lost', '?')} lost**, "
                  f"{summary.get('duplicates', 0):,} duplicates (QoS 1 resends), {summary.get('elections', 0)} "
                  f"elections, the longest gap between acknowledgements {summary.get('max_ack_gap_s', '?')} s, "
                  f"in {summary.get('run_s', '?')} s."]
    if fault_free:
        lines += ["", f"Fault-free run (`--no-faults`): {fault_free.get('acked', 0):,} acknowledged, "
                      f"{fault_free.get('lost', '?')} lost, {fault_free.get('duplicates', '?')} duplicates, "
                      f"{fault_free.get('elections', '?')} elections in {fault_free.get('run_s', '?')} s."]
    lines += ["", SECTION_END, ""]
    return "\n".join(lines)


def kept_section(doc: Path = DOC) -> str | None:
    """The section as it stands in ``doc`` (for ``bench.compare`` to put back after rewriting the document)."""
    if not doc.exists():
        return None
    text = doc.read_text()
    if SECTION_START not in text or SECTION_END not in text:
        return None
    return SECTION_START + text.split(SECTION_START, 1)[1].split(SECTION_END, 1)[0] + SECTION_END + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench.chaos_report", description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="stdout of a bench.chaos run with faults")
    p.add_argument("--fault-free", type=Path, help="stdout of a bench.chaos --no-faults run")
    p.add_argument("--no-write", action="store_true", help="print the section, leave docs/benchmarks.md alone")
    args = p.parse_args(argv)
    records, summary = read_run(args.run)
    if not records or not summary:
        p.error(f"{args.run}: no injection records or no summary line")
    fault_free = read_run(args.fault_free)[1] if args.fault_free else None
    date = datetime.datetime.fromtimestamp(args.run.stat().st_mtime, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")
    section = render(records, summary, fault_free, date)
    if not args.no_write:
        engine_rows.write_section(DOC, section, SECTION_START, SECTION_END)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
