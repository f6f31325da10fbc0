"""Cluster-unique native ``msg_id``s: a broker group's number and its commit-log offset in one integer.

A broker's native engine answers with the commit-log offset of the record (unique in its group
only); the proxy in front of several groups packs the group's number above it::

    | 0 | 15 bits: group number | 48 bits: commit-log offset in that group |

and unpacks an id a request carries back (confirm, ack, change invisible time, cancel timer) to
send the request to that group with the plain offset. Group 0's ids are plain offsets, so a
single-group cluster, a node, and every id handed out before the upgrade by group 0 keep their
meaning. 48 bits of offset are 256 TiB written per group; ids below 2**53 (groups 0-31) stay
exact in JavaScript's numbers.

Group numbers: ``[cluster] group_numbers`` pins a group's number; groups it does not list take
the lowest free numbers in name order. Pure: no I/O.
"""

from __future__ import annotations

from typing import Iterable, Mapping

OFFSET_BITS = 48
GROUP_BITS = 15
MAX_OFFSET = (1 << OFFSET_BITS) - 1
MAX_GROUP_NUMBER = (1 << GROUP_BITS) - 1


def pack(number: int, offset: int) -> int:
    """The msg_id of ``offset`` in the group numbered ``number`` (a negative offset, "nothing", stays as it is)."""
    if offset < 0:
        return offset
    if offset > MAX_OFFSET:
        raise ValueError(f"offset {offset} does not fit in {OFFSET_BITS} bits")
    return number << OFFSET_BITS | offset


def unpack(msg_id: int) -> tuple[int, int]:
    """``(group number, offset)`` of a msg_id."""
    return msg_id >> OFFSET_BITS, msg_id & MAX_OFFSET


def numbering(groups: Iterable[str], pinned: Mapping[str, int] | None = None) -> dict[str, int]:
    """Every group's number: the pinned ones as given, the others the lowest free numbers in name order."""
    pinned = dict(pinned or {})
    taken = set(pinned.values())
    if len(taken) != len(pinned):
        raise ValueError("two groups pinned to the same number")
    bad = [n for n in taken if not 0 <= n <= MAX_GROUP_NUMBER]
    if bad:
        raise ValueError(f"group number {bad[0]} is outside 0-{MAX_GROUP_NUMBER}")
    out = {g: pinned[g] for g in pinned}
    free = (n for n in range(MAX_GROUP_NUMBER + 1) if n not in taken)
    for group in sorted(set(groups) - set(pinned)):
        out[group] = next(free)
    return out


class GroupIds:
    """The translation between one group's offsets and cluster msg_ids, for the replies and requests of the
    routed store."""

    def __init__(self, groups: Iterable[str], pinned: Mapping[str, int] | None = None) -> None:
        self.numbers = numbering(groups, pinned)
        self._groups = {n: g for g, n in self.numbers.items()}

    def group_of(self, msg_id: int) -> tuple[str | None, int]:
        """``(group, offset)`` of a msg_id a client sent; group None when no group has its number."""
        number, offset = unpack(msg_id)
        return self._groups.get(number), offset

    def reply(self, group: str, reply: dict, queue_request: bool) -> dict:
        """``reply`` (from ``group``'s engine) with its offsets as msg_ids: ``msg_id``, ``msg_ids``, and
        ``max_id`` of a queue (a topic's ``max_id`` is a queue position, not an id)."""
        number = self.numbers[group]
        if number == 0:
            return reply
        out = dict(reply)
        if isinstance(out.get("msg_id"), int):
            out["msg_id"] = pack(number, out["msg_id"])
        if isinstance(out.get("msg_ids"), list):
            out["msg_ids"] = [pack(number, i) if isinstance(i, int) else i for i in out["msg_ids"]]
        if queue_request and isinstance(out.get("max_id"), int):
            out["max_id"] = pack(number, out["max_id"])
        if isinstance(out.get("queues"), list):
            out["queues"] = [dict(q, max_id=pack(number, q["max_id"]))
                             if isinstance(q, dict) and isinstance(q.get("max_id"), int) else q
                             for q in out["queues"]]
        return out
