"""Per device and metric, over tumbling windows: count, rate, min, max, mean and exact p95.

``python -m spark.jobs.telemetry --data-dir DATA_DIR --out OUT [--window '1 minute']``
writes ``OUT/telemetry_stats`` (Parquet): device, metric, window_start,
window_end, count, rate_per_s (count / window length), min, max, mean, p95.
p95 is Spark's exact ``percentile`` (linear interpolation between the two
nearest ranks), not ``percentile_approx``.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:  # run as a file (spark-submit): find the checkout
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from spark.jobs import common


def window_stats(metrics, window: str):
    """The statistics table from a ``common.metrics`` frame."""
    from pyspark.sql import functions as F

    seconds = common.window_seconds(window)
    return (
        metrics.where(~F.col("unparsed"))
        .groupBy("device", "metric", F.window("ts", window).alias("w"))
        .agg(
            F.count("value").alias("count"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.avg("value").alias("mean"),
            F.percentile("value", F.lit(0.95)).alias("p95"),
        )
        .select(
            "device", "metric",
            F.col("w.start").alias("window_start"), F.col("w.end").alias("window_end"),
            "count", (F.col("count") / F.lit(seconds)).alias("rate_per_s"),
            "min", "max", "mean", "p95",
        )
    )


def main(argv=None, spark=None) -> dict:
    """Run the job; returns the output paths."""
    args = common.arg_parser(__doc__.splitlines()[0]).parse_args(argv)
    spark = spark or common.session(args, "twistmq-telemetry")
    with common.Progress(spark, "telemetry", 2, args.quiet) as progress:
        progress.step(f"reading {args.data_dir} and parsing payloads")
        stats = window_stats(common.metrics(common.load(spark, args), args.exclude), args.window)
        progress.step(f"writing window statistics to {args.out}")
        path = common.write_table(stats, args, "telemetry_stats")
    return {"telemetry_stats": path}


if __name__ == "__main__":
    common.run(main, sys.argv[1:])
