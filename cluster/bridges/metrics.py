"""The bridges' figures on ``/metrics``: a Prometheus collector read at scrape time, labelled by bridge."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

COUNTERS = (
    ("inserted", "twistmq_bridge_inserted_documents", "documents a bridge inserted"),
    ("duplicates", "twistmq_bridge_duplicate_documents", "documents a bridge found already inserted (a batch read "
                                                         "again after a crash or an outage)"),
    ("refused", "twistmq_bridge_refused_documents", "documents the server refused even with a binary payload"),
    ("failed", "twistmq_bridge_failed_batches", "batch inserts that failed (each retried, the position kept)"),
    ("lost", "twistmq_bridge_lost_messages", "messages a disk limit deleted before the bridge inserted them"),
    ("outages", "twistmq_bridge_outages", "times a bridge's server went from reachable to failing"),
)


class BridgeCollector:
    """``collect()`` over ``rows()`` (``Bridges.rows``)."""

    def __init__(self, rows) -> None:
        self.rows = rows

    def collect(self):
        rows = self.rows()
        labels = ["bridge", "group"]
        lag = GaugeMetricFamily("twistmq_bridge_lag_messages", "light-queue entries a bridge has yet to insert",
                                labels=labels)
        for row in rows:
            lag.add_metric([row["name"], row["group"]], row["lag"])
        yield lag
        up = GaugeMetricFamily("twistmq_bridge_up", "1 while a bridge's last insert worked (0: retrying)",
                               labels=labels)
        for row in rows:
            up.add_metric([row["name"], row["group"]], 0 if row["state"] == "retrying" else 1)
        yield up
        for key, name, doc in COUNTERS:
            c = CounterMetricFamily(name, doc, labels=labels)
            for row in rows:
                c.add_metric([row["name"], row["group"]], row[key])
            yield c
