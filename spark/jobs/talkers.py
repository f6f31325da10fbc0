"""Top talkers (devices by messages and bytes) and topic heat (messages per topic per window).

Writes ``OUT/top_talkers`` (device, messages, bytes, topics, share: the
device's fraction of all messages; the ``--top`` busiest, by messages then
bytes) and ``OUT/topic_heat`` (topic, window_start, messages, bytes, devices).
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__:  # run as a file (spark-submit): find the checkout
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from spark.jobs import common


def add_arguments(parser) -> None:
    """The job's own options."""
    parser.add_argument("--top", type=int, default=10, help="how many talkers to keep")


def top_talkers(df, top: int = 10):
    """The ``top`` devices by messages (ties: bytes, then name)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    total = Window.partitionBy()
    return (df.groupBy("device")
            .agg(F.count("*").alias("messages"), F.sum(F.length("payload")).cast("long").alias("bytes"),
                 F.countDistinct("topic").alias("topics"))
            .withColumn("share", F.col("messages") / F.sum("messages").over(total))
            .orderBy(F.desc("messages"), F.desc("bytes"), "device")
            .limit(top))


def topic_heat(df, window: str):
    """Messages, bytes and distinct devices per topic per tumbling window."""
    from pyspark.sql import functions as F

    return (df.groupBy("topic", F.window("ts", window).alias("w"))
            .agg(F.count("*").alias("messages"), F.sum(F.length("payload")).cast("long").alias("bytes"),
                 F.countDistinct("device").alias("devices"))
            .select("topic", F.col("w.start").alias("window_start"), "messages", "bytes", "devices"))


def main(argv=None, spark=None) -> dict:
    """Run the job; returns the output paths."""
    parser = common.arg_parser(__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    spark = spark or common.session(args, "twistmq-talkers")
    with common.Progress(spark, "talkers", 3, args.quiet) as progress:
        df = common.load(spark, args).cache()
        progress.step(f"ranking talkers in {args.data_dir}")
        talkers = common.write_table(top_talkers(df, args.top), args, "top_talkers")
        progress.step("computing topic heat")
        heat = common.write_table(topic_heat(df, args.window), args, "topic_heat")
        progress.step("releasing cache")
        df.unpersist()
    return {"top_talkers": talkers, "topic_heat": heat}


if __name__ == "__main__":
    common.run(main, sys.argv[1:])
