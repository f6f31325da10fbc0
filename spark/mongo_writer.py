"""Result tables into MongoDB: each row upserted by its natural key, with ``pymongo`` from the executors.

The MongoDB Spark connector is a JVM package; this is plain Python in
``foreachPartition``: each partition opens one ``MongoClient``, sends its rows
as unordered ``ReplaceOne(upsert=True)`` batches and closes it. A row's
``_id`` is its natural key (``KEYS``) as a sub-document, so running a job
again over the same data (and, for silent devices, the same ``--as-of``)
replaces each document with an equal one and adds none. Nothing is deleted:
a row a later run no longer produces (a device no longer silent, or no longer
among the top talkers) stays until someone removes it.

Timestamps become BSON dates (UTC, millisecond precision); they are turned
into epoch microseconds inside Spark first, so the executors' local time zone
plays no part.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

KEYS = {
    "telemetry_stats": ("device", "metric", "window_start"),
    "device_rates": ("device", "window_start"),
    "anomalies": ("device", "metric", "offset"),
    "silent_devices": ("device",),
    "top_talkers": ("device",),
    "topic_heat": ("topic", "window_start"),
}
"""Each table's natural key: the columns that name one row (an anomaly is a point, named by its offset)."""

BATCH = 1000  # upserts per bulk_write
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def write_mongo(df, uri: str, database: str, collection: str, timeout_s: float = 10.0) -> None:
    """Upsert every row of ``df`` into ``database.collection`` by ``KEYS[collection]``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    key = KEYS[collection]
    stamps = [f.name for f in df.schema.fields if isinstance(f.dataType, (TimestampType, TimestampNTZType))]
    for name in stamps:
        df = df.withColumn(name, F.unix_micros(F.col(name).cast("timestamp")))
    columns = df.columns
    timeout_ms = int(timeout_s * 1000)

    def upsert(rows) -> None:
        from pymongo import MongoClient, ReplaceOne

        client = MongoClient(uri, serverSelectionTimeoutMS=timeout_ms, socketTimeoutMS=timeout_ms,
                             connectTimeoutMS=timeout_ms)
        try:
            coll = client[database][collection]
            ops = []
            for row in rows:
                doc = dict(zip(columns, row))
                for name in stamps:
                    if doc[name] is not None:
                        doc[name] = _EPOCH + timedelta(microseconds=doc[name])
                doc_id = {k: doc[k] for k in key}
                ops.append(ReplaceOne({"_id": doc_id}, {"_id": doc_id, **doc}, upsert=True))
                if len(ops) >= BATCH:
                    coll.bulk_write(ops, ordered=False)
                    ops = []
            if ops:
                coll.bulk_write(ops, ordered=False)
        finally:
            client.close()

    df.foreachPartition(upsert)
