"""What every job shares: command line, session, loading, payload parsing, progress.

Telemetry payloads are JSON objects such as ``{"temp": 21.5}``. Every top-level
field whose value is a finite number (not a boolean) is one measurement of the
metric of that name; fields in ``--exclude`` (sequence numbers, timestamps) are
not metrics. A payload that is not UTF-8 JSON, or is JSON but not an object, is
counted as unparsed. The device is the MQTT client id (or the topic if the
client id is empty), or a topic level with ``--device-level``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from typing import Iterator, Sequence

DEFAULT_EXCLUDE = "seq,ts,time,timestamp"
METRICS_SCHEMA = ("device string, topic string, ts timestamp, offset long, bytes long, "
                  "metric string, value double, unparsed boolean")


def arg_parser(description: str) -> argparse.ArgumentParser:
    """The options every job takes; jobs add their own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data-dir", required=True, help="the node's DATA_DIR (holds commitlog/)")
    p.add_argument("--out", required=True, help="output directory (Parquet tables, report)")
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--topic-filter", default="#", help="MQTT topic filter of the messages to analyse (default: #)")
    p.add_argument("--start", default=None, help="only messages stored at or after this time (ISO-8601 or epoch ms)")
    p.add_argument("--end", default=None, help="only messages stored before this time (ISO-8601 or epoch ms)")
    p.add_argument("--window", default="1 minute", help="tumbling window length, e.g. '10 seconds' (default: 1 minute)")
    p.add_argument("--time-column", choices=("store_ts", "born_ts"), default="store_ts",
                   help="event time: when the broker stored the message (default) or when it was born")
    p.add_argument("--device-level", type=int, default=None,
                   help="take the device id from this topic level (0-based) instead of the client id")
    p.add_argument("--exclude", default=DEFAULT_EXCLUDE,
                   help=f"payload fields that are not metrics (default: {DEFAULT_EXCLUDE})")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--mongo-uri", default=None, type=mongo_uri,
                   help="also upsert each result table into the MongoDB collection of its name (pymongo, from "
                        "the executors), by its natural key (needs the mongodb extra)")
    p.add_argument("--mongo-db", default="twistmq", help="the MongoDB database of --mongo-uri (default: twistmq)")
    return p


def mongo_uri(value: str) -> str:
    """``--mongo-uri``, checked before any work: pymongo installed, a well-formed URI (never echoed: it may
    hold credentials)."""
    try:
        from pymongo.errors import PyMongoError
        from pymongo.uri_parser import parse_uri
    except ImportError:
        raise argparse.ArgumentTypeError("needs pymongo: pip install 'twistmq[mongodb]'") from None
    if value.startswith("mongodb+srv://"):
        return value  # parsing resolves DNS: the executors' clients do that
    try:
        parse_uri(value)
    except (PyMongoError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"not a MongoDB URI ({type(exc).__name__})") from None
    return value


def session(args: argparse.Namespace, app: str):
    """A SparkSession with the twistmq source registered, UTC time, and our own progress lines."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark.datasource import TwistmqDataSource

    builder = SparkSession.builder.appName(app)
    if args.master:
        builder = builder.master(args.master)
    spark = (builder.config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.dataSource.register(TwistmqDataSource)
    return spark


def source(spark, args: argparse.Namespace):
    """A ``twistmq`` DataFrameReader with the job's path, topic filter and time range."""
    from spark.datasource import TwistmqDataSource

    spark.dataSource.register(TwistmqDataSource)  # idempotent; the session may come from a caller
    reader = spark.read.format("twistmq").option("path", args.data_dir).option("topicFilter", args.topic_filter)
    if args.start:
        reader = reader.option("startTime", args.start)
    if args.end:
        reader = reader.option("endTime", args.end)
    return reader


def load(spark, args: argparse.Namespace):
    """The MQTT publishes selected by the job's options, with ``device`` and ``ts`` columns."""
    from pyspark.sql import functions as F

    reader = source(spark, args)
    df = reader.load()
    if args.device_level is not None:
        device = F.element_at(F.split("topic", "/", -1), args.device_level + 1)
    else:
        device = F.when(F.col("client_id") != "", F.col("client_id")).otherwise(F.col("topic"))
    return df.withColumn("device", device).withColumn("ts", F.col(args.time_column))


def parse_payload(payload: bytes | None, exclude: frozenset[str]) -> list[tuple[str, float]] | None:
    """The (metric, value) pairs of a telemetry payload; None if it is not a JSON object."""
    if payload is None:
        return None
    try:
        obj = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    out = []
    for key, value in obj.items():
        if key in exclude or type(value) not in (int, float):
            continue
        value = float(value)
        if math.isfinite(value):
            out.append((key, value))
    return out


def metrics(df, exclude: str = DEFAULT_EXCLUDE):
    """One row per (message, numeric field); unparsed payloads give one row with ``unparsed``."""
    skip = frozenset(f.strip() for f in exclude.split(",") if f.strip())

    def explode(batches: Iterator) -> Iterator:
        import pyarrow as pa

        schema = pa.schema([
            ("device", pa.string()), ("topic", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
            ("offset", pa.int64()), ("bytes", pa.int64()), ("metric", pa.string()),
            ("value", pa.float64()), ("unparsed", pa.bool_()),
        ])
        for b in batches:
            take, sizes, names, values, unparsed = [], [], [], [], []
            for i, payload in enumerate(b.column("payload").to_pylist()):
                pairs = parse_payload(payload, skip)
                size = len(payload) if payload is not None else 0
                if pairs is None:
                    take.append(i), sizes.append(size), names.append(None), values.append(None), unparsed.append(True)
                    continue
                for metric, value in pairs:
                    take.append(i), sizes.append(size), names.append(metric), values.append(value), unparsed.append(False)
            idx = pa.array(take, pa.int64())
            yield pa.RecordBatch.from_arrays([
                b.column("device").take(idx), b.column("topic").take(idx),
                b.column("ts").cast(schema.field("ts").type).take(idx), b.column("offset").take(idx),
                pa.array(sizes, pa.int64()), pa.array(names, pa.string()),
                pa.array(values, pa.float64()), pa.array(unparsed, pa.bool_()),
            ], schema=schema)

    return df.select("device", "topic", "ts", "offset", "payload").mapInArrow(explode, METRICS_SCHEMA)


def window_seconds(window: str) -> float:
    """Length of a Spark interval string such as '10 seconds' or '1 minute', in seconds."""
    units = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "millisecond": 0.001}
    parts = window.split()
    if len(parts) != 2:
        raise SystemExit(f"--window {window!r}: use '<number> <unit>', e.g. '1 minute'")
    unit = parts[1].lower().rstrip("s")
    if unit not in units:
        raise SystemExit(f"--window {window!r}: unit must be one of {', '.join(units)}")
    return float(parts[0]) * units[unit]


def write_parquet(df, out: str, name: str) -> str:
    """Write ``df`` to ``out/name`` (replacing it) and return the path."""
    path = os.path.join(out, name)
    df.write.mode("overwrite").parquet(path)
    return path


def write_table(df, args: argparse.Namespace, name: str) -> str:
    """Write result table ``name`` to Parquet and, with ``--mongo-uri``, to the MongoDB collection ``name``
    (``spark.mongo_writer``: upserted by its natural key); returns the Parquet path."""
    path = write_parquet(df, args.out, name)
    if args.mongo_uri:
        from spark.mongo_writer import write_mongo

        # From the Parquet just written: the rows MongoDB gets are those files, not a second computation.
        write_mongo(df.sparkSession.read.parquet(path), args.mongo_uri, args.mongo_db, name)
    return path


class Progress:
    """Progress lines on stderr: the job's steps, and Spark's task counts while a step runs."""

    def __init__(self, spark, job: str, steps: int, quiet: bool = False, interval: float = 2.0):
        self.job, self.steps, self.quiet, self.interval = job, steps, quiet, interval
        self.tracker = spark.sparkContext.statusTracker()
        self.started = time.monotonic()
        self.step_no = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = ""

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[{self.job} {time.monotonic() - self.started:6.1f}s] {text}", file=sys.stderr, flush=True)

    def step(self, text: str) -> None:
        self.step_no += 1
        self.say(f"step {self.step_no}/{self.steps}: {text}")

    def __enter__(self) -> "Progress":
        if not self.quiet:
            self._thread = threading.Thread(target=self._watch, name="twistmq-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.say("done" if exc[0] is None else f"failed: {exc[1]}")

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                stages = [self.tracker.getStageInfo(s) for s in self.tracker.getActiveStageIds()]
            except Exception:  # the context is shutting down
                return
            parts = [f"stage {s.stageId}: {s.numCompletedTasks}/{s.numTasks} tasks"
                     for s in stages if s is not None]
            line = ", ".join(parts)
            if line and line != self._last:
                self._last = line
                self.say(f"  {line}")


def run(main, argv: Sequence[str] | None = None) -> None:
    """Entry point helper: run ``main(argv)`` and exit non-zero with a one-line reason on error."""
    try:
        main(argv)
    except Exception as exc:  # a clear line for the person at the terminal, no JVM stack
        first = str(exc).strip().splitlines()
        reason = next((line for line in first if "twistmq" in line), first[0] if first else type(exc).__name__)
        print(f"error: {reason}", file=sys.stderr)
        raise SystemExit(1) from None
