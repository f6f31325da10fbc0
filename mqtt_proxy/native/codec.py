"""Sans-IO codec of the native protocol: bytes in, a checked ``Request`` (or a ``RequestError``) out.

Nothing here does I/O or reads a clock. ``parse_request`` validates every field
the action uses and names the first problem; ``encode_reply`` turns a reply dict
into one line of JSON; ``LineBuffer`` splits a TCP byte stream into request
lines, turning an over-long line into one ``LINE_TOO_LONG`` marker (the rest of
that line is skipped, the connection stays usable).

The action table and the field rules are documented in ``mqtt_proxy.native``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

import orjson

from lightqueue.topic import TopicError, validate_topic_name
from mqtt_proxy.publish_rules import Origin, PublishRules, Refuse, decide
from store.api import native_types
from store.config import NativeConfig, check_queue_name

# The request vocabulary is the store's (the queue engine serves it); re-exported for the protocol's users.
Request, Item = native_types.Request, native_types.Item
ACTIONS, ACTION_CODES = native_types.ACTIONS, native_types.ACTION_CODES
PRODUCE, CONSUME, CONFIRM = native_types.PRODUCE, native_types.CONSUME, native_types.CONFIRM
MONITOR, QUEUE_LIST = native_types.MONITOR, native_types.QUEUE_LIST
POP, ACK, CHANGE_INVISIBLE_TIME = native_types.POP, native_types.ACK, native_types.CHANGE_INVISIBLE_TIME
NODE_MONITOR, NODE_QUEUE_LIST = native_types.NODE_MONITOR, native_types.NODE_QUEUE_LIST
error_reply, encode_data = native_types.error_reply, native_types.encode_data

MAX_SEQ_CHARS = 256
MAX_GOOD_QUEUE_NAMES = 65536
_GOOD_QUEUE_NAMES: set[str] = set()  # queue names check_queue_name passed (checked once, not per request)
MAX_GROUP_BYTES = 255
MAX_MSG_ID = (1 << 63) - 1
ENCODINGS = ("utf-8", "base64")
_QUEUE_ACTIONS = (PRODUCE, CONSUME, CONFIRM, MONITOR, POP, ACK, CHANGE_INVISIBLE_TIME)


NATIVE_RULES = PublishRules()
"""The publish decision's rules for a native produce to a topic: no ACL (the native listener has no users), the
topic rules of the codec; payload sizes are ``max_data_bytes``'s."""


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """Bounds on a topic name a request gives (the MQTT side's ``[limits]``)."""

    max_length: int
    """Most bytes of UTF-8 (``max_topic_length``)."""
    max_levels: int
    """Most ``/``-separated levels (``max_topic_levels``)."""


class RequestError(ValueError):
    """A request that cannot be served: ``reason`` for the reply, ``echo`` the fields it can still echo."""

    def __init__(self, reason: str, echo: dict | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.echo = echo or {}


# -- replies -------------------------------------------------------------------------------------

def encode_reply(reply: dict) -> bytes:
    """One reply as compact JSON (no newline: the transport adds the framing).

    orjson writes the same compact UTF-8 JSON as the stdlib encoder below, at a
    fraction of the cost; what it refuses (a lone surrogate, an integer past
    64 bits) goes the stdlib way, as before.
    """
    try:
        return _orjson_dumps(reply)
    except TypeError:
        pass
    try:
        return _ENCODER_UTF8.encode(reply).encode("utf-8")
    except UnicodeEncodeError:
        return _ENCODER_ASCII.encode(reply).encode("ascii")


# -- requests ------------------------------------------------------------------------------------

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


def _safe_str(value: Any, limit: int) -> bool:
    if not isinstance(value, str) or len(value) > limit:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def echo_of(obj: dict) -> dict:
    """The echo fields that are well-formed enough to repeat back."""
    echo: dict = {}
    action = obj.get("action")
    if (isinstance(action, int) and not isinstance(action, bool) and abs(action) < 1 << 31) or \
            (isinstance(action, str) and action in ACTION_CODES):
        echo["action"] = action
    for key in ("queue", "topic", "group"):
        if key in obj and _safe_str(obj[key], 65535):
            echo[key] = obj[key]
    seq = obj.get("seq")
    if (isinstance(seq, int) and not isinstance(seq, bool) and abs(seq) < 1 << 63) or _safe_str(seq, MAX_SEQ_CHARS):
        echo["seq"] = seq
    return echo


def _has_float(obj: dict) -> bool:
    """Whether any value, at any depth, is a float (orjson turns integers past 64 bits into floats)."""
    todo = [obj]  # a stack, not recursion: orjson reads deeper nesting than Python's recursion limit
    while todo:
        value = todo.pop()
        t = type(value)
        if t is float:
            return True
        if t is dict:
            todo.extend(value.values())
        elif t is list:
            todo.extend(value)
    return False


def parse_json(raw: bytes | str) -> dict:
    """Decode one request object; raise RequestError (with no echo) if it is not a JSON object.

    orjson decodes the common request; whatever it refuses (lone surrogates,
    infinities, deep nesting, malformed input) or reads differently (integers
    past 64 bits become floats there) is decoded again by the stdlib decoder, so
    results and error messages stay the stdlib's.
    """
    try:
        obj = _orjson_loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        pass
    else:
        if type(obj) is dict and not _has_float(obj):
            return obj
    return _parse_json_stdlib(raw)


def _parse_json_stdlib(raw: bytes | str) -> dict:
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError("request is not valid UTF-8") from None
    try:
        obj = _DECODER.decode(raw)
    except RecursionError:
        raise RequestError("malformed JSON: nested too deeply") from None
    except ValueError as exc:
        raise RequestError(f"malformed JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise RequestError("request must be a JSON object")
    return obj


def parse_request(raw: bytes | str | dict, config: NativeConfig, topic_limits: TopicLimits | None = None) -> Request:
    """Decode and validate one request; raise RequestError naming the first problem.

    ``topic_limits`` are the MQTT side's (``[limits] max_topic_length`` and ``max_topic_levels``): a topic a
    native client names obeys them as an MQTT publisher's does.
    """
    obj = raw if isinstance(raw, dict) else parse_json(raw)
    echo = echo_of(obj)
    try:
        return _validate(obj, echo, config, topic_limits)
    except RequestError as exc:
        exc.echo = echo
        raise


def request_object(req: Request) -> dict:
    """A validated request as the JSON object that parses back to it (a proxy forwards requests whole).

    The echo fields are kept as the client sent them, so the reply echoes them unchanged.
    """
    obj = dict(req.echo)
    obj.setdefault("action", req.action)
    for key in ("queue", "topic", "group", "msg_id", "invisible_time"):
        value = getattr(req, key)
        if value is not None:
            obj[key] = value
    if req.encoding != "utf-8":
        obj["encoding"] = req.encoding
    if req.items:
        entries = []
        for item in req.items:
            data = base64.b64encode(item.data).decode("ascii") if req.encoding == "base64" else item.data.decode()
            entry = {"data": data, "delay": item.delay, "retry": item.retry}
            if item.ttl is not None:
                entry["ttl"] = item.ttl
            if req.topic is not None:
                entry["qos"], entry["retain"] = item.qos, item.retain
            entries.append(entry)
        if req.batch:
            obj["batch"] = entries
        else:
            obj.update(entries[0])
    return obj


def _int(obj: dict, key: str, default: int | None, lo: int, hi: int) -> int | None:
    if key not in obj or obj[key] is None:
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{key} must be an integer, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise RequestError(f"{key} must be between {lo} and {hi}, not {value}")
    return value


def _str(obj: dict, key: str, *, required: bool = False) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise RequestError(f"missing field {key}")
        return None
    if not isinstance(value, str):
        raise RequestError(f"{key} must be a string, not {type(value).__name__}")
    return value


def _validate(obj: dict, echo: dict, cfg: NativeConfig, topic_limits: TopicLimits | None) -> Request:
    if "action" not in obj:
        raise RequestError("missing field action")
    raw_action = obj["action"]
    if isinstance(raw_action, str):
        if raw_action not in ACTION_CODES:
            raise RequestError(f"unknown action {raw_action[:64]!r}")
        action = ACTION_CODES[raw_action]
    elif isinstance(raw_action, int) and not isinstance(raw_action, bool):
        if raw_action not in ACTIONS:
            raise RequestError(f"unknown action {raw_action}")
        action = raw_action
    else:
        raise RequestError(f"action must be an integer code or a name, not {type(raw_action).__name__}")
    seq = obj.get("seq")
    if seq is not None and "seq" not in echo:
        raise RequestError(f"seq must be an integer or a string of at most {MAX_SEQ_CHARS} characters")
    if action == native_types.CANCEL_TIMER:  # msg_id: the id a delayed produce answered
        msg_id = _int(obj, "msg_id", None, 0, MAX_MSG_ID)
        if msg_id is None:
            raise RequestError("missing field msg_id")
        return Request(action, echo, msg_id=msg_id)
    if action not in _QUEUE_ACTIONS:
        return Request(action, echo)

    queue, topic = _str(obj, "queue"), _str(obj, "topic")
    if (queue is None) == (topic is None):
        raise RequestError("exactly one of queue and topic is required")
    if queue is not None and queue not in _GOOD_QUEUE_NAMES:
        problem = check_queue_name(queue)
        if problem:
            raise RequestError(problem)
        if len(_GOOD_QUEUE_NAMES) >= MAX_GOOD_QUEUE_NAMES:
            _GOOD_QUEUE_NAMES.clear()
        _GOOD_QUEUE_NAMES.add(queue)
    if queue is None:
        try:
            if topic_limits is None:
                validate_topic_name(topic)
            else:
                validate_topic_name(topic, topic_limits.max_length, topic_limits.max_levels)
        except TopicError as exc:
            raise RequestError(f"bad topic: {exc}") from None
        except UnicodeEncodeError:
            raise RequestError("topic is not valid UTF-8") from None
    group = _str(obj, "group")
    if group is not None and (check_queue_name(group) or len(group.encode("utf-8")) > MAX_GROUP_BYTES):
        raise RequestError("group must be a non-empty name of at most 255 bytes without ',', NUL or line breaks")
    encoding = _str(obj, "encoding") or "utf-8"
    if encoding not in ENCODINGS:
        raise RequestError(f"encoding must be one of {', '.join(ENCODINGS)}")

    if action == PRODUCE:
        if topic is not None and group is not None:
            raise RequestError("group is not used by produce")
        if topic is not None:
            # The one publish decision (the ``$`` reservation above all); the retained quota is the engine's.
            verdict = decide(NATIVE_RULES, Origin.NATIVE, topic, 0, False, topic_checked=True)  # checked above
            if type(verdict) is Refuse:
                raise RequestError(verdict.why)
        if "batch" in obj and obj["batch"] is not None:
            if "data" in obj:
                raise RequestError("give either data or batch, not both")
            batch = obj["batch"]
            if not isinstance(batch, list) or not batch:
                raise RequestError("batch must be a non-empty list")
            if len(batch) > cfg.max_batch:
                raise RequestError(f"batch of {len(batch)} messages exceeds max_batch {cfg.max_batch}")
            items = []
            for i, entry in enumerate(batch):
                if isinstance(entry, str):
                    entry = {"data": entry}
                if not isinstance(entry, dict):
                    raise RequestError(f"batch[{i}] must be a string or an object")
                unknown = set(entry) - {"data", "delay", "ttl", "retry", "qos", "retain"}
                if unknown:
                    raise RequestError(f"batch[{i}]: unknown field {sorted(unknown)[0]!r}")
                merged = {k: obj[k] for k in ("delay", "ttl", "retry", "qos", "retain") if k in obj}
                merged.update(entry)
                try:
                    items.append(_item(merged, topic is not None, encoding, cfg))
                except RequestError as exc:
                    raise RequestError(f"batch[{i}]: {exc.reason}") from None
            return Request(action, echo, queue, topic, None, tuple(items), True, encoding=encoding)
        return Request(action, echo, queue, topic, None, (_item(obj, topic is not None, encoding, cfg),),
                       encoding=encoding)

    msg_id = _int(obj, "msg_id", None, 0, MAX_MSG_ID)
    if action in (CONFIRM, ACK, CHANGE_INVISIBLE_TIME) and msg_id is None:
        raise RequestError("missing field msg_id")
    invisible = None
    if action in (POP, CHANGE_INVISIBLE_TIME):
        default = cfg.default_invisible_time_s if action == POP else None
        invisible = _int(obj, "invisible_time", default, 1, cfg.max_invisible_time_s)
        if invisible is None:
            raise RequestError("missing field invisible_time")
    return Request(action, echo, queue, topic, group, (), False, msg_id, invisible, encoding)


def _item(obj: dict, to_topic: bool, encoding: str, cfg: NativeConfig) -> Item:
    data = obj.get("data")
    if data is None:
        raise RequestError("missing field data")
    if not isinstance(data, str):
        raise RequestError(f"data must be a string, not {type(data).__name__}")
    if encoding == "base64":
        try:
            body = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("data is not valid base64") from None
    else:
        try:
            body = data.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError("data is not valid UTF-8 (lone surrogate)") from None
    delay = _int(obj, "delay", 0, 0, cfg.max_delay_s)
    ttl = _int(obj, "ttl", None if to_topic else cfg.default_ttl_s, 1, cfg.max_ttl_s)
    retry = _int(obj, "retry", 0, 0, cfg.max_retry_s)
    if ttl is not None and ttl <= delay:
        raise RequestError(f"ttl ({ttl}) must be greater than delay ({delay})")
    qos, retain = 1, False
    if to_topic:
        if retry:
            raise RequestError("retry is for queues; topic subscribers get MQTT delivery")
        qos = _int(obj, "qos", 1, 0, 2)
        retain = obj.get("retain", False)
        if not isinstance(retain, bool):
            raise RequestError("retain must be true or false")
    else:
        for key in ("qos", "retain"):
            if obj.get(key) is not None:
                raise RequestError(f"{key} is for topics, not queues")
    return Item(body, delay, ttl, retry, qos, retain)


class _LineTooLong:
    def __repr__(self) -> str:
        return "LINE_TOO_LONG"


LINE_TOO_LONG = _LineTooLong()


class LineBuffer:
    """Splits a byte stream at ``\\n`` (a trailing ``\\r`` is dropped; blank lines are skipped)."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list:
        """The complete lines in ``data`` (bytes), with ``LINE_TOO_LONG`` for each over-long line."""
        if data and not self._buf and not self._skipping and data.find(b"\n") == len(data) - 1:
            # one whole line, the common case of one request in flight: no copy through the buffer
            line = bytes(data[:-1])
            if line.endswith(b"\r"):
                line = line[:-1]
            if len(line) > self.max_line:
                return [LINE_TOO_LONG]
            return [line] if line.strip() else []
        out: list = []
        buf = self._buf
        buf += data
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                line = bytes(buf[start:nl])
                if line.endswith(b"\r"):
                    line = line[:-1]
                if len(line) > self.max_line:
                    out.append(LINE_TOO_LONG)
                elif line.strip():
                    out.append(line)
            start = nl + 1
        del buf[:start]
        if len(buf) > self.max_line:
            if not self._skipping:
                out.append(LINE_TOO_LONG)
                self._skipping = True
            del buf[:]
        return out


# json.loads/dumps with options build a new decoder/encoder per call: build them once.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER_UTF8 = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_ENCODER_ASCII = json.JSONEncoder(separators=(",", ":"))
_orjson_loads, _orjson_dumps = orjson.loads, orjson.dumps
