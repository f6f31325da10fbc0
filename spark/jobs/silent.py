"""Silent devices: those not heard from for ``--minutes`` minutes before ``--as-of``.

A device is silent when ``as_of - last_seen > minutes``. ``--as-of`` defaults to
now (a live broker); give the end of the period when analysing history.
Writes ``OUT/silent_devices`` (Parquet): device, last_seen, messages,
silent_for_s, ordered by the longest silence.
"""

from __future__ import annotations

import sys
import time

if __name__ == "__main__" and not __package__:  # run as a file (spark-submit): find the checkout
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from spark.jobs import common
from spark.options import parse_time


def add_arguments(parser) -> None:
    """The job's own options."""
    parser.add_argument("--minutes", type=float, default=5.0, help="silence longer than this is reported")
    parser.add_argument("--as-of", default=None, help="the 'now' of the analysis (ISO-8601 or epoch ms; default: now)")


def last_seen(df):
    """Per device: when it was last heard from and how many messages it sent."""
    from pyspark.sql import functions as F

    return df.groupBy("device").agg(F.max("ts").alias("last_seen"), F.count("*").alias("messages"))


def silent_devices(df, minutes: float, as_of_ms: int):
    """The devices silent for more than ``minutes`` at ``as_of_ms``."""
    from pyspark.sql import functions as F

    last_ms = F.unix_millis("last_seen")
    return (last_seen(df)
            .withColumn("silent_for_s", (F.lit(as_of_ms) - last_ms) / 1000.0)
            .where(F.lit(as_of_ms) - last_ms > F.lit(int(minutes * 60_000)))
            .orderBy(F.desc("silent_for_s"), "device"))


def as_of_ms(value: str | None) -> int:
    """``--as-of`` in epoch ms (now if not given)."""
    return parse_time("--as-of", value) if value else int(time.time() * 1000)


def main(argv=None, spark=None) -> dict:
    """Run the job; returns the output paths."""
    parser = common.arg_parser(__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    spark = spark or common.session(args, "twistmq-silent")
    with common.Progress(spark, "silent", 2, args.quiet) as progress:
        progress.step(f"reading {args.data_dir}")
        found = silent_devices(common.load(spark, args), args.minutes, as_of_ms(args.as_of))
        progress.step(f"writing silent devices to {args.out}")
        path = common.write_table(found, args, "silent_devices")
    return {"silent_devices": path}


if __name__ == "__main__":
    common.run(main, sys.argv[1:])
