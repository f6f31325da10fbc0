"""The ``[bridge]`` section: bridges that copy what devices publish to outside systems (MongoDB today)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lightqueue.topic import TopicError, validate_topic_filter
from store.config import ConfigError, from_mapping

PAYLOAD_MODES = ("auto", "json", "bytes")
REQUIRED = ("name", "filter", "collection")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class MongoBridgeConfig:
    """One ``[[bridge.mongodb]]`` table: the messages matching ``filter`` copied into ``collection``."""

    name: str
    """The bridge's name (letters, digits, ``_.-``; at most 64): its metrics label, its row in GET bridges and the file of its position."""
    filter: str
    """The MQTT topic filter whose messages it copies (``+`` and ``#`` allowed; ``$share/`` is not)."""
    collection: str
    """The collection the documents go to, in ``[mongodb] database``."""
    payload: str = "auto"
    """How the payload is stored: ``auto`` (a JSON object as a sub-document, anything else as binary), ``json`` (any JSON value as itself, a payload that is not JSON as binary) or ``bytes`` (always binary)."""
    batch_size: int = 500
    """Documents per ``insert_many`` at most."""
    retry_max: float = 30.0
    """Seconds between retries at most while MongoDB is unreachable (the wait doubles from 0.5 s)."""

    def validate(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(f"name must be 1 to 64 letters, digits or _.-, not {self.name!r}")
        try:
            validate_topic_filter(self.filter)
        except (TopicError, UnicodeEncodeError) as exc:
            raise ConfigError(f"filter {self.filter!r}: {exc}") from None
        if self.filter.startswith("$share/"):
            raise ConfigError(f"filter must not be a shared subscription, not {self.filter!r}")
        if not self.collection or "$" in self.collection or "\x00" in self.collection \
                or self.collection.startswith("system.") or len(self.collection) > 120:
            raise ConfigError(f"collection must be a MongoDB collection name (no $, not system.*), "
                              f"not {self.collection!r}")
        if self.payload not in PAYLOAD_MODES:
            raise ConfigError(f"payload must be one of {', '.join(PAYLOAD_MODES)}, not {self.payload!r}")
        if not 1 <= self.batch_size <= 100_000:
            raise ConfigError(f"batch_size must be from 1 to 100000, not {self.batch_size!r}")
        if self.retry_max < 0.5:
            raise ConfigError(f"retry_max must be at least 0.5, not {self.retry_max!r}")


@dataclass(frozen=True)
class BridgeConfig:
    """The ``[bridge]`` section: bridges to outside systems, run by the broker side (node, broker)."""

    mongodb: tuple = ()
    """MongoDB bridges, as ``[[bridge.mongodb]]`` tables with ``name``, ``filter``, ``collection`` and optionally ``payload`` (auto, json or bytes; default auto), ``batch_size`` (default 500) and ``retry_max`` (seconds, default 30). Each is a durable subscriber of its filter inside the broker: it keeps its own position in the filter's light queue (DATA_DIR/bridges), retention keeps what it has not inserted yet, and documents get an ``_id`` of GROUP:OFFSET so a replay inserts nothing twice. Needs [mongodb] uri."""

    def validate(self) -> None:
        names = [b.name for b in self.mongodb]
        if len(set(names)) != len(names):
            raise ConfigError("mongodb: a bridge name is used twice")


def bridge_values(values: dict) -> dict:
    """``[bridge]`` as read, its ``mongodb`` array of tables built into ``MongoBridgeConfig``s (naming a bad one)."""
    values = dict(values)
    bridges = values.get("mongodb", [])
    if not isinstance(bridges, list) or not all(isinstance(b, dict) for b in bridges):
        raise ConfigError("config key bridge.mongodb must be an array of tables ([[bridge.mongodb]])")
    for i, b in enumerate(bridges):
        for key in REQUIRED:
            if key not in b:
                raise ConfigError(f"config key bridge.mongodb[{i}].{key} is missing")
    values["mongodb"] = tuple(from_mapping(MongoBridgeConfig, f"bridge.mongodb[{i}]", b)
                              for i, b in enumerate(bridges))
    return values
