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
from collections import deque
from itertools import repeat
from operator import attrgetter, countOf
from typing import Any, Callable, NamedTuple

import msgpack

from store import api
from store.record import Message, Record, RecordKind

__all__ = ["CodecError", "OPERATIONS", "Operation", "decode", "encode", "pack", "pack_append_answer", "pack_call",
           "pack_error", "pack_queue_news", "pack_result", "store_error", "unpack", "unpack_append_answer", "unpack_call",
           "unpack_error", "unpack_queue_news", "unpack_result"]


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
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(Record))
_MESSAGE_TYPES = (str, bytes, int, int, bool, str, int, dict)  # Message's fields on the wire, kind as its value
_MESSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Message))

# A frozen dataclass's __init__ sets each field through object.__setattr__: the hot results fill the slots of
# many at once instead, through ``map`` over the slot descriptors (the same objects, equal and hashable).
_new = object.__new__
_QP, _QM, _RR = api.QueuePosition, api.QueuedMessage, api.ReadResult
_qp_queue, _qp_group, _qp_offset = (_QP.__dict__[f].__set__ for f in ("queue", "group", "offset"))
_qm_position, _qm_record = (_QM.__dict__[f].__set__ for f in ("position", "record"))
_rr_messages, _rr_next, _rr_lost = (_RR.__dict__[f].__set__ for f in ("messages", "next", "lost"))


def _column_problem(columns: Any, types_: tuple[type, ...], n: int) -> str | None:
    """Why ``columns`` are not ``len(types_)`` lists of ``n`` values each of its type (None: they are).

    One check per column, at C speed (``set(map(type, ...))``): a batch of a few hundred
    checks its cells several times faster than a loop over its rows did.
    """
    if type(columns) is not list or len(columns) != len(types_):
        return f"expected {len(types_)} columns"
    for i, (column, kind) in enumerate(zip(columns, types_)):
        if type(column) not in (list, tuple) or len(column) != n:
            return f"column {i} is not a list of {n}"
        if n and set(map(type, column)) != {kind}:
            found = sorted(t.__name__ for t in set(map(type, column)))
            return f"column {i} holds {', '.join(found)} (expected {kind.__name__})"
    return None


def _columns_of_rows(rows: Any, types_: tuple[type, ...], what: str) -> list:
    """The columns of ``rows`` (each a list of ``len(types_)`` fields of those types); CodecError if off."""
    if type(rows) is not list:
        raise CodecError(f"{what}s are a list, got {type(rows).__name__}")
    if not rows:
        return [()] * len(types_)
    if set(map(type, rows)) != {list} or set(map(len, rows)) != {len(types_)}:
        raise CodecError(f"a {what} is a list of {len(types_)} fields ({', '.join(t.__name__ for t in types_)})")
    columns = list(zip(*rows))  # transposed at C speed: the types are then checked a column at a time
    problem = _column_problem(columns, types_, len(rows))
    if problem:
        raise CodecError(f"a {what} ({', '.join(t.__name__ for t in types_)}): {problem}")
    return columns


def _kinds(column, kinds: dict) -> Any:
    """The RecordKinds of a column of their values (CodecError for an unknown one)."""
    present = set(column)
    if not present.issubset(kinds):
        raise CodecError(f"{sorted(present - kinds.keys())[0]!r} is not a RecordKind")
    if len(present) == 1:  # a batch is nearly always of one kind
        return repeat(kinds[column[0]], len(column))
    return [kinds[k] for k in column]


def _check_properties(column, what: str) -> None:
    if any(column):  # nearly every batch: all empty
        for props in column:
            if props and not all(type(k) is str and type(v) is str for k, v in props.items()):
                raise CodecError(f"{what} properties are str -> str")


def _positions(queue: str, group: str, offsets: list) -> list:
    """A QueuePosition per offset in ``queue`` and ``group``, the slots filled a field at a time."""
    n = len(offsets)
    out = list(map(_new, repeat(_QP, n)))
    deque(map(_qp_queue, out, repeat(queue, n)), 0)
    deque(map(_qp_group, out, repeat(group, n)), 0)
    deque(map(_qp_offset, out, offsets), 0)
    return out


def _queued_messages(positions: list, records: list) -> tuple:
    out = list(map(_new, repeat(_QM, len(positions))))
    deque(map(_qm_position, out, positions), 0)
    deque(map(_qm_record, out, records), 0)
    return tuple(out)


def _read_result_of(messages: tuple, next_position: api.QueuePosition, lost: int) -> api.ReadResult:
    r = _new(_RR)
    _rr_messages(r, messages)
    _rr_next(r, next_position)
    _rr_lost(r, lost)
    return r


_position_of, _record_of, _offset_of = attrgetter("position"), attrgetter("record"), attrgetter("offset")
_queue_of, _group_of = attrgetter("queue"), attrgetter("group")


def _read_result() -> tuple[Callable, Callable]:
    """``ReadResult``, the hot result (a proxy reads every message it delivers through it), packed compactly.

    One read is of one queue in one group: the wire says queue and group once, then the
    offsets, then each record as the list of its fields, instead of a position per message.
    Decoding transposes the records to check each field's type a column at a time and builds
    the records, positions and messages with ``map`` (the generic dataclass path took a third
    of a proxy's CPU in fan-out; a check and a build per record, half of the fan-in's read
    path). A read whose positions are not all of ``next``'s queue and group (none today) goes
    the generic way: the two forms differ in length (6 against 3).
    """
    generic_enc, generic_dec = _dataclass(api.ReadResult)
    kinds = {k.value: k for k in RecordKind}

    def enc(value):
        if not isinstance(value, api.ReadResult):
            raise _fail(api.ReadResult, value)
        nxt = value.next
        queue, group = nxt.queue, nxt.group
        messages = value.messages
        positions = list(map(_position_of, messages))
        records = list(map(_record_of, messages))
        if not records:
            return [queue, group, nxt.offset, value.lost, [], []]
        if set(map(_queue_of, positions)) != {queue} or set(map(_group_of, positions)) != {group} \
                or set(map(type, records)) != {Record}:
            return generic_enc(value)
        # kind is an IntEnum: msgpack packs it as its value
        rows = [[r.offset, r.size, r.kind, r.qos, r.retain, r.store_ts, r.born_ts, r.topic, r.client_id,
                 r.properties, r.body] for r in records]
        if set(map(type, map(_properties_of, records))) != {dict} or set(map(type, map(_body_of, records))) != {bytes}:
            for row in rows:  # any mapping, any buffer: as the plain types the wire carries
                row[9], row[10] = dict(row[9]), bytes(row[10])
        return [queue, group, nxt.offset, value.lost, list(map(_offset_of, positions)), rows]

    def dec(value):
        if type(value) is not list:
            raise _fail(api.ReadResult, value)
        if len(value) != 6:
            return generic_dec(value)
        queue, group, next_offset, lost, offsets, records = value
        if type(queue) is not str or type(group) is not str or type(next_offset) is not int \
                or type(lost) is not int or type(offsets) is not list or type(records) is not list \
                or len(offsets) != len(records) or (offsets and set(map(type, offsets)) != {int}):
            raise CodecError("a read result is [queue, group, next offset, lost, [offsets], [records]]")
        columns = _columns_of_rows(records, _RECORD_TYPES, "record")
        _check_properties(columns[9], "record")
        columns[2] = _kinds(columns[2], kinds)
        messages = _queued_messages(_positions(queue, group, offsets), list(map(Record, *columns)))
        return _read_result_of(messages, api.QueuePosition(queue, group, next_offset), lost)

    return enc, dec


_properties_of, _body_of = attrgetter("properties"), attrgetter("body")


def _messages() -> tuple[Callable, Callable]:
    """``tuple[Message, ...]``, ``append_batch``'s argument (every message a proxy stores goes through it).

    Two forms. Rows (a list, each message the list of its fields): both ends check the
    fields' types a column at a time (the rows transposed at C speed) and decoding builds the
    messages with one ``map``. Runs (``{"runs": [...]}``), when the batch is a few long runs
    of one topic, client id, kind, QoS and retain flag without properties (a few devices with
    many messages in flight): each run says those once, then its bodies and born times,
    ``[topic, client id, kind, qos, retain, [bodies], [born times]]``, which halves both the
    packing and the unpacking. A batch with a message off its types (a bytearray body, a
    subclass) is converted message by message the generic way, which converts it or names
    what is wrong.
    """
    hint = tuple[Message, ...]
    generic_enc, generic_dec = _converter(Message)
    kinds = {k.value: k for k in RecordKind}
    local_types = (str, bytes, RecordKind, int, bool, str, int, dict)  # the fields as a batch holds them

    def rows_of(messages) -> list:
        return [[m.topic, m.body, m.kind, m.qos, m.retain, m.client_id, m.born_ts, m.properties] for m in messages]

    def runs_of(messages) -> list | None:
        """The runs of ``messages`` when they are few (a run per four messages at most) and every field is of
        its type; else None (rows then)."""
        most = len(messages) // 4
        runs: list = []
        topic = client_id = kind = qos = retain = bodies = borns = None
        for m in messages:
            if m.topic is topic and m.client_id is client_id and m.kind is kind and m.qos is qos \
                    and m.retain is retain and not m.properties:
                bodies.append(m.body)
                borns.append(m.born_ts)
                continue
            if len(runs) >= most or m.properties:
                return None
            topic, client_id, kind, qos, retain = m.topic, m.client_id, m.kind, m.qos, m.retain
            if type(topic) is not str or type(client_id) is not str or type(kind) is not RecordKind \
                    or type(qos) is not int or type(retain) is not bool or type(m.properties) is not dict:
                return None
            bodies, borns = [m.body], [m.born_ts]
            runs.append([topic, client_id, kind, qos, retain, bodies, borns])
        for run in runs:
            if set(map(type, run[5])) != {bytes} or set(map(type, run[6])) != {int}:
                return None
        return runs

    def enc(value):
        if type(value) is not tuple and type(value) is not list:
            raise _fail(hint, value)
        if not value:
            return []
        if set(map(type, value)) != {Message}:
            value = [generic_dec(generic_enc(m)) for m in value]  # converted, or a CodecError naming what
        runs = runs_of(value)
        if runs is not None:
            return {"runs": runs}  # kind is an IntEnum: msgpack packs it as its value
        rows = rows_of(value)
        columns = list(zip(*rows))
        if _column_problem(columns, local_types, len(rows)):
            rows = rows_of(generic_dec(generic_enc(m)) for m in value)
            columns = list(zip(*rows))
        _check_properties(columns[7], "message")
        return rows

    def dec_runs(runs) -> tuple:
        if type(runs) is not list:
            raise CodecError("a batch's runs are a list")
        out: list = []
        for run in runs:
            if type(run) is not list or len(run) != 7:
                raise CodecError(f"a run is [topic, client id, kind, qos, retain, [bodies], [born times]], "
                                 f"got {run!r:.200}")
            topic, client_id, kind, qos, retain, bodies, borns = run
            if type(topic) is not str or type(client_id) is not str or type(qos) is not int \
                    or type(retain) is not bool or type(bodies) is not list or type(borns) is not list \
                    or not bodies or len(borns) != len(bodies) or set(map(type, bodies)) != {bytes} \
                    or set(map(type, borns)) != {int}:
                raise CodecError(f"a run of messages is off its types: {run!r:.200}")
            record_kind = kinds.get(kind) if type(kind) is int else None
            if record_kind is None:
                raise CodecError(f"{kind!r} is not a RecordKind")
            n = len(bodies)
            out += map(Message, repeat(topic, n), bodies, repeat(record_kind, n), repeat(qos, n), repeat(retain, n),
                       repeat(client_id, n), borns, [{} for _ in range(n)])
        return tuple(out)

    def dec(value):
        if type(value) is dict:
            if len(value) != 1 or "runs" not in value:
                raise CodecError("a batch of runs is {\"runs\": [...]}")
            return dec_runs(value["runs"])
        columns = _columns_of_rows(value, _MESSAGE_TYPES, "message")
        _check_properties(columns[7], "message")
        columns[2] = _kinds(columns[2], kinds)
        return tuple(map(Message, *columns))

    return enc, dec


def _append_results() -> tuple[Callable, Callable]:
    """``tuple[AppendResult, ...]``, ``append_batch``'s result, packed by columns.

    The messages of a batch mostly share their queues (a topic's queue and its filters'), so
    each distinct tuple of queues crosses once, in ``queue sets``, and each result names its
    set by index. A batch that was all stored (nearly every one) is ``[queue sets, [offsets],
    [set indexes]]``; any other, ``[queue sets, [offsets], [set indexes], [statuses],
    [reasons]]``. Decoding checks each column in one pass and builds the results with one
    ``map`` (the generic named-tuple path cost the proxy a converter call per field).
    """
    hint = tuple[api.AppendResult, ...]
    item_enc, item_dec = _named_tuple(api.AppendResult)
    statuses = {s.value: s for s in api.AppendStatus}
    ok = api.AppendStatus.PUT_OK
    new, cls = tuple.__new__, api.AppendResult

    def enc(value):
        if type(value) is not tuple and type(value) is not list:
            raise _fail(hint, value)
        n = len(value)
        if n and set(map(type, value)) != {cls}:
            value = [item_dec(item_enc(r)) for r in value]  # converted, or a CodecError naming what is wrong
        status, offsets, queues, reasons = map(list, zip(*value)) if n else ([], [], [], [])
        stored = countOf(status, ok) == n  # by identity, at C speed: an Enum member hashes in Python
        if n and (set(map(type, offsets)) != {int} or set(map(type, queues)) != {tuple}
                  or set(map(type, reasons)) != {str} or (not stored and set(map(type, status)) != {api.AppendStatus})):
            value = [item_dec(item_enc(r)) for r in value]
            status, offsets, queues, reasons = map(list, zip(*value))
            stored = countOf(status, ok) == n
        sets: dict[tuple, int] = {}
        indexes = [sets.setdefault(q, len(sets)) for q in queues]
        named = [list(q) for q in sets]
        if any(type(name) is not str for q in named for name in q):
            raise CodecError("queue names are str")
        if stored and not any(reasons):
            return [named, offsets, indexes]
        return [named, offsets, indexes, [s.value for s in status], reasons]

    def dec(value):
        if type(value) is not list or len(value) not in (3, 5) or type(value[0]) is not list:
            raise CodecError("append results are [[queue sets], [offsets], [set indexes](, [statuses], [reasons])]")
        sets = []
        for q in value[0]:
            if type(q) is not list or (q and set(map(type, q)) != {str}):
                raise CodecError(f"a queue set is a list of str, got {q!r:.200}")
            sets.append(tuple(q))
        n = len(value[1]) if type(value[1]) is list else -1
        problem = _column_problem(value[1:], (int, int, str, str)[:len(value) - 1], n)
        if problem:
            raise CodecError(f"append results (offsets, set indexes, statuses, reasons): {problem}")
        offsets, indexes = value[1], value[2]
        if n and not (0 <= min(indexes) and max(indexes) < len(sets)):
            raise CodecError(f"an append result's queue set index is past the {len(sets)} sets")
        queues = map(sets.__getitem__, indexes)
        if len(value) == 3:
            return tuple(map(new, repeat(cls, n), zip(repeat(ok, n), offsets, queues, repeat("", n))))
        if not set(value[3]).issubset(statuses):
            raise CodecError(f"unknown append status in {sorted(set(value[3]) - statuses.keys())!r:.200}")
        return tuple(map(new, repeat(cls, n), zip(map(statuses.__getitem__, value[3]), offsets, queues, value[4])))

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

    The frame is the result's columns (3 or 5, see ``_append_results``) and, when ``indexed``,
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
