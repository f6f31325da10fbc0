"""The native queue operations of the store interface on today's ``NativeEngine``, in-process.

The engine takes validated codec ``Request``s and answers reply dicts (the
JSON the client reads). Each operation is turned into the request object the
codec would have parsed (data always base64, so any bytes pass) and checked by
the codec's own rules, so the interface accepts exactly what the wire does;
the reply is turned back into typed results, a ``code: -1`` reply into
``NativeError``. The echo fields (``seq``, ...) stay with the protocol adapter.
"""

from __future__ import annotations

import base64
from typing import Any

from twisted.internet import defer

from lightqueue.native_engine import NativeEngine
from mqtt_proxy.native import codec
from store import api


def _address(action: int, address: api.NativeAddress) -> dict[str, Any]:
    if not isinstance(address, api.NativeAddress):
        raise api.InvalidArgument(f"expected a NativeAddress, got {type(address).__name__}")
    obj: dict[str, Any] = {"action": action}
    for key in ("queue", "topic", "group"):
        value = getattr(address, key)
        if value is not None:
            obj[key] = value
    return obj


def _item(item: api.NativeItem, to_topic: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"data": base64.b64encode(item.data).decode("ascii")}
    if item.delay_s:
        out["delay"] = item.delay_s
    if item.ttl_s is not None:
        out["ttl"] = item.ttl_s
    if item.retry_s:
        out["retry"] = item.retry_s
    if to_topic:
        out["qos"] = item.qos
        out["retain"] = item.retain
    return out


def produce_request(address: api.NativeAddress, items: tuple[api.NativeItem, ...]) -> dict[str, Any]:
    """The produce request object for ``items`` (a batch when there are several)."""
    obj = _address(codec.PRODUCE, address)
    obj["encoding"] = "base64"
    if not items:
        raise api.InvalidArgument("a produce needs at least one item")
    encoded = [_item(i, address.topic is not None) for i in items]
    if len(encoded) == 1:
        obj.update(encoded[0])
    else:
        obj["batch"] = encoded
    return obj


def consume_request(action: int, address: api.NativeAddress, **fields: Any) -> dict[str, Any]:
    """A consume, confirm, pop, ack or change-invisible-time request object."""
    obj = _address(action, address)
    obj.update((k, v) for k, v in fields.items() if v is not None)
    return obj


def produced(reply: dict) -> api.NativeProduced:
    if "msg_ids" in reply:
        return api.NativeProduced(tuple(reply["msg_ids"]), reply.get("reason", "") if reply["code"] else "")
    _check(reply)
    return api.NativeProduced((reply["msg_id"],))


def delivery(reply: dict) -> api.NativeDelivery | None:
    _check(reply)
    if "data" not in reply:
        return None
    data = reply["data"]
    body = base64.b64decode(data) if reply.get("encoding") == "base64" else data.encode("utf-8")
    return api.NativeDelivery(reply["msg_id"], body, reply.get("attempts", 1), reply.get("msg_topic"),
                              reply.get("qos"), reply.get("client_id"), reply.get("dlq_queue"),
                              reply.get("dlq_msg_id"))


def done(reply: dict) -> None:
    _check(reply)
    return None


def visible_at(reply: dict) -> int:
    _check(reply)
    return reply["visible_at"]


def _check(reply: dict) -> None:
    if reply.get("code", 0) != 0:
        raise api.NativeError(reply.get("reason", "refused"))


class LocalNative:
    """``store.api.NativeQueues`` over a NativeEngine."""

    def __init__(self, engine: NativeEngine) -> None:
        self._engine = engine

    def _handle(self, obj: dict, parse, max_data_bytes: int | None = None) -> defer.Deferred:
        try:
            req = codec.parse_request(obj, self._engine.config)
        except codec.RequestError as exc:
            raise api.InvalidArgument(exc.reason) from None
        return self._engine.handle(req, max_data_bytes).addCallback(parse)

    def native_produce(self, address: api.NativeAddress, items: tuple[api.NativeItem, ...]) -> defer.Deferred:
        return self._handle(produce_request(address, tuple(items)), produced)

    def native_consume(self, address: api.NativeAddress, max_data_bytes: int | None = None) -> defer.Deferred:
        return self._handle(consume_request(codec.CONSUME, address), delivery, max_data_bytes)

    def native_confirm(self, address: api.NativeAddress, msg_id: int) -> defer.Deferred:
        return self._handle(consume_request(codec.CONFIRM, address, msg_id=msg_id), done)

    def native_pop(self, address: api.NativeAddress, invisible_time_s: int | None = None,
                   max_data_bytes: int | None = None) -> defer.Deferred:
        req = consume_request(codec.POP, address, invisible_time=invisible_time_s)
        return self._handle(req, delivery, max_data_bytes)

    def native_ack(self, address: api.NativeAddress, msg_id: int) -> defer.Deferred:
        return self._handle(consume_request(codec.ACK, address, msg_id=msg_id), done)

    def native_change_invisible_time(self, address: api.NativeAddress, msg_id: int,
                                     invisible_time_s: int) -> defer.Deferred:
        req = consume_request(codec.CHANGE_INVISIBLE_TIME, address, msg_id=msg_id, invisible_time=invisible_time_s)
        return self._handle(req, visible_at)
