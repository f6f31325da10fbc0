"""Store configuration, and the checked TOML-section loader every package's config uses."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
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
    """Disk limit: delete the oldest segments, owed messages included (counted and logged), while the data directory's file system is fuller than this share (RocketMQ's diskMaxUsedSpaceRatio; 1.0 turns it off)."""
    retention_check_s: float = 60.0
    """How often retention runs."""
    index_flush_s: float = 10.0
    """How often the derived indexes (light queues, RocksDB with the WAL off) are flushed to disk, bounding replay after a crash."""
    kv_sync: bool = False
    """Fsync the durable session/offset store on every write batch (survives power loss, not only kill -9)."""

    def validate(self) -> None:
        if self.segment_size < 4096:
            raise ConfigError(f"segment_size must be at least 4096, not {self.segment_size}")
        if self.flush not in ("async", "sync"):
            raise ConfigError(f"flush must be 'async' or 'sync', not {self.flush!r}")
        for name in ("flush_interval_ms", "retention_hours", "retention_check_s", "index_flush_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if not 0.0 < self.disk_max_used_ratio <= 1.0:
            raise ConfigError(f"disk_max_used_ratio must be within (0, 1], not {self.disk_max_used_ratio}")
        if self.disk_quota_mb < 0:
            raise ConfigError("disk_quota_mb must be >= 0")
