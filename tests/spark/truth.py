"""Ground truth in plain Python: what each query and job must report for a data set.

Written from the documented rules, without Spark and without the code under
test, so that a wrong number in Spark cannot be matched by the same mistake here.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict

from store import record as rec

from tests.spark.dataset import Published

EXCLUDE = {"seq", "ts", "time", "timestamp"}
KINDS = {rec.RecordKind.MQTT_PUBLISH: "mqtt", rec.RecordKind.NATIVE_MESSAGE: "native",
         rec.RecordKind.TIMER: "timer", rec.RecordKind.SYSTEM: "system"}


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching, written out level by level (independent of lightqueue.topic)."""
    f, t = topic_filter.split("/"), topic.split("/")
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i == len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


def rows(published: list[Published], topic_filter: str | None = None, start_ms: int | None = None,
         end_ms: int | None = None, kinds=(rec.RecordKind.MQTT_PUBLISH,)) -> list[dict]:
    """The rows the data source must return, in offset order."""
    out = []
    for p in published:
        m = p.message
        if m.kind not in kinds:
            continue
        if topic_filter is not None and not topic_matches(topic_filter, m.topic):
            continue
        if (start_ms is not None and p.store_ts < start_ms) or (end_ms is not None and p.store_ts >= end_ms):
            continue
        out.append({
            "topic": m.topic, "client_id": m.client_id, "qos": m.qos, "retain": m.retain, "payload": m.body,
            "store_ts": p.store_ts, "born_ts": m.born_ts or p.store_ts, "properties": dict(m.properties),
            "offset": p.offset, "kind": KINDS[m.kind],
        })
    return out


def device_of(row: dict) -> str:
    return row["client_id"] or row["topic"]


def measurements(rows_: list[dict]) -> tuple[list[dict], int]:
    """(device, metric, ts, offset, value) for every numeric field; and the number of unparsed payloads."""
    out, unparsed = [], 0
    for r in rows_:
        try:
            obj = json.loads(r["payload"].decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            unparsed += 1
            continue
        if not isinstance(obj, dict):
            unparsed += 1
            continue
        for key, value in obj.items():
            if key in EXCLUDE or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                out.append({"device": device_of(r), "metric": key, "ts": r["store_ts"],
                            "offset": r["offset"], "value": float(value)})
    return out, unparsed


def percentile(values: list[float], p: float) -> float:
    """Exact percentile, linear interpolation between ranks, written as Spark's ``percentile`` computes it.

    position = (n - 1) * p; the value is ``v[lo] + (position - lo) * (v[hi] - v[lo])``
    (Spark 4's PercentileBase.getPercentile), so the figures match bit for bit.
    """
    v = sorted(values)
    pos = (len(v) - 1) * p
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi or v[lo] == v[hi]:
        return v[lo]
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def window_stats(meas: list[dict], window_ms: int) -> dict:
    """(device, metric, window_start_ms) -> (count, rate, min, max, mean, p95)."""
    groups = defaultdict(list)
    for m in meas:
        groups[(m["device"], m["metric"], m["ts"] // window_ms * window_ms)].append(m["value"])
    return {key: (len(v), len(v) / (window_ms / 1000), min(v), max(v), sum(v) / len(v), percentile(v, 0.95))
            for key, v in groups.items()}


def anomalies(meas: list[dict], lookback: int, min_points: int, threshold: float) -> dict:
    """(device, metric, offset) -> z for every point whose rolling |z| exceeds ``threshold``."""
    series = defaultdict(list)
    for m in meas:
        series[(m["device"], m["metric"])].append(m)
    found = {}
    for (device, metric), points in series.items():
        points.sort(key=lambda m: (m["ts"], m["offset"]))
        for i, m in enumerate(points):
            prev = [p["value"] for p in points[max(0, i - lookback):i]]
            if len(prev) < min_points:
                continue
            sd = statistics.stdev(prev)
            if sd == 0:
                continue
            z = (m["value"] - statistics.fmean(prev)) / sd
            if abs(z) > threshold:
                found[(device, metric, m["offset"])] = z
    return found


def silent(rows_: list[dict], minutes: float, as_of_ms: int) -> dict:
    """device -> (last_seen_ms, messages) for devices silent longer than ``minutes``."""
    last, count = {}, defaultdict(int)
    for r in rows_:
        d = device_of(r)
        last[d] = max(last.get(d, 0), r["store_ts"])
        count[d] += 1
    return {d: (ts, count[d]) for d, ts in last.items() if as_of_ms - ts > minutes * 60_000}


def talkers(rows_: list[dict], top: int) -> list[tuple]:
    """[(device, messages, bytes, topics, share)] busiest first (messages, bytes, name)."""
    msgs, size, topics = defaultdict(int), defaultdict(int), defaultdict(set)
    for r in rows_:
        d = device_of(r)
        msgs[d] += 1
        size[d] += len(r["payload"])
        topics[d].add(r["topic"])
    total = sum(msgs.values())
    ranked = sorted(msgs, key=lambda d: (-msgs[d], -size[d], d))[:top]
    return [(d, msgs[d], size[d], len(topics[d]), msgs[d] / total) for d in ranked]


def topic_heat(rows_: list[dict], window_ms: int) -> dict:
    """(topic, window_start_ms) -> (messages, bytes, devices)."""
    groups = defaultdict(list)
    for r in rows_:
        groups[(r["topic"], r["store_ts"] // window_ms * window_ms)].append(r)
    return {k: (len(v), sum(len(r["payload"]) for r in v), len({device_of(r) for r in v}))
            for k, v in groups.items()}


def device_rates(rows_: list[dict], window_ms: int) -> dict:
    """(device, window_start_ms) -> (messages, messages per second)."""
    groups = defaultdict(int)
    for r in rows_:
        groups[(device_of(r), r["store_ts"] // window_ms * window_ms)] += 1
    return {k: (n, n / (window_ms / 1000)) for k, n in groups.items()}
