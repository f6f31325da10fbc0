"""Reading through a running broker over the native protocol (the ``broker`` option).

For Spark executors that are not on the broker's machine: instead of opening
segment files, one task connects to the node's native listener (newline-
delimited JSON over TCP) and consumes the topic consume queue of ``topic``
(keyed by the topic's first level) with the consumer group ``group``. The
broker keeps the group's offset, so each read returns what the group has not
read yet, like a Kafka consumer group: a new group starts at the oldest message
still stored. Requests are pipelined (``PIPELINE`` at a time) and the read stops
when the broker answers "nothing ready", after ``maxRecords`` rows, or when
``brokerTimeout`` runs out.

What the native reply does not carry is null: ``store_ts``, ``born_ts`` and
``retain`` are null and ``properties`` is empty; ``offset`` is the message's
commit-log offset (its ``msg_id``). Consuming is not replayable: a Spark action
that runs the read twice (``count()`` then ``collect()``) gets two different
slices, so ``cache()`` or write the result. Batch reads only.

It speaks through the project's blocking native client
(``mqtt_proxy.native.client``), which loads no broker-side module.
"""

from __future__ import annotations

import base64
import time
from typing import Iterator

import pyarrow as pa

from mqtt_proxy.native.client import BlockingClient
from spark.batches import ARROW_SCHEMA
from spark.options import ScanOptions

CONSUME = 2
PIPELINE = 256


class BrokerReadError(RuntimeError):
    """The broker refused a request or went away; the message names the broker and the reason."""


def _connect(host: str, port: int, timeout: float) -> BlockingClient:
    try:
        return BlockingClient(host, port, timeout)
    except OSError as exc:
        raise BrokerReadError(f"twistmq broker {host}:{port}: cannot connect: {exc}") from None


def _exchange(conn: BlockingClient, where: str, requests: list[dict]) -> list[dict]:
    """Send ``requests`` pipelined and read their replies in order."""
    try:
        return conn.pipeline(requests)
    except OSError as exc:  # the broker went away or the timeout ran out
        raise BrokerReadError(f"twistmq broker {where}: {exc}") from None


def _payload(reply: dict) -> bytes:
    data = reply.get("data", "")
    if reply.get("encoding") == "base64":
        return base64.b64decode(data)
    return data.encode("utf-8")


def read_broker(opts: ScanOptions) -> Iterator[pa.RecordBatch]:
    """Consume the topic queue through the broker; yield Arrow batches with the data source's columns."""
    host, port = opts.broker
    conn, where = _connect(host, port, opts.broker_timeout), f"{host}:{port}"
    matcher = opts.matcher()
    deadline = time.monotonic() + opts.broker_timeout
    cols: dict[str, list] = {f.name: [] for f in ARROW_SCHEMA}
    left = opts.max_records
    try:
        while left > 0 and time.monotonic() < deadline:
            n = min(PIPELINE, left)
            request = {"action": CONSUME, "topic": opts.broker_topic, "group": opts.group}
            replies = _exchange(conn, where, [dict(request, seq=i) for i in range(n)])
            drained = False
            for reply in replies:
                if reply.get("code") != 0:
                    raise BrokerReadError(f"twistmq broker {where} refused consume of topic "
                                          f"{opts.broker_topic!r}: {reply.get('reason', reply)}")
                if "data" not in reply:
                    drained = True  # nothing ready: the group has caught up
                    continue
                left -= 1
                topic = reply.get("msg_topic", opts.broker_topic)
                if matcher is not None and not matcher.matches(topic):
                    continue
                for name, value in (("topic", topic), ("client_id", reply.get("client_id", "")),
                                    ("qos", reply.get("qos")), ("retain", None), ("payload", _payload(reply)),
                                    ("store_ts", None), ("born_ts", None), ("properties", []),
                                    ("offset", int(reply["msg_id"]))):
                    cols[name].append(value)
            if len(cols["offset"]) >= opts.batch_rows or (drained and cols["offset"]):
                yield _batch(cols)
            if drained:
                break
        if cols["offset"]:
            yield _batch(cols)
    finally:
        conn.close()


def _batch(cols: dict[str, list]) -> pa.RecordBatch:
    batch = pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in ARROW_SCHEMA], schema=ARROW_SCHEMA)
    for values in cols.values():
        values.clear()
    return batch
