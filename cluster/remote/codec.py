"""The msgpack mapping of ``store.api``: how store calls, results and errors cross a process boundary.

Schema-directed, no type tags on the wire: a value is packed as plain msgpack
(a dataclass or a named tuple as the list of its fields in declaration order, tuples and
frozensets as arrays, enums as their values, ``Message``/``Record`` like any
dataclass) and the receiver rebuilds it from the type the interface declares
for that argument or result: the ``store.api`` Protocols' annotations are the
schema. Both ends must therefore run the same interface version (the RPC
handshake's business). Values of the wrong type are refused when packed, and
bytes that do not fit the schema raise ``CodecError`` when unpacked.

Frames:

- call: ``[operation name, [argument, ...]]`` (every parameter, defaults applied;
  callbacks stay local: ``watch_queue``'s callback is the RPC's event stream);
- result: the result value;
- error: ``[code, message]``, rebuilt as the ``StoreError`` subclass of that code
  (any other exception crosses as ``InternalError``).

It lives in ``cluster/`` rather than ``store/`` because only ``cluster/`` speaks
RPC and ``store/`` may not import msgpack (DESIGN's package table); the proxy
side sees the interface, never its encoding.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import inspect
import types
import typing
from typing import Any, Callable, NamedTuple

import msgpack

from store import api
from store.record import Message, Record, RecordKind

__all__ = ["CodecError", "OPERATIONS", "Operation", "decode", "encode", "pack", "pack_call", "pack_error",
           "pack_result", "store_error", "unpack", "unpack_call", "unpack_error", "unpack_result"]


class CodecError(ValueError):
    """A value that does not fit its declared type, or bytes that are no valid frame."""


class Operation(NamedTuple):
    """One operation of the interface, as the codec sees it."""

    name: str
    signature: inspect.Signature  # without ``self``
    wire: tuple[tuple[str, Any], ...]  # (parameter, type) of what crosses, in order
    local: tuple[str, ...]  # parameters that never cross (callbacks)
    returns: Any  # the type the Deferred fires with


def _operations() -> dict[str, Operation]:
    ops: dict[str, Operation] = {}
    for proto in api.Store.__mro__:
        if proto is api.Store or proto in (typing.Protocol, typing.Generic, object):
            continue
        for name, fn in vars(proto).items():
            if name.startswith("_") or not inspect.isfunction(fn):
                continue
            hints = typing.get_type_hints(fn)
            sig = inspect.signature(fn)
            sig = sig.replace(parameters=list(sig.parameters.values())[1:])
            wire, local = [], []
            for p in sig.parameters:
                hint = hints[p]
                if typing.get_origin(hint) is collections.abc.Callable:
                    local.append(p)
                else:
                    _converter(hint)  # fail at import for a type the codec cannot carry
                    wire.append((p, hint))
            (returns,) = typing.get_args(hints["return"])
            _converter(returns)
            ops[name] = Operation(name, sig, tuple(wire), tuple(local), returns)
    return ops


# -- values -----------------------------------------------------------------------------------------

_NONE = type(None)


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)


def _fail(hint: Any, value: Any) -> CodecError:
    return CodecError(f"expected {_name(hint)}, got {type(value).__name__}")


def _scalar(kind: type) -> tuple[Callable, Callable]:
    def check(value):
        # bool is an int, and an IntEnum too: refuse both where a plain int is declared
        if type(value) is kind or (kind is int and isinstance(value, int)
                                   and not isinstance(value, (bool, enum.Enum))):
            return int(value) if kind is int else value
        raise _fail(kind, value)

    return check, check


def _bytes() -> tuple[Callable, Callable]:
    def enc(value):
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise _fail(bytes, value)

    def dec(value):
        if type(value) is bytes:
            return value
        raise _fail(bytes, value)

    return enc, dec


def _float() -> tuple[Callable, Callable]:
    def conv(value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _fail(float, value)

    return conv, conv


def _as_is(value):
    return value


def _optional(inner: Any) -> tuple[Callable, Callable]:
    enc_i, dec_i = _converter(inner)
    return (lambda v: None if v is None else enc_i(v)), (lambda v: None if v is None else dec_i(v))


def _sequence(item: Any, build: Callable, accept: tuple[type, ...], hint: Any) -> tuple[Callable, Callable]:
    enc_i, dec_i = _converter(item)

    def enc(value):
        if not isinstance(value, accept):
            raise _fail(hint, value)
        items = [enc_i(v) for v in value]
        if build is frozenset:
            try:
                items.sort()  # one encoding per set, whatever its iteration order
            except TypeError:
                pass
        return items

    def dec(value):
        if type(value) is not list:
            raise _fail(hint, value)
        return build(dec_i(v) for v in value)

    return enc, dec


def _fixed_tuple(items: tuple, hint: Any) -> tuple[Callable, Callable]:
    convs = [_converter(i) for i in items]

    def enc(value):
        if not isinstance(value, (tuple, list)) or len(value) != len(convs):
            raise _fail(hint, value)
        return [e(v) for (e, _d), v in zip(convs, value)]

    def dec(value):
        if type(value) is not list or len(value) != len(convs):
            raise _fail(hint, value)
        return tuple(d(v) for (_e, d), v in zip(convs, value))

    return enc, dec


def _mapping(key: Any, val: Any, hint: Any) -> tuple[Callable, Callable]:
    enc_k, dec_k = _converter(key)
    enc_v, dec_v = _converter(val)

    def enc(value):
        if not isinstance(value, collections.abc.Mapping):
            raise _fail(hint, value)
        return {enc_k(k): enc_v(v) for k, v in value.items()}

    def dec(value):
        if type(value) is not dict:
            raise _fail(hint, value)
        return {dec_k(k): dec_v(v) for k, v in value.items()}

    return enc, dec


def _enum(cls: type[enum.Enum]) -> tuple[Callable, Callable]:
    def enc(value):
        if not isinstance(value, cls):
            raise _fail(cls, value)
        return value.value

    def dec(value):
        try:
            return cls(value)
        except (ValueError, TypeError):
            raise CodecError(f"{value!r} is not a {cls.__name__}") from None

    return enc, dec


def _dataclass(cls: type) -> tuple[Callable, Callable]:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    convs = [_converter(hints[n]) for n in names]  # the interface's types do not recurse

    def enc(value):
        if not isinstance(value, cls):
            raise _fail(cls, value)
        return [e(getattr(value, n)) for (e, _d), n in zip(convs, names)]

    def dec(value):
        if type(value) is not list or len(value) != len(names):
            raise CodecError(f"expected {cls.__name__} as {len(names)} fields, got {type(value).__name__}")
        return cls(*[d(v) for (_e, d), v in zip(convs, value)])

    return enc, dec


def _named_tuple(cls: type) -> tuple[Callable, Callable]:
    hints = typing.get_type_hints(cls)
    names = cls._fields
    convs = [_converter(hints[n]) for n in names]

    def enc(value):
        if not isinstance(value, cls):
            raise _fail(cls, value)
        return [e(v) for (e, _d), v in zip(convs, value)]

    def dec(value):
        if type(value) is not list or len(value) != len(names):
            raise CodecError(f"expected {cls.__name__} as {len(names)} fields, got {type(value).__name__}")
        return cls(*[d(v) for (_e, d), v in zip(convs, value)])

    return enc, dec


_RECORD_TYPES = (int, int, int, int, bool, int, int, str, str, dict, bytes)  # Record's fields, kind as its value


def _read_result() -> tuple[Callable, Callable]:
    """``ReadResult``, the hot result (a proxy reads every message it delivers through it), packed compactly.

    One read is of one queue in one group: the wire says queue and group once, then the
    offsets, then each record as the list of its fields, instead of a position per message;
    decoding checks each record's shape and field types in one pass and builds it directly
    (the generic dataclass path took a third of a proxy's CPU in fan-out). A read whose
    positions are not all of ``next``'s queue and group (none today) goes the generic way:
    the two forms differ in length (6 against 3).
    """
    generic_enc, generic_dec = _dataclass(api.ReadResult)
    kinds = {k.value: k for k in RecordKind}

    def enc(value):
        if not isinstance(value, api.ReadResult):
            raise _fail(api.ReadResult, value)
        nxt = value.next
        queue, group = nxt.queue, nxt.group
        offsets, records = [], []
        for m in value.messages:
            pos, r = m.position, m.record
            if pos.queue != queue or pos.group != group or not isinstance(r, Record):
                return generic_enc(value)
            offsets.append(pos.offset)
            records.append([r.offset, r.size, int(r.kind), r.qos, r.retain, r.store_ts, r.born_ts, r.topic,
                            r.client_id, dict(r.properties), bytes(r.body)])
        return [queue, group, nxt.offset, value.lost, offsets, records]

    def dec(value):
        if type(value) is not list:
            raise _fail(api.ReadResult, value)
        if len(value) != 6:
            return generic_dec(value)
        queue, group, next_offset, lost, offsets, records = value
        if type(queue) is not str or type(group) is not str or type(next_offset) is not int \
                or type(lost) is not int or type(offsets) is not list or type(records) is not list \
                or len(offsets) != len(records):
            raise CodecError("a read result is [queue, group, next offset, lost, [offsets], [records]]")
        messages = []
        position, message = api.QueuePosition, api.QueuedMessage
        for offset, r in zip(offsets, records):
            if type(offset) is not int or type(r) is not list or tuple(map(type, r)) != _RECORD_TYPES:
                raise CodecError(f"a record is [{', '.join(t.__name__ for t in _RECORD_TYPES)}], got {r!r:.200}")
            kind = kinds.get(r[2])
            if kind is None:
                raise CodecError(f"{r[2]!r} is not a RecordKind")
            props = r[9]
            if props and not all(type(k) is str and type(v) is str for k, v in props.items()):
                raise CodecError("record properties are str -> str")
            messages.append(message(position(queue, group, offset),
                                    Record(r[0], r[1], kind, r[3], r[4], r[5], r[6], r[7], r[8], props, r[10])))
        return api.ReadResult(tuple(messages), position(queue, group, next_offset), lost)

    return enc, dec


_MESSAGE_TYPES = (str, bytes, int, int, bool, str, int, dict)  # Message's fields on the wire, kind as its value


def _messages() -> tuple[Callable, Callable]:
    """``tuple[Message, ...]``, ``append_batch``'s argument (every message a proxy stores goes through it).

    The wire is the generic one (each message the list of its fields); encoding checks a
    message's field types in one expression and decoding builds it directly, instead of a
    converter call per field (a fifth of a proxy's CPU in QoS 1 fan-in). A message off its
    types goes the generic way, which converts it or names what is wrong.
    """
    hint = tuple[Message, ...]
    generic_enc, _generic_dec = _sequence(Message, tuple, (tuple, list), hint)
    kinds = {k.value: k for k in RecordKind}

    def enc(value):
        if type(value) is not tuple and type(value) is not list:
            raise _fail(hint, value)
        out = []
        for m in value:
            if type(m) is not Message:
                return generic_enc(value)
            props = m.properties
            if type(m.topic) is not str or type(m.body) is not bytes or type(m.kind) is not RecordKind \
                    or type(m.qos) is not int or type(m.retain) is not bool or type(m.client_id) is not str \
                    or type(m.born_ts) is not int or type(props) is not dict \
                    or (props and not all(type(k) is str and type(v) is str for k, v in props.items())):
                return generic_enc(value)
            out.append([m.topic, m.body, m.kind.value, m.qos, m.retain, m.client_id, m.born_ts, props])
        return out

    def dec(value):
        if type(value) is not list:
            raise _fail(hint, value)
        out = []
        for r in value:
            if type(r) is not list or tuple(map(type, r)) != _MESSAGE_TYPES:
                raise CodecError(f"a message is [str, bytes, int, int, bool, str, int, dict], got {r!r:.200}")
            kind = kinds.get(r[2])
            if kind is None:
                raise CodecError(f"{r[2]!r} is not a RecordKind")
            props = r[7]
            if props and not all(type(k) is str and type(v) is str for k, v in props.items()):
                raise CodecError("message properties are str -> str")
            out.append(Message(r[0], r[1], kind, r[3], r[4], r[5], r[6], props))
        return tuple(out)

    return enc, dec


def _append_results() -> tuple[Callable, Callable]:
    """``tuple[AppendResult, ...]``, ``append_batch``'s result, packed compactly: ``[queue sets, rows]``.

    The messages of a batch mostly share their queues (a topic's queue and its filters'), so
    each distinct tuple of queues crosses once, in ``queue sets``, and ``rows`` is flat: status,
    offset, index of its queue set, reason, per result. Decoding builds each AppendResult
    directly (the generic named-tuple path cost the proxy a converter call per field).
    """
    hint = tuple[api.AppendResult, ...]
    item_enc, item_dec = _named_tuple(api.AppendResult)
    statuses = {s.value: s for s in api.AppendStatus}

    def enc(value):
        if type(value) is not tuple and type(value) is not list:
            raise _fail(hint, value)
        sets: dict[tuple, int] = {}
        rows: list = []
        for r in value:
            if type(r) is not api.AppendResult or type(r.status) is not api.AppendStatus \
                    or type(r.offset) is not int or type(r.queues) is not tuple or type(r.reason) is not str:
                r = item_dec(item_enc(r))  # converted, or a CodecError naming what is wrong
            queues = r.queues
            i = sets.get(queues)
            if i is None:
                if not all(type(q) is str for q in queues):
                    queues = item_dec(item_enc(r)).queues
                i = sets[queues] = len(sets)
            rows += (r.status.value, r.offset, i, r.reason)
        return [[list(q) for q in sets], rows]

    def dec(value):
        if type(value) is not list or len(value) != 2 or type(value[0]) is not list or type(value[1]) is not list \
                or len(value[1]) % 4:
            raise CodecError("append results are [[queue sets], [status, offset, set, reason, ...]]")
        sets = []
        for q in value[0]:
            if type(q) is not list or not all(type(n) is str for n in q):
                raise CodecError(f"a queue set is a list of str, got {q!r:.200}")
            sets.append(tuple(q))
        rows, n, out, new, cls = value[1], len(sets), [], tuple.__new__, api.AppendResult
        for status, offset, i, reason in zip(rows[0::4], rows[1::4], rows[2::4], rows[3::4]):
            if type(status) is not str or type(offset) is not int or type(i) is not int or not 0 <= i < n \
                    or type(reason) is not str or status not in statuses:
                raise CodecError(f"an append result row is [status, offset, set 0..{n - 1}, reason], got "
                                 f"{[status, offset, i, reason]!r:.200}")
            out.append(new(cls, (statuses[status], offset, sets[i], reason)))
        return tuple(out)

    return enc, dec


@functools.cache
def _converter(hint: Any) -> tuple[Callable, Callable]:
    """(encode, decode) for values of ``hint``; CodecError for a type the wire cannot carry."""
    if hint is _NONE or hint is None:  # Deferred[None] keeps a bare None
        return _scalar(_NONE)
    if hint is api.ReadResult:
        return _read_result()
    if hint == tuple[Message, ...]:
        return _messages()
    if hint == tuple[api.AppendResult, ...]:
        return _append_results()
    if hint in (int, str, bool):
        return _scalar(hint)
    if hint is bytes:
        return _bytes()
    if hint is float:
        return _float()
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass(hint)
    if isinstance(hint, type) and issubclass(hint, tuple) and hasattr(hint, "_fields"):
        return _named_tuple(hint)
    if hint is typing.Any:  # a native request or reply: msgpack carries its JSON values as they are
        return _as_is, _as_is
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        rest = [a for a in args if a is not _NONE]
        if len(rest) == 1 and len(args) == 2:
            return _optional(rest[0])
    elif origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _sequence(args[0], tuple, (tuple, list), hint)
        if args:
            return _fixed_tuple(args, hint)
    elif origin is frozenset:
        return _sequence(args[0], frozenset, (set, frozenset), hint)
    elif origin in (dict, collections.abc.Mapping):
        return _mapping(args[0], args[1], hint)
    raise CodecError(f"the store codec cannot carry values of type {hint!r}")


def encode(value: Any, hint: Any) -> Any:
    """``value`` (of type ``hint``) as plain msgpack-able data; CodecError if it is not of that type."""
    return _converter(hint)[0](value)


def decode(data: Any, hint: Any) -> Any:
    """The value of type ``hint`` that ``encode`` turned into ``data``; CodecError if it does not fit."""
    return _converter(hint)[1](data)


def _packb(data: Any) -> bytes:
    try:
        return msgpack.packb(data, use_bin_type=True)
    except (OverflowError, UnicodeEncodeError, ValueError, TypeError) as exc:  # ints past 64 bits, lone surrogates
        raise CodecError(f"cannot be packed: {exc}") from None


def pack(value: Any, hint: Any) -> bytes:
    """``value`` of type ``hint`` as msgpack bytes."""
    return _packb(encode(value, hint))


def _unpackb(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as exc:
        raise CodecError(f"not a msgpack frame: {exc}") from None


def unpack(data: bytes, hint: Any) -> Any:
    """The value of type ``hint`` packed in ``data``."""
    return decode(_unpackb(data), hint)


# -- frames --------------------------------------------------------------------------------------

OPERATIONS: dict[str, Operation] = _operations()


def _operation(name: Any) -> Operation:
    op = OPERATIONS.get(name) if isinstance(name, str) else None
    if op is None:
        raise CodecError(f"unknown store operation {name!r}")
    return op


def pack_call(name: str, args: tuple = (), kwargs: dict | None = None) -> bytes:
    """A call frame for ``name(*args, **kwargs)`` (callbacks left out); CodecError for a bad argument."""
    op = _operation(name)
    try:
        bound = op.signature.bind(*args, **(kwargs or {}))
    except TypeError as exc:
        raise CodecError(f"{name}: {exc}") from None
    bound.apply_defaults()
    values = []
    for param, hint in op.wire:
        try:
            values.append(encode(bound.arguments[param], hint))
        except CodecError as exc:
            raise CodecError(f"{name}: argument {param}: {exc}") from None
    try:
        return _packb([name, values])
    except CodecError as exc:
        raise CodecError(f"{name}: {exc}") from None


def unpack_call(data: bytes) -> tuple[str, tuple]:
    """(operation name, wire arguments in order) of a call frame."""
    frame = _unpackb(data)
    if type(frame) is not list or len(frame) != 2 or type(frame[1]) is not list:
        raise CodecError("a call frame is [operation, [arguments]]")
    op = _operation(frame[0])
    if len(frame[1]) != len(op.wire):
        raise CodecError(f"{op.name} takes {len(op.wire)} arguments, the frame has {len(frame[1])}")
    args = []
    for (param, hint), value in zip(op.wire, frame[1]):
        try:
            args.append(decode(value, hint))
        except CodecError as exc:
            raise CodecError(f"{op.name}: argument {param}: {exc}") from None
    return op.name, tuple(args)


def pack_result(name: str, value: Any) -> bytes:
    """A result frame of operation ``name``; CodecError if ``value`` is not what it declares."""
    try:
        return pack(value, _operation(name).returns)
    except CodecError as exc:
        raise CodecError(f"{name}: result: {exc}") from None


def unpack_result(name: str, data: bytes) -> Any:
    """The result of operation ``name`` packed in ``data``."""
    try:
        return unpack(data, _operation(name).returns)
    except CodecError as exc:
        raise CodecError(f"{name}: result: {exc}") from None


def _error_classes() -> dict[str, type[api.StoreError]]:
    found = {api.StoreError.code: api.StoreError}
    todo = [api.StoreError]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.setdefault(sub.code, sub)
            todo.append(sub)
    return found


_ERRORS = _error_classes()


def pack_error(exc: BaseException) -> bytes:
    """An error frame: a StoreError keeps its code; anything else becomes ``internal``."""
    if isinstance(exc, api.StoreError):
        code, message = exc.code, str(exc)
    else:
        code, message = api.InternalError.code, f"{type(exc).__name__}: {exc}"
    message = " ".join(message.split()).encode("utf-8", "replace").decode("utf-8")  # one line, packable
    return _packb([code, message])


def unpack_error(data: bytes) -> api.StoreError:
    """The StoreError of an error frame (an unknown code gives a plain StoreError naming it)."""
    frame = _unpackb(data)
    if type(frame) is not list or len(frame) != 2 or not all(type(x) is str for x in frame):
        raise CodecError("an error frame is [code, message]")
    return store_error(*frame)


def store_error(code: str, message: str) -> api.StoreError:
    """The StoreError subclass of ``code`` with ``message`` (an unknown code: a plain StoreError naming it)."""
    cls = _ERRORS.get(code)
    return cls(message) if cls is not None else api.StoreError(f"{code}: {message}")
