"""The data source's options: names, defaults, parsing and validation.

Every mistake is reported as an OptionError whose message names the offending
option (or path) and says what was expected, so a typo does not silently read
the wrong data.

=======================  =========================================================
option                   meaning
=======================  =========================================================
``path``                 the node's DATA_DIR (or its ``commitlog/`` directory); required
``topicFilter``          MQTT topic filter (``+``/``#`` wildcards); default: every topic
``startTime``            keep records with ``store_ts >= startTime`` (ISO-8601 or epoch ms)
``endTime``              keep records with ``store_ts < endTime`` (ISO-8601 or epoch ms)
``kinds``                ``mqtt`` (default), ``all`` or a comma list of
                         ``mqtt,native,timer,system``; anything but ``mqtt`` adds a ``kind`` column
``output``               ``records`` (default) or ``stats``: one row per partition with
                         records read, rows kept, corrupt records skipped
``maxPartitionBytes``    split segments larger than this into several partitions (64 MiB)
``batchRows``            rows per Arrow batch (65536: fewer, larger batches through Spark's Arrow stream)
``startingOffsets``      streaming only: ``earliest`` (default), ``latest`` or a commit-log offset
``maxRecordsPerTrigger`` streaming only: at most this many commit-log records per micro-batch
``broker``               ``HOST:PORT`` of a node's native listener: read through the broker
                         instead of ``path`` (batch only; see ``spark.broker``)
``topic``                with ``broker``: the topic whose topic consume queue is read
                         (keyed by its first level: ``devices`` or ``devices/x`` alike)
``group``                with ``broker``: consumer group whose offset the broker keeps (``spark``)
``maxRecords``           with ``broker``: at most this many messages per read (1,000,000)
``brokerTimeout``        with ``broker``: seconds for connecting and reading (30)
=======================  =========================================================
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Mapping

from lightqueue.topic import TopicError, TopicMatcher, validate_topic_filter
from store.record import RecordKind

COMMITLOG = "commitlog"

KIND_NAMES = {
    "mqtt": RecordKind.MQTT_PUBLISH,
    "native": RecordKind.NATIVE_MESSAGE,
    "timer": RecordKind.TIMER,
    "system": RecordKind.SYSTEM,
}

# lower-case name -> canonical spelling (Spark hands options over case-insensitively)
KNOWN_OPTIONS = {name.lower(): name for name in (
    "path", "topicFilter", "startTime", "endTime", "kinds", "output",
    "maxPartitionBytes", "batchRows", "startingOffsets", "maxRecordsPerTrigger",
    "broker", "topic", "group", "maxRecords", "brokerTimeout",
)}
BROKER_ONLY = {"topic", "group", "maxrecords", "brokertimeout"}
STREAM_ONLY = {"startingoffsets", "maxrecordspertrigger"}


class OptionError(ValueError):
    """An option of the ``twistmq`` data source is missing, unknown or malformed."""


@dataclass(frozen=True)
class ScanOptions:
    """Validated options, picklable so that Spark can ship them to executors."""

    commitlog_dir: str
    """Directory holding the 20-digit segment files."""
    topic_filter: str | None = None
    """MQTT topic filter the topic must match, or None for every topic."""
    start_ms: int | None = None
    """Inclusive lower bound on ``store_ts`` (epoch ms)."""
    end_ms: int | None = None
    """Exclusive upper bound on ``store_ts`` (epoch ms)."""
    kinds: frozenset[int] = frozenset({int(RecordKind.MQTT_PUBLISH)})
    """Record kinds returned as rows."""
    with_kind_column: bool = False
    """True when ``kinds`` was given: rows then carry a ``kind`` column."""
    output: str = "records"
    """``records`` or ``stats``."""
    max_partition_bytes: int = 64 * 1024 * 1024
    """Segments larger than this are split into several partitions."""
    batch_rows: int = 65536
    """Rows per Arrow record batch."""
    starting_offsets: str = "earliest"
    """Streaming: ``earliest``, ``latest`` or a decimal commit-log offset."""
    max_records_per_trigger: int | None = None
    """Streaming: cap on commit-log records per micro-batch."""
    broker: tuple[str, int] | None = None
    """(host, port) of a node's native listener when reading through the broker (then no commitlog_dir)."""
    broker_topic: str = ""
    """With ``broker``: the topic whose topic consume queue is consumed."""
    group: str = "spark"
    """With ``broker``: the consumer group (the broker keeps its offset)."""
    max_records: int = 1_000_000
    """With ``broker``: most messages consumed by one read."""
    broker_timeout: float = 30.0
    """With ``broker``: seconds for connecting and reading."""

    def matcher(self) -> TopicMatcher | None:
        """A topic matcher for ``topic_filter`` (None: every topic)."""
        return TopicMatcher(self.topic_filter) if self.topic_filter is not None else None


def parse_time(name: str, value: str) -> int:
    """Epoch milliseconds from an ISO-8601 string (UTC if no zone) or an integer of ms."""
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(
            f"twistmq option {name}={value!r} is not a time: use ISO-8601 "
            f"(2024-05-01T12:00:00Z) or epoch milliseconds") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)


def _positive_int(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise OptionError(f"twistmq option {name}={value!r} must be a positive integer")
    return number


def resolve_commitlog(path: str | None) -> str:
    """The segment directory for ``path`` (a DATA_DIR or its commitlog/ directory)."""
    if not path:
        raise OptionError("twistmq needs option 'path': the node's data directory (DATA_DIR)")
    if not os.path.isdir(path):
        raise OptionError(f"twistmq path {path!r} does not exist or is not a directory")
    nested = os.path.join(path, COMMITLOG)
    if os.path.isdir(nested):
        return nested
    if os.path.basename(os.path.normpath(path)) == COMMITLOG:
        return path
    raise OptionError(
        f"twistmq path {path!r} has no {COMMITLOG}/ directory: "
        f"point 'path' at a node's DATA_DIR")


def parse_options(options: Mapping[str, str], streaming: bool = False) -> ScanOptions:
    """Validate Spark's option map; raise OptionError naming the first bad option."""
    given = {str(k).lower(): str(v) for k, v in options.items()}
    for key in given:
        if key not in KNOWN_OPTIONS:
            raise OptionError(
                f"twistmq: unknown option {key!r}; known options: {', '.join(sorted(KNOWN_OPTIONS.values()))}")
        if key in STREAM_ONLY and not streaming:
            raise OptionError(f"twistmq option {KNOWN_OPTIONS[key]!r} applies to readStream only")
    if "broker" in given:
        kw: dict = _broker_options(given, streaming)
    else:
        for key in BROKER_ONLY & given.keys():
            raise OptionError(f"twistmq option {KNOWN_OPTIONS[key]!r} applies only with option 'broker'")
        kw = {"commitlog_dir": resolve_commitlog(given.get("path"))}
    if "topicfilter" in given:
        try:
            validate_topic_filter(given["topicfilter"])
        except TopicError as exc:
            raise OptionError(f"twistmq option topicFilter={given['topicfilter']!r}: {exc}") from None
        kw["topic_filter"] = given["topicfilter"]
    if "starttime" in given:
        kw["start_ms"] = parse_time("startTime", given["starttime"])
    if "endtime" in given:
        kw["end_ms"] = parse_time("endTime", given["endtime"])
    if kw.get("start_ms") is not None and kw.get("end_ms") is not None and kw["start_ms"] >= kw["end_ms"]:
        raise OptionError(f"twistmq option startTime={given['starttime']!r} is not before endTime={given['endtime']!r}")
    if "kinds" in given:
        kw["kinds"] = _parse_kinds(given["kinds"])
        kw["with_kind_column"] = True
    if "output" in given:
        output = given["output"].strip().lower()
        if output not in ("records", "stats"):
            raise OptionError(f"twistmq option output={given['output']!r} must be 'records' or 'stats'")
        kw["output"] = output
    if "maxpartitionbytes" in given:
        kw["max_partition_bytes"] = _positive_int("maxPartitionBytes", given["maxpartitionbytes"])
    if "batchrows" in given:
        kw["batch_rows"] = _positive_int("batchRows", given["batchrows"])
    if "startingoffsets" in given:
        start = given["startingoffsets"].strip().lower()
        if start not in ("earliest", "latest") and not start.isdigit():
            raise OptionError(
                f"twistmq option startingOffsets={given['startingoffsets']!r} must be "
                f"'earliest', 'latest' or a commit-log offset")
        kw["starting_offsets"] = start
    if "maxrecordspertrigger" in given:
        kw["max_records_per_trigger"] = _positive_int("maxRecordsPerTrigger", given["maxrecordspertrigger"])
    return ScanOptions(**kw)


def _broker_options(given: dict[str, str], streaming: bool) -> dict:
    """The options of a read through a broker's native listener."""
    if "path" in given:
        raise OptionError("twistmq options 'path' and 'broker' exclude each other: read the files or the broker")
    for key in ("starttime", "endtime", "kinds", "output", "startingoffsets", "maxrecordspertrigger"):
        if key in given:
            raise OptionError(f"twistmq option {KNOWN_OPTIONS[key]!r} is not available with option 'broker'")
    host, sep, port = given["broker"].strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError(f"twistmq option broker={given['broker']!r} must be HOST:PORT of a native listener")
    topic = given.get("topic", "").strip()
    if not topic:
        raise OptionError("twistmq option 'broker' needs option 'topic': the topic whose consume queue to read")
    kw: dict = {"commitlog_dir": "", "broker": (host.strip("[]"), int(port)), "broker_topic": topic}
    if "group" in given:
        if not given["group"].strip():
            raise OptionError("twistmq option group must not be empty")
        kw["group"] = given["group"].strip()
    if "maxrecords" in given:
        kw["max_records"] = _positive_int("maxRecords", given["maxrecords"])
    if "brokertimeout" in given:
        try:
            kw["broker_timeout"] = float(given["brokertimeout"])
        except ValueError:
            kw["broker_timeout"] = 0.0
        if not kw["broker_timeout"] > 0:
            raise OptionError(f"twistmq option brokerTimeout={given['brokertimeout']!r} must be positive seconds")
    return kw


def _parse_kinds(value: str) -> frozenset[int]:
    names = [part.strip().lower() for part in value.split(",") if part.strip()]
    if names == ["all"]:
        return frozenset(int(k) for k in KIND_NAMES.values())
    unknown = [n for n in names if n not in KIND_NAMES]
    if unknown or not names:
        raise OptionError(
            f"twistmq option kinds={value!r}: use 'all' or a comma list of {', '.join(KIND_NAMES)}")
    return frozenset(int(KIND_NAMES[n]) for n in names)
