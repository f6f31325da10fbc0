"""Every analysis in one run, written as Parquet tables plus an HTML report with charts.

``python -m spark.jobs.report --data-dir DATA_DIR --out OUT`` writes, under OUT:
``device_rates``, ``telemetry_stats``, ``anomalies``, ``silent_devices``,
``top_talkers``, ``topic_heat`` and ``summary`` (Parquet), and ``report.html``
with its PNG charts. The store is scanned once (the parsed rows are cached).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:  # run as a file (spark-submit): find the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from spark.jobs import anomalies, common, silent, talkers, telemetry

STEPS = 9


def add_arguments(parser) -> None:
    """The options of every job this one runs."""
    anomalies.add_arguments(parser)
    silent.add_arguments(parser)
    talkers.add_arguments(parser)
    parser.add_argument("--title", default="twistmq device telemetry", help="report title")


def device_rates(df, window: str):
    """Messages and messages per second per device per window."""
    from pyspark.sql import functions as F

    seconds = common.window_seconds(window)
    return (df.groupBy("device", F.window("ts", window).alias("w"))
            .agg(F.count("*").alias("messages"))
            .select("device", F.col("w.start").alias("window_start"), "messages",
                    (F.col("messages") / F.lit(seconds)).alias("rate_per_s")))


def scan_stats(spark, args) -> dict:
    """Records read and corrupt records skipped, from the data source's ``stats`` output."""
    from pyspark.sql import functions as F

    row = common.source(spark, args).option("output", "stats").load().agg(F.sum("records").alias("records"), F.sum("corrupt").alias("corrupt"),
                            F.count("*").alias("partitions")).first()
    return {"records": int(row["records"] or 0), "corrupt": int(row["corrupt"] or 0),
            "partitions": int(row["partitions"] or 0)}


def main(argv=None, spark=None) -> dict:
    """Run every analysis and write the report; returns the output paths."""
    parser = common.arg_parser(__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    spark = spark or common.session(args, "twistmq-report")
    from pyspark.sql import functions as F

    from spark.report import ReportData, write_report

    out: dict[str, str] = {}
    with common.Progress(spark, "report", STEPS, args.quiet) as progress:
        progress.step(f"scanning {args.data_dir} (segments, corrupt records)")
        scanned = scan_stats(spark, args)
        progress.say(f"  {scanned['records']:,} records in {scanned['partitions']} partitions, "
                     f"{scanned['corrupt']} corrupt skipped")

        progress.step("reading messages and parsing payloads")
        df = common.load(spark, args).cache()
        m = common.metrics(df, args.exclude).cache()
        counts = m.agg(
            F.countDistinct(F.when(F.col("unparsed"), F.col("offset"))).alias("unparsed"),
            F.countDistinct(F.when(~F.col("unparsed"), F.col("offset"))).alias("with_metrics"),
            F.count(F.when(~F.col("unparsed"), 1)).alias("measurements"),
        ).first()
        overview = df.agg(F.count("*").alias("messages"), F.countDistinct("device").alias("devices"),
                          F.min("ts").alias("first"), F.max("ts").alias("last")).first()

        progress.step("message rates")
        rates = device_rates(df, args.window)
        out["device_rates"] = common.write_table(rates, args, "device_rates")
        progress.step("window statistics")
        out.update(telemetry_stats=common.write_table(telemetry.window_stats(m, args.window), args,
                                                      "telemetry_stats"))
        progress.step("anomalies")
        found = anomalies.anomalies(m, args.lookback, args.min_points, args.threshold).orderBy("ts", "offset")
        out["anomalies"] = common.write_table(found, args, "anomalies")
        progress.step("silent devices")
        as_of = silent.as_of_ms(args.as_of)
        out["silent_devices"] = common.write_table(silent.silent_devices(df, args.minutes, as_of), args,
                                                   "silent_devices")
        progress.step("top talkers and topic heat")
        out["top_talkers"] = common.write_table(talkers.top_talkers(df, args.top), args, "top_talkers")
        out["topic_heat"] = common.write_table(talkers.topic_heat(df, args.window), args, "topic_heat")

        progress.step("summary")
        summary = {
            "commit-log records read": scanned["records"],
            "corrupt records skipped": scanned["corrupt"],
            "messages analysed": int(overview["messages"]),
            "messages with metrics": int(counts["with_metrics"] or 0),
            "unparsed payloads": int(counts["unparsed"] or 0),
            "measurements": int(counts["measurements"] or 0),
            "devices": int(overview["devices"]),
            "first message": str(overview["first"] or "-"),
            "last message": str(overview["last"] or "-"),
        }
        summary_row = {k.replace(" ", "_").replace("-", "_"): v for k, v in summary.items()}
        out["summary"] = common.write_parquet(spark.createDataFrame([summary_row]), args.out, "summary")

        progress.step("charts and report.html")
        read = lambda name: spark.read.parquet(out[name]).toPandas()  # noqa: E731
        silent_pdf = read("silent_devices")
        summary["silent devices"] = len(silent_pdf)
        data = ReportData(
            title=args.title, summary=summary, rates=read("device_rates"), stats=read("telemetry_stats"),
            anomalies=read("anomalies").sort_values(["ts", "offset"]), silent=silent_pdf,
            talkers=read("top_talkers").sort_values(["messages", "bytes"], ascending=False),
            heat=read("topic_heat"),
            notes=[f"Window {args.window}; topic filter {args.topic_filter!r}; anomalies: |z| > {args.threshold} "
                   f"over the previous {args.lookback} points; silent: more than {args.minutes:g} min "
                   f"before the analysis time."],
        )
        out["report"] = write_report(data, args.out)
        m.unpersist()
        df.unpersist()
        progress.say(f"report: {out['report']}")
    return out


if __name__ == "__main__":
    common.run(main, sys.argv[1:])
