"""Routing: which broker group owns a topic, a native queue, a client's session (DESIGN "Roles").

A fixed table of 1,024 hash slots, each assigned to one group, so adding a group
moves slots instead of rehashing everything. Keys hash with CRC32C (stable
across processes and versions, unlike ``hash()``):

- an MQTT topic by its first level (MQTT's per-topic order holds inside one
  group's log); an explicit route for a first level wins over the slots;
- a native queue by its name;
- a client id's session state by the client id.

A topic filter whose first level is a literal lives in that level's group; one
that starts with a wildcard spans every group, and a subscriber reads each
group's light queue with its own position.

Pure: no I/O, no reactor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from crc32c import crc32c

from lightqueue.names import LMQ_PREFIX, QUEUE_PREFIX, TOPIC_PREFIX
from lightqueue.topic import first_level

SLOT_COUNT = 1024


class RoutingError(ValueError):
    """A slot table or route that cannot work (a slot unassigned, an unknown group)."""


def slot_of(key: str) -> int:
    """The hash slot of ``key``."""
    return crc32c(key.encode("utf-8", "surrogatepass")) % SLOT_COUNT


def even_slots(groups: tuple[str, ...]) -> dict[str, tuple[tuple[int, int], ...]]:
    """The default assignment: contiguous, near-equal slot ranges to the groups in name order."""
    names = sorted(groups)
    if not names:
        raise RoutingError("no broker groups to assign slots to")
    out: dict[str, tuple[tuple[int, int], ...]] = {}
    for i, name in enumerate(names):
        start, end = SLOT_COUNT * i // len(names), SLOT_COUNT * (i + 1) // len(names) - 1
        out[name] = ((start, end),)
    return out


def parse_ranges(text: str) -> tuple[tuple[int, int], ...]:
    """``"0-511,700"`` -> ((0, 511), (700, 700)); a bad range is a ``RoutingError``."""
    ranges = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise RoutingError(f"slot range {part!r} is not N or N-M") from None
        if not 0 <= a <= b < SLOT_COUNT:
            raise RoutingError(f"slot range {part!r} is outside 0-{SLOT_COUNT - 1}")
        ranges.append((a, b))
    return tuple(ranges)


@dataclass(frozen=True)
class SlotTable:
    """Slots -> groups, plus explicit routes (first topic level -> group)."""

    groups: tuple[str, ...]
    slots: tuple[str, ...]
    """``slots[n]``: the group owning slot n."""
    routes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, groups: tuple[str, ...], assignment: Mapping[str, tuple[tuple[int, int], ...]] | None = None,
              routes: Mapping[str, str] | None = None) -> SlotTable:
        """A checked table: every slot assigned exactly once, every group named known."""
        groups = tuple(sorted(set(groups)))
        assignment = even_slots(groups) if not assignment else assignment
        owner: list[str | None] = [None] * SLOT_COUNT
        for group, ranges in assignment.items():
            if group not in groups:
                raise RoutingError(f"slots assigned to unknown group {group!r} (groups: {', '.join(groups)})")
            for a, b in ranges:
                for n in range(a, b + 1):
                    if owner[n] is not None:
                        raise RoutingError(f"slot {n} assigned twice ({owner[n]!r} and {group!r})")
                    owner[n] = group
        missing = [n for n, g in enumerate(owner) if g is None]
        if missing:
            raise RoutingError(f"{len(missing)} slots unassigned (first: {missing[0]})")
        routes = dict(routes or {})
        for level, group in routes.items():
            if group not in groups:
                raise RoutingError(f"route {level!r} names unknown group {group!r}")
        return cls(groups, tuple(owner), routes)  # type: ignore[arg-type]

    @classmethod
    def from_metadata(cls, metadata: Mapping) -> SlotTable:
        """The table the controllers' metadata describes (``slots``: group -> [[lo, hi], ...]; ``routes``)."""
        slots = metadata.get("slots")
        routes = metadata.get("routes") or {}
        if not isinstance(slots, Mapping) or not slots or not isinstance(routes, Mapping):
            raise RoutingError("the metadata has no slot table")
        try:
            assignment = {str(g): tuple((int(a), int(b)) for a, b in ranges) for g, ranges in slots.items()}
        except (TypeError, ValueError):
            raise RoutingError("the metadata's slot ranges are not [lo, hi] pairs") from None
        return cls.build(tuple(assignment), assignment, dict(routes))

    # -- keys -> groups -------------------------------------------------------------------------------

    def group_of_topic(self, topic: str) -> str:
        """The group whose log stores publishes to ``topic``."""
        level = first_level(topic)
        route = self.routes.get(level)
        return route if route is not None else self.slots[slot_of(level)]

    def group_of_queue(self, queue: str) -> str:
        """The group holding native queue ``queue`` (its user-facing name)."""
        return self.slots[slot_of(queue)]

    def group_of_client(self, client_id: str) -> str:
        """The group holding ``client_id``'s session state."""
        return self.slots[slot_of(client_id)]

    def groups_of_filter(self, topic_filter: str) -> tuple[str, ...]:
        """The groups whose logs may hold messages matching ``topic_filter``."""
        level = first_level(topic_filter)
        if level in ("+", "#"):
            return self.groups
        return (self.group_of_topic(level),)

    def groups_of_queue_name(self, name: str) -> tuple[str, ...]:
        """The groups holding a store queue name (light queue, topic queue or native queue)."""
        if name.startswith(LMQ_PREFIX):
            return self.groups_of_filter(name[len(LMQ_PREFIX):])
        if name.startswith(TOPIC_PREFIX):
            return (self.group_of_topic(name[len(TOPIC_PREFIX):]),)
        if name.startswith(QUEUE_PREFIX):
            return (self.group_of_queue(name[len(QUEUE_PREFIX):]),)
        return self.groups

    def slot_ranges(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """Each group's slots as contiguous ranges (admin listings, cluster.json)."""
        out: dict[str, list[tuple[int, int]]] = {g: [] for g in self.groups}
        start = 0
        for n in range(1, SLOT_COUNT + 1):
            if n == SLOT_COUNT or self.slots[n] != self.slots[start]:
                out[self.slots[start]].append((start, n - 1))
                start = n
        return {g: tuple(r) for g, r in out.items()}
