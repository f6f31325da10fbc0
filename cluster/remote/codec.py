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

from cluster.remote import columns
from cluster.remote.columns import CodecError, fail
from store import api
from store.record import Message

__all__ = ["CodecError", "OPERATIONS", "Operation", "decode", "encode", "pack", "pack_append_answer", "pack_call",
           "pack_error", "pack_queue_news", "pack_result", "store_error", "unpack", "unpack_append_answer", "unpack_call",
           "unpack_error", "unpack_queue_news", "unpack_result"]


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




def _scalar(kind: type) -> tuple[Callable, Callable]:
    def check(value):
        # bool is an int, and an IntEnum too: refuse both where a plain int is declared
        if type(value) is kind or (kind is int and isinstance(value, int)
                                   and not isinstance(value, (bool, enum.Enum))):
            return int(value) if kind is int else value
        raise fail(kind, value)

    return check, check


def _bytes() -> tuple[Callable, Callable]:
    def enc(value):
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise fail(bytes, value)

    def dec(value):
        if type(value) is bytes:
            return value
        raise fail(bytes, value)

    return enc, dec


def _float() -> tuple[Callable, Callable]:
    def conv(value):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise fail(float, value)

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
            raise fail(hint, value)
        items = [enc_i(v) for v in value]
        if build is frozenset:
            try:
                items.sort()  # one encoding per set, whatever its iteration order
            except TypeError:
                pass
        return items

    def dec(value):
        if type(value) is not list:
            raise fail(hint, value)
        return build(dec_i(v) for v in value)

    return enc, dec


def _fixed_tuple(items: tuple, hint: Any) -> tuple[Callable, Callable]:
    convs = [_converter(i) for i in items]

    def enc(value):
        if not isinstance(value, (tuple, list)) or len(value) != len(convs):
            raise fail(hint, value)
        return [e(v) for (e, _d), v in zip(convs, value)]

    def dec(value):
        if type(value) is not list or len(value) != len(convs):
            raise fail(hint, value)
        return tuple(d(v) for (_e, d), v in zip(convs, value))

    return enc, dec


def _mapping(key: Any, val: Any, hint: Any) -> tuple[Callable, Callable]:
    enc_k, dec_k = _converter(key)
    enc_v, dec_v = _converter(val)

    def enc(value):
        if not isinstance(value, collections.abc.Mapping):
            raise fail(hint, value)
        return {enc_k(k): enc_v(v) for k, v in value.items()}

    def dec(value):
        if type(value) is not dict:
            raise fail(hint, value)
        return {dec_k(k): dec_v(v) for k, v in value.items()}

    return enc, dec


def _enum(cls: type[enum.Enum]) -> tuple[Callable, Callable]:
    def enc(value):
        if not isinstance(value, cls):
            raise fail(cls, value)
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
            raise fail(cls, value)
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
            raise fail(cls, value)
        return [e(v) for (e, _d), v in zip(convs, value)]

    def dec(value):
        if type(value) is not list or len(value) != len(names):
            raise CodecError(f"expected {cls.__name__} as {len(names)} fields, got {type(value).__name__}")
        return cls(*[d(v) for (_e, d), v in zip(convs, value)])

    return enc, dec


@functools.cache
def _converter(hint: Any) -> tuple[Callable, Callable]:
    """(encode, decode) for values of ``hint``; CodecError for a type the wire cannot carry."""
    if hint is _NONE or hint is None:  # Deferred[None] keeps a bare None
        return _scalar(_NONE)
    if hint is api.ReadResult:
        return columns.read_result(_dataclass(api.ReadResult))
    if hint == tuple[Message, ...]:
        return columns.messages(_dataclass(Message))
    if hint == tuple[api.AppendResult, ...]:
        return columns.append_results(_named_tuple(api.AppendResult))
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
    if not kwargs and not op.local and len(args) == len(op.wire):
        given = args  # every argument, in order: nothing to bind (the hot calls: appends and reads)
    else:
        try:
            bound = op.signature.bind(*args, **(kwargs or {}))
        except TypeError as exc:
            raise CodecError(f"{name}: {exc}") from None
        bound.apply_defaults()
        given = [bound.arguments[param] for param, _hint in op.wire]
    values = []
    for (param, hint), value in zip(op.wire, given):
        try:
            values.append(encode(value, hint))
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


def pack_append_answer(results: tuple[api.AppendResult, ...], indexed: api.IndexedAppend | None) -> bytes:
    """``append_batch``'s result frame, with where the records went in the caller's watched queues when known.

    The frame is the result's columns (3 or 5, see ``columns.append_results``) and, when ``indexed``,
    one more: ``[group, store time, [sizes], {queue: first queue offset}]``.
    """
    try:
        value = encode(results, tuple[api.AppendResult, ...])
        if indexed is not None:
            if len(indexed.sizes) != len(results):
                raise CodecError(f"{len(indexed.sizes)} sizes for {len(results)} results")
            value.append([indexed.group, indexed.store_ts, list(indexed.sizes), dict(indexed.firsts)])
        return _packb(value)
    except CodecError as exc:
        raise CodecError(f"append_batch: result: {exc}") from None


def unpack_append_answer(data: bytes) -> tuple[tuple[api.AppendResult, ...], api.IndexedAppend | None]:
    """(results, indexed or None) of a frame ``pack_append_answer`` (or ``pack_result``) made."""
    value = _unpackb(data)
    indexed = None
    try:
        if type(value) is list and len(value) in (4, 6):
            value, extra = value[:-1], value[-1]
            if type(extra) is not list or len(extra) != 4:
                raise CodecError("where the records went is [group, store time, [sizes], {queue: offset}]")
            group, store_ts, sizes, firsts = extra
            if type(group) is not str or type(store_ts) is not int or type(sizes) is not list \
                    or (sizes and set(map(type, sizes)) != {int}) or type(firsts) is not dict \
                    or not all(type(q) is str and type(o) is int for q, o in firsts.items()):
                raise CodecError("where the records went is [group, store time, [sizes], {queue: offset}]")
            indexed = api.IndexedAppend(group, store_ts, tuple(sizes), firsts)
        results = decode(value, tuple[api.AppendResult, ...])
        if indexed is not None and len(indexed.sizes) != len(results):
            raise CodecError(f"{len(indexed.sizes)} sizes for {len(results)} results")
    except CodecError as exc:
        raise CodecError(f"append_batch: result: {exc}") from None
    return results, indexed


def pack_queue_news(queue: str, end: int, entries: api.ReadResult | None = None) -> bytes:
    """A watched queue's news event: ``[queue, end offset]``, and with ``entries`` (the news' own entries, read
    from where the connection's last news ended) ``[queue, end offset, read result]``."""
    try:
        value = [encode(queue, str), encode(end, int)]
        if entries is not None:
            value.append(encode(entries, api.ReadResult))
        return _packb(value)
    except CodecError as exc:
        raise CodecError(f"queue news: {exc}") from None


def unpack_queue_news(data: bytes) -> tuple[str, int, api.ReadResult | None]:
    """(queue, end offset, entries or None) of a frame ``pack_queue_news`` made."""
    value = _unpackb(data)
    if type(value) is not list or len(value) not in (2, 3) or type(value[0]) is not str or type(value[1]) is not int:
        raise CodecError("queue news is [queue, end offset] or [queue, end offset, read result]")
    try:
        entries = decode(value[2], api.ReadResult) if len(value) == 3 else None
    except CodecError as exc:
        raise CodecError(f"queue news: {exc}") from None
    return value[0], value[1], entries


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
