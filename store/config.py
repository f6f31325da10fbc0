"""Store configuration, the native queues' section, and the checked TOML-section loader all configs use."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type; the message names the key."""


def from_mapping(cls: type[T], section: str, values: Mapping[str, Any]) -> T:
    """Build the frozen config dataclass ``cls`` from a TOML section, naming any bad key.

    Unknown keys and values of the wrong type raise ConfigError with the full
    key (``section.key``); the dataclass's own ``validate()`` runs last.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in values:
        if key not in fields:
            raise ConfigError(f"unknown config key {section}.{key}")
    kwargs = {}
    for key, value in values.items():
        expected = hints[key]
        if not _type_ok(value, expected):
            raise ConfigError(f"config key {section}.{key} must be {_type_name(expected)}, not {value!r}")
        kwargs[key] = value
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError as exc:
            raise ConfigError(f"{section}.{exc}") from None
    return obj


def _type_ok(value: Any, expected: Any) -> bool:
    origin = typing.get_origin(expected)
    if origin is typing.Union or str(origin) == "types.UnionType":
        return any(_type_ok(value, arg) for arg in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        (arg, *_) = typing.get_args(expected) or (Any,)
        return isinstance(value, (list, tuple)) and all(arg is Any or _type_ok(v, arg) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    return isinstance(value, expected)


def _type_name(expected: Any) -> str:
    return getattr(expected, "__name__", str(expected))


@dataclass(frozen=True)
class StoreConfig:
    """The ``[store]`` section: commit log, flushing and retention."""

    segment_size: int = 1 << 30
    """Bytes per commit-log segment file (1 GiB)."""
    flush: str = "async"
    """``async``: acknowledge once written to the OS, fsync every flush_interval_ms; ``sync``: acknowledge after fsync (group commit)."""
    flush_interval_ms: int = 500
    """How often the async policy fsyncs."""
    retention_hours: float = 72.0
    """Delete commit-log segments older than this, unless they hold a message still owed to a session, shared group or native consumer (those are kept until delivered, expired, or a disk limit forces them out)."""
    disk_quota_mb: int = 0
    """Disk limit: delete the oldest segments, owed messages included (counted and logged), while the commit log is larger than this (0: no quota of its own; disk_max_used_ratio still applies)."""
    disk_max_used_ratio: float = 0.75
    """Disk limit: delete the oldest segments, owed messages included (counted and logged), while the data directory's file system is fuller than this share, as df's Use% counts it (RocketMQ's diskMaxUsedSpaceRatio; 1.0 turns it off)."""
    retention_check_s: float = 60.0
    """How often retention runs."""
    index_flush_s: float = 10.0
    """How often the derived indexes (light queues, RocksDB with the WAL off) are flushed to disk, bounding replay after a crash."""
    kv_sync: bool = False
    """Fsync the durable session/offset store on every write batch (survives power loss, not only kill -9)."""
    session_position_log_s: float = 1.0
    """How often delivery positions (a persistent subscription's send mark, QoS 1 messages in flight, shared groups' offsets) that moved are appended to the commit log; the rest of session state is appended at every change. A replica may resume from positions this old (QoS 1 duplicates, never a loss); a kill -9 of the broker itself loses none (the session store keeps them at once)."""
    max_filter_shapes: int = 1024
    """Distinct filter shapes (depth and positions of ``+`` of every stored filter prefix) the broker keeps: the most topic-trie nodes one publish visits. A SUBSCRIBE that would add shapes beyond it is refused (SUBACK 0x97 / 0x80), counted and logged (0: no cap)."""
    max_topic_queues: int = 100000
    """Topic consume queues (one per first topic level, for native consumers) kept at most. A publish to a new first level beyond it is stored and delivered to MQTT subscribers but not indexed for native topic consumers; each is counted and logged. Idle ones are collected like light queues."""

    def validate(self) -> None:
        if self.segment_size < 4096:
            raise ConfigError(f"segment_size must be at least 4096, not {self.segment_size}")
        if self.flush not in ("async", "sync"):
            raise ConfigError(f"flush must be 'async' or 'sync', not {self.flush!r}")
        for name in ("flush_interval_ms", "retention_hours", "retention_check_s", "index_flush_s",
                     "session_position_log_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if not 0.0 < self.disk_max_used_ratio <= 1.0:
            raise ConfigError(f"disk_max_used_ratio must be within (0, 1], not {self.disk_max_used_ratio}")
        if self.disk_quota_mb < 0:
            raise ConfigError("disk_quota_mb must be >= 0")
        if self.max_filter_shapes < 0:
            raise ConfigError("max_filter_shapes must be >= 0")
        if self.max_topic_queues <= 0:
            raise ConfigError("max_topic_queues must be positive")


MAX_QUEUE_NAME_BYTES = 255


@dataclass(frozen=True)
class NativeConfig:
    """The ``[native]`` section: limits, defaults and virtual queues of the native queue engine and protocol.

    Here rather than in ``lightqueue`` or ``mqtt_proxy`` because both read it: the protocol's codec checks
    requests against its limits, the queue engine serves them under its sizes and virtual queues.
    """

    node_id: int = 1
    """The id this node reports as ``node_id`` in replies."""
    max_queue_size: int = 1_000_000
    """Messages a queue may hold (ready + in flight) before produce answers ``queue full``."""
    max_request_bytes: int = 1_048_576
    """Longest TCP request line; longer lines get an error and are skipped (the connection stays up)."""
    max_datagram_bytes: int = 8192
    """Largest UDP request datagram; larger ones get an error (use TCP for big messages)."""
    max_batch: int = 1000
    """Most messages in one batch produce."""
    max_pipeline: int = 1024
    """Requests in flight per TCP connection before the server stops reading from it."""
    default_ttl_s: int = 86_400
    """``ttl`` when a produce leaves it out."""
    max_ttl_s: int = 30 * 86_400
    """Largest ``ttl`` accepted."""
    max_delay_s: int = 30 * 86_400
    """Largest ``delay`` accepted."""
    max_retry_s: int = 86_400
    """Largest ``retry`` (invisible time after a consume) accepted."""
    default_invisible_time_s: int = 30
    """``invisible_time`` of a ``pop`` that leaves it out."""
    max_invisible_time_s: int = 12 * 3600
    """Largest ``invisible_time`` accepted by ``pop`` and ``change_invisible_time``."""
    max_reconsume: int = 16
    """A popped message handed out more than this many times again (RocketMQ's maxReconsumeTimes) moves to the dead-letter queue ``%DLQ%<group>`` instead of coming back."""
    virtual_queues: dict = field(default_factory=dict)
    """Virtual queue name -> list of real queue names; a produce to it is stored once, indexed in each (in a cluster, once in each broker group that holds one of them: a real queue lives in the group of its own name)."""
    token: str = ""
    """Shared secret native clients present: a TCP connection's first request carries ``"token"`` (e.g. ``{"action": "auth", "token": "..."}``), every UDP datagram too; a wrong or missing one gets an error (and TCP is closed). Empty: no token, and a native listener facing other hosts needs ``[mqtt] allow_anonymous = true``."""
    max_reply_buffer_bytes: int = 1_048_576
    """Reply bytes a TCP connection may have ready behind an earlier, unanswered reply before the server stops reading its requests until the client reads (the transport's own send buffer pauses reading past 64 KiB)."""
    list_page_size: int = 100
    """Queues (and topics) per ``queue_list`` reply when the request gives no ``limit`` (at most 1000); ``cursor`` fetches the next page."""

    def validate(self) -> None:
        for name in ("max_queue_size", "max_request_bytes", "max_datagram_bytes", "max_batch", "max_pipeline",
                     "default_ttl_s", "max_ttl_s", "max_delay_s", "max_retry_s", "default_invisible_time_s",
                     "max_invisible_time_s", "max_reconsume", "max_reply_buffer_bytes",
                     "list_page_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.max_datagram_bytes > 65507:
            raise ConfigError("max_datagram_bytes must be at most 65507 (the largest UDP payload)")
        if self.default_ttl_s > self.max_ttl_s:
            raise ConfigError("default_ttl_s must not exceed max_ttl_s")
        if self.list_page_size > 1000:
            raise ConfigError("list_page_size must be at most 1000")
        if self.token != self.token.strip() or any(ch in self.token for ch in "\r\n"):
            raise ConfigError("token must not have surrounding spaces or line breaks")
        for vname, targets in self.virtual_queues.items():
            problem = check_queue_name(vname)
            if problem:
                raise ConfigError(f"virtual_queues: {problem}")
            if not isinstance(targets, (list, tuple)) or not targets:
                raise ConfigError(f"virtual_queues.{vname} must be a non-empty list of queue names")
            for t in targets:
                problem = check_queue_name(t) if isinstance(t, str) else "queue names must be strings"
                if problem:
                    raise ConfigError(f"virtual_queues.{vname}: {problem}")
                if t in self.virtual_queues:
                    raise ConfigError(f"virtual_queues.{vname}: {t!r} is itself a virtual queue")


def check_queue_name(name: str) -> str | None:
    """Why ``name`` cannot be a native queue name, or None if it can."""
    if not isinstance(name, str):
        return "queue must be a string"
    if not name:
        return "queue must not be empty"
    if any(c in name for c in ",\x00\n\r"):
        return "queue must not contain ',', NUL or line breaks"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "queue is not valid UTF-8"
    if size > MAX_QUEUE_NAME_BYTES:
        return f"queue longer than {MAX_QUEUE_NAME_BYTES} bytes"
    return None
