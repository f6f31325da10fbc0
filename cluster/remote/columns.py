"""Columnar msgpack encodings of the store's bulk values: the records a read answers, the messages a batch
appends, the results it gets back.

The plain codec (``cluster.remote.codec``) packs a dataclass as the list of its fields: for a read of
hundreds of records that is a list per record and an object per field to rebuild. These pack each field
as one column (a list of every record's value) and rebuild the frozen dataclasses by filling their slots
through ``map``, which is most of what a proxy spends per message it reads. ``CodecError`` lives here,
where the first codec errors are raised; ``cluster.remote.codec`` exports it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from itertools import repeat
from operator import attrgetter, countOf
from typing import Any, Callable

from store import api
from store.record import Message, Record, RecordKind

__all__ = ["CodecError", "append_results", "fail", "messages", "read_result"]


class CodecError(ValueError):
    """A value that does not fit its declared type, or bytes that are no valid frame."""

def _name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint)


def fail(hint: Any, value: Any) -> CodecError:
    """The error for ``value`` where a ``hint`` was declared."""
    return CodecError(f"expected {_name(hint)}, got {type(value).__name__}")


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


def read_result(generic: tuple[Callable, Callable]) -> tuple[Callable, Callable]:
    """``ReadResult``, the hot result (a proxy reads every message it delivers through it), packed compactly.

    One read is of one queue in one group: the wire says queue and group once, then the
    offsets, then each record as the list of its fields, instead of a position per message.
    Decoding transposes the records to check each field's type a column at a time and builds
    the records, positions and messages with ``map`` (the generic dataclass path took a third
    of a proxy's CPU in fan-out; a check and a build per record, half of the fan-in's read
    path). A read whose positions are not all of ``next``'s queue and group (none today) goes
    the generic way: the two forms differ in length (6 against 3).
    """
    generic_enc, generic_dec = generic  # the field-list form
    kinds = {k.value: k for k in RecordKind}

    def enc(value):
        if not isinstance(value, api.ReadResult):
            raise fail(api.ReadResult, value)
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
            raise fail(api.ReadResult, value)
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


def messages(generic: tuple[Callable, Callable]) -> tuple[Callable, Callable]:
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
    generic_enc, generic_dec = generic  # the field-list form
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
            raise fail(hint, value)
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


def append_results(generic: tuple[Callable, Callable]) -> tuple[Callable, Callable]:
    """``tuple[AppendResult, ...]``, ``append_batch``'s result, packed by columns.

    The messages of a batch mostly share their queues (a topic's queue and its filters'), so
    each distinct tuple of queues crosses once, in ``queue sets``, and each result names its
    set by index. A batch that was all stored (nearly every one) is ``[queue sets, [offsets],
    [set indexes]]``; any other, ``[queue sets, [offsets], [set indexes], [statuses],
    [reasons]]``. Decoding checks each column in one pass and builds the results with one
    ``map`` (the generic named-tuple path cost the proxy a converter call per field).
    """
    hint = tuple[api.AppendResult, ...]
    item_enc, item_dec = generic  # the field-list form
    statuses = {s.value: s for s in api.AppendStatus}
    ok = api.AppendStatus.PUT_OK
    new, cls = tuple.__new__, api.AppendResult

    def enc(value):
        if type(value) is not tuple and type(value) is not list:
            raise fail(hint, value)
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
