"""Throughput of the timer: a small smoke run here, the 1,000,000-entry figures via ``__main__``.

    .venv/bin/python -m tests.unit.test_timer_perf [ENTRIES] [SPREAD_S]

prints enqueue/s, advance throughput and peak RSS for ENTRIES (default 1,000,000)
entries spread over SPREAD_S seconds (default 3,600; beyond the 4-hour wheel they roll).
"""

import random
import resource
import sys
import tempfile
import time

from store.timer import Timer


def run(entries: int, spread_ms: int, directory: str, **kw) -> dict:
    """Enqueue ``entries`` random delays at t=0, then advance 100 ms at a time until all are out."""
    rng = random.Random(1)
    t = Timer(directory, **kw)
    t0 = time.perf_counter()
    for off in range(entries):
        t.enqueue(rng.randrange(spread_ms), off, 200, "bench/topic", now_ms=0)
    t1 = time.perf_counter()
    out, now = 0, 0
    while now <= spread_ms + t.precision_ms:
        out += len(t.advance(now))
        now += 100
    t2 = time.perf_counter()
    status = _proc_status()
    t.close()
    return {"rss_anon_mb": status.get("RssAnon", 0) / 1024, "rss_file_mb": status.get("RssFile", 0) / 1024,
            "entries": entries, "out": out, "enqueue_s": t1 - t0, "advance_s": t2 - t1,
            "log_bytes": t.log.end - t.log.start, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _proc_status() -> dict:
    """Resident memory split into anonymous (Python heap) and file-backed (mapped timer log) kB."""
    try:
        with open("/proc/self/status") as f:
            return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if v.strip().endswith("kB")}
    except OSError:
        return {}


def test_smoke_throughput(tmp_path):
    """Twenty thousand entries, some rolled, all come out once (figures are for the report, not asserted)."""
    r = run(20_000, 60_000, str(tmp_path), slot_count=100, precision_ms=100)
    assert r["out"] == 20_000


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    spread = int(float(sys.argv[2]) * 1000) if len(sys.argv) > 2 else 3_600_000
    with tempfile.TemporaryDirectory() as d:
        r = run(n, spread, d)
    print(f"entries={r['entries']:,} spread={spread / 1000:.0f}s handed_out={r['out']:,}")
    print(f"enqueue: {r['entries'] / r['enqueue_s']:,.0f}/s ({r['enqueue_s']:.2f} s)")
    print(f"advance: {r['out'] / r['advance_s']:,.0f} entries/s ({r['advance_s']:.2f} s for "
          f"{spread // 100 + 1:,} slots), timer log {r['log_bytes'] / 1e6:.0f} MB")
    print(f"memory: peak RSS {r['rss_mb']:.0f} MB; at the end RSS anon {r['rss_anon_mb']:.0f} MB, "
          f"file-backed (mapped log) {r['rss_file_mb']:.0f} MB")
