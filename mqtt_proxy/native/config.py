"""The ``[native]`` config section: limits, defaults and virtual queues of the native protocol."""

from __future__ import annotations

from dataclasses import dataclass, field

from store.config import ConfigError

MAX_NAME_BYTES = 255


@dataclass(frozen=True)
class NativeConfig:
    """The ``[native]`` section (build it with ``store.config.from_mapping(NativeConfig, "native", values)``)."""

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
    """Virtual queue name -> list of real queue names; a produce to it is stored once, indexed in each."""

    def validate(self) -> None:
        for name in ("max_queue_size", "max_request_bytes", "max_datagram_bytes", "max_batch", "max_pipeline",
                     "default_ttl_s", "max_ttl_s", "max_delay_s", "max_retry_s", "default_invisible_time_s",
                     "max_invisible_time_s", "max_reconsume"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.max_datagram_bytes > 65507:
            raise ConfigError("max_datagram_bytes must be at most 65507 (the largest UDP payload)")
        if self.default_ttl_s > self.max_ttl_s:
            raise ConfigError("default_ttl_s must not exceed max_ttl_s")
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
    if size > MAX_NAME_BYTES:
        return f"queue longer than {MAX_NAME_BYTES} bytes"
    return None
