"""Anomalies: a rolling z-score per device and metric, with the offending points listed.

For each point, the mean and sample standard deviation of the previous
``--lookback`` points of the same device and metric (ordered by time, then
commit-log offset) give ``z = (value - mean) / stddev``; a point is an anomaly
when at least ``--min-points`` previous points exist, the deviation is not zero
and ``|z| > --threshold``. Writes ``OUT/anomalies`` (Parquet): device, metric,
ts, offset, value, mean, stddev, z.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:  # run as a file (spark-submit): find the checkout
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from spark.jobs import common

DEFAULT_LOOKBACK = 20
DEFAULT_MIN_POINTS = 10
DEFAULT_THRESHOLD = 4.0


def add_arguments(parser) -> None:
    """The job's own options."""
    parser.add_argument("--lookback", type=int, default=DEFAULT_LOOKBACK, help="points in the rolling window")
    parser.add_argument("--min-points", type=int, default=DEFAULT_MIN_POINTS,
                        help="previous points needed before a point is judged")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="|z| above this is an anomaly")


def scores(metrics, lookback: int = DEFAULT_LOOKBACK, min_points: int = DEFAULT_MIN_POINTS):
    """Every point with its rolling mean, stddev and z-score (z is null when not judged)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("device", "metric").orderBy("ts", "offset").rowsBetween(-lookback, -1)
    judged = (F.col("n") >= min_points) & (F.col("stddev") > 0)
    return (
        metrics.where(~F.col("unparsed"))
        .select("device", "metric", "ts", "offset", "value",
                F.count("value").over(w).alias("n"),
                F.avg("value").over(w).alias("mean"),
                F.stddev_samp("value").over(w).alias("stddev"))
        .withColumn("z", F.when(judged, (F.col("value") - F.col("mean")) / F.col("stddev")))
    )


def anomalies(metrics, lookback: int = DEFAULT_LOOKBACK, min_points: int = DEFAULT_MIN_POINTS,
              threshold: float = DEFAULT_THRESHOLD):
    """The points whose |z| exceeds ``threshold``."""
    from pyspark.sql import functions as F

    return (scores(metrics, lookback, min_points)
            .where(F.abs("z") > threshold)
            .select("device", "metric", "ts", "offset", "value", "mean", "stddev", "z"))


def main(argv=None, spark=None) -> dict:
    """Run the job; returns the output paths."""
    parser = common.arg_parser(__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    spark = spark or common.session(args, "twistmq-anomalies")
    with common.Progress(spark, "anomalies", 2, args.quiet) as progress:
        progress.step(f"reading {args.data_dir} and scoring points")
        found = anomalies(common.metrics(common.load(spark, args), args.exclude),
                          args.lookback, args.min_points, args.threshold)
        progress.step(f"writing anomalies to {args.out}")
        path = common.write_table(found, args, "anomalies")
    return {"anomalies": path}


if __name__ == "__main__":
    common.run(main, sys.argv[1:])
