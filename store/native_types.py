"""The native queue engine's request vocabulary: the validated request, its action codes and reply helpers.

The native protocol's codec (``mqtt_proxy.native.codec``) parses JSON into a
``Request``; the queue engine (``lightqueue.native_engine``) serves it and
answers a reply dict, the JSON object the client reads. Both sides meet here,
in the store layer, because neither may import the other. ``store.api``
re-exports this module as ``store.api.native_types``. Pure data and pure
functions: no I/O.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

PRODUCE, CONSUME, CONFIRM, MONITOR, QUEUE_LIST = 1, 2, 3, 4, 7
POP, ACK, CHANGE_INVISIBLE_TIME = 11, 12, 13
CANCEL_TIMER = 14
NODE_MONITOR, NODE_QUEUE_LIST = 104, 107

ACTIONS: dict[int, str] = {
    PRODUCE: "produce", CONSUME: "consume", CONFIRM: "confirm", MONITOR: "monitor", QUEUE_LIST: "queue_list",
    POP: "pop", ACK: "ack", CHANGE_INVISIBLE_TIME: "change_invisible_time", CANCEL_TIMER: "cancel_timer",
    NODE_MONITOR: "node_monitor", NODE_QUEUE_LIST: "node_queue_list",
}
ACTION_CODES: dict[str, int] = {name: code for code, name in ACTIONS.items()}


@dataclass(frozen=True, slots=True)
class Item:
    """One message of a produce (a plain produce has one, a batch produce many)."""

    data: bytes
    delay: int = 0
    ttl: int | None = None  # None: the default (queues) or no expiry (topics)
    retry: int = 0
    qos: int = 1
    retain: bool = False


@dataclass(frozen=True, slots=True)
class Request:
    """A validated request; ``echo`` holds the fields every reply repeats (action, queue, seq, ...)."""

    action: int
    echo: dict
    queue: str | None = None
    topic: str | None = None
    group: str | None = None
    items: tuple[Item, ...] = ()
    batch: bool = False
    msg_id: int | None = None
    invisible_time: int | None = None
    encoding: str = "utf-8"

    @property
    def name(self) -> str:
        return ACTIONS[self.action]


def error_reply(reason: str, echo: dict | None = None) -> dict:
    """``{"code": -1, "reason": ...}`` plus the echoed fields."""
    out = dict(echo or {})
    out["code"] = -1
    out["reason"] = reason
    return out


def encode_data(body: bytes) -> tuple[str, str | None]:
    """A stored body as reply ``data``: text when it is UTF-8, else base64 (with ``encoding``)."""
    try:
        return body.decode("utf-8"), None
    except UnicodeDecodeError:
        return base64.b64encode(body).decode("ascii"), "base64"
