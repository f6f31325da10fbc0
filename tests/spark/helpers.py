"""Small helpers shared by the Spark tests."""

from __future__ import annotations

from pyspark.sql import functions as F


def collect_rows(df) -> list[dict]:
    """Rows as plain dicts in offset order, timestamps as epoch ms, properties as dicts."""
    ts_cols = [f.name for f in df.schema.fields if f.dataType.typeName() == "timestamp"]
    df = df.select(*[F.unix_millis(c).alias(c) if c in ts_cols else F.col(c) for c in df.columns])
    out = []
    for row in df.orderBy("offset").collect():
        d = row.asDict()
        if "payload" in d and d["payload"] is not None:
            d["payload"] = bytes(d["payload"])
        if "properties" in d and d["properties"] is not None:
            d["properties"] = dict(d["properties"])
        out.append(d)
    return out


def read(spark, path, **options):
    """A batch DataFrame over the store at ``path`` with ``options``."""
    reader = spark.read.format("twistmq").option("path", path)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def parquet_rows(spark, path) -> list[dict]:
    """A job's Parquet output as plain dicts, timestamps as epoch ms."""
    df = spark.read.parquet(path)
    ts_cols = [f.name for f in df.schema.fields if f.dataType.typeName() == "timestamp"]
    df = df.select(*[F.unix_millis(c).alias(c) if c in ts_cols else F.col(c) for c in df.columns])
    return [row.asDict() for row in df.collect()]
