"""Spark benchmark: rows/s scanned by the ``twistmq`` data source vs Spark reading the same messages from Parquet.

Run: ``./dev python -m bench.spark_bench [--messages 300000] [--reps 5]``.

It fills a fresh store (the real ``MessageStore``, JSON telemetry payloads
like the simulator's), then, in one Spark session (``local[2]`` by default):

1. scans the store with the data source: every row, every column, into Spark's
   ``noop`` sink (nothing is written, everything is materialised);
2. writes the same rows to Parquet once (not timed);
3. scans the Parquet copy the same way.

After one warm-up of each, the two scans alternate ``--reps`` times (source,
Parquet, source, ...), so both see the same machine load; each rep gives a
ratio (data source rows/s / Parquet rows/s). It prints the median rows/s of
both, the median ratio with its spread (lowest and highest rep) and the load
average. Parquet is a columnar, compressed, JVM-native format: the ratio says
what reading the live log in Python costs compared with a copy in the format
Spark reads fastest.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from twisted.internet import task  # noqa: E402

from store.config import StoreConfig  # noqa: E402
from store.executor import SynchronousExecutor  # noqa: E402
from store.message_store import MessageStore  # noqa: E402
from store.record import Message  # noqa: E402


def fill_store(data_dir: str, messages: int, devices: int, segment_mb: int) -> int:
    """Append ``messages`` telemetry publishes (1,000 per tick) through the real store; return bytes written."""
    clock = task.Clock()
    clock.rightNow = 1_717_243_200.0
    store = MessageStore(data_dir, StoreConfig(segment_size=segment_mb << 20), clock, SynchronousExecutor())
    store.open()
    rng = random.Random(1)
    done = 0
    try:
        while done < messages:
            for i in range(done, min(messages, done + 1000)):
                dev = f"sim-{i % devices:03d}"
                body = json.dumps({"temp": round(21 + rng.gauss(0, 2), 2), "humidity": round(rng.uniform(30, 60), 1),
                                   "battery": round(100 - i / messages * 10, 2), "seq": i}).encode()
                store.put(Message(topic=f"devices/{dev}/telemetry", body=body, qos=1, client_id=dev))
            done = min(messages, done + 1000)
            clock.advance(0.01)
        return store.size_bytes()
    finally:
        store.close()


def alternate(source, parquet, reps: int) -> tuple[list[float], list[float]]:
    """Times of ``reps`` source and Parquet scans, run in turn after a warm-up of each."""
    source()  # warm-up: Python workers started, JIT warm
    parquet()
    t_source, t_parquet = [], []
    for _ in range(reps):
        for fn, times in ((source, t_source), (parquet, t_parquet)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return t_source, t_parquet


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--devices", type=int, default=100)
    p.add_argument("--segment-mb", type=int, default=16, help="segment size: partitions follow segments")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--keep", action="store_true", help="keep the temporary store and Parquet copy")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a data source option (e.g. batchRows=65536); may be repeated")
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession

    from spark.datasource import TwistmqDataSource

    tmp = tempfile.mkdtemp(prefix="twistmq-spark-bench-")
    data_dir, parquet = os.path.join(tmp, "data"), os.path.join(tmp, "parquet")
    try:
        t = time.perf_counter()
        size = fill_store(data_dir, args.messages, args.devices, args.segment_mb)
        print(f"store: {args.messages:,} messages, {size / 1e6:.1f} MB in {time.perf_counter() - t:.1f}s",
              file=sys.stderr, flush=True)
        spark = (SparkSession.builder.master(args.master).appName("twistmq-spark-bench")
                 .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
                 .config("spark.sql.session.timeZone", "UTC")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(TwistmqDataSource)

        source = spark.read.format("twistmq").option("path", data_dir)
        for key, value in (kv.split("=", 1) for kv in args.option):
            source = source.option(key, value)
        partitions = source.load().rdd.getNumPartitions()
        rows = source.load().count()
        assert rows == args.messages, (rows, args.messages)
        source.load().write.mode("overwrite").parquet(parquet)

        def scan_source():
            source.load().write.format("noop").mode("overwrite").save()

        def scan_parquet():
            spark.read.parquet(parquet).write.format("noop").mode("overwrite").save()

        load_before = os.getloadavg()
        t_sources, t_parquets = alternate(scan_source, scan_parquet, args.reps)
        load_after = os.getloadavg()
        ratios = sorted(tp / ts for ts, tp in zip(t_sources, t_parquets))
        t_source, t_parquet = statistics.median(t_sources), statistics.median(t_parquets)
        pq_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(parquet) for f in fs)
        spark.stop()
        result = {
            "messages": rows, "store_mb": round(size / 1e6, 1), "parquet_mb": round(pq_bytes / 1e6, 1),
            "partitions": partitions, "master": args.master, "reps": args.reps,
            "source_s": round(t_source, 3), "parquet_s": round(t_parquet, 3),
            "source_rows_per_s": round(rows / t_source), "parquet_rows_per_s": round(rows / t_parquet),
            "ratio_source_to_parquet": round(statistics.median(ratios), 3),
            "ratio_min": round(ratios[0], 3), "ratio_max": round(ratios[-1], 3),
            "ratios": [round(r, 3) for r in ratios],
            "load_1m": [round(load_before[0], 2), round(load_after[0], 2)],
        }
        print(f"twistmq data source: {result['source_rows_per_s']:>12,} rows/s  (median {t_source:.2f}s, "
              f"{partitions} partitions, {result['store_mb']} MB of segments)")
        print(f"Parquet (same rows): {result['parquet_rows_per_s']:>12,} rows/s  (median {t_parquet:.2f}s, "
              f"{result['parquet_mb']} MB)")
        print(f"ratio data source / Parquet: median {result['ratio_source_to_parquet']:.3f} over {args.reps} reps "
              f"(lowest {result['ratio_min']:.3f}, highest {result['ratio_max']:.3f}); "
              f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
        print(json.dumps(result))
        return result
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
