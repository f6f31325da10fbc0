"""Snowflake ids: 63-bit integers unique across the cluster, made locally without a round trip.

Layout of an id (the sign bit is always 0, so every id is a positive signed 64-bit integer)::

    time-first (``next_id``: ordered by time, for logs and keys read in order)
    | 0 | 41 bits: ms since EPOCH_MS | 4 bits: zone | 8 bits: worker | 10 bits: sequence |

    sequence-first (``next_spread_id``: consecutive ids far apart, for keys that must spread
    over shards or hash ranges instead of piling onto the newest one; Turms' "large gap" id)
    | 0 | 10 bits: sequence | 41 bits: ms since EPOCH_MS | 4 bits: zone | 8 bits: worker |

The worker id is leased from the controllers, so two live processes of one zone never share it;
the zone number comes from the member's zone. 41 bits of milliseconds last 69 years from the
epoch. Both variants draw (millisecond, sequence) pairs from the same generator, so an id of one
variant never repeats one of the other's pairs.

Time is read from an injected clock (``seconds()``, as ``IReactorTime``). The generator never
blocks: when the clock steps back it keeps counting from the last millisecond it used, and when
the 1,024 sequence numbers of a millisecond are spent it borrows the next millisecond. Its
logical time may so run ahead of the clock, by at most ``max_lead_ms``; past that ``IdsExhausted``
is raised (a clock that fell back that far, or more than about a million ids a second).
"""

from __future__ import annotations

from dataclasses import dataclass

EPOCH_MS = 1_767_225_600_000
"""2026-01-01T00:00:00Z: millisecond 0 of every id (fixed forever: changing it would reuse ids)."""

TIME_BITS, ZONE_BITS, WORKER_BITS, SEQUENCE_BITS = 41, 4, 8, 10
MAX_ZONE = (1 << ZONE_BITS) - 1
MAX_WORKER = (1 << WORKER_BITS) - 1
MAX_SEQUENCE = (1 << SEQUENCE_BITS) - 1
MAX_TIME = (1 << TIME_BITS) - 1

_NODE_BITS = ZONE_BITS + WORKER_BITS  # zone and worker together: the generator's identity


class IdsExhausted(Exception):
    """No id can be made now: the logical time would run more than ``max_lead_ms`` ahead of the clock."""


@dataclass(frozen=True, slots=True)
class IdParts:
    """What an id is made of (``decode``)."""

    ms: int
    """Milliseconds since ``EPOCH_MS``."""
    zone: int
    """Zone number, 0-15."""
    worker: int
    """Worker id, 0-255."""
    sequence: int
    """Sequence number within the millisecond, 0-1023."""


def zone_number(zone: str) -> int:
    """A zone name's number (0-15): stable across processes and versions (a sum of its bytes, not ``hash``)."""
    return sum(zone.encode()) & MAX_ZONE


def compose(ms: int, zone: int, worker: int, sequence: int) -> int:
    """The time-first id of these parts."""
    return (((ms << ZONE_BITS | zone) << WORKER_BITS | worker) << SEQUENCE_BITS) | sequence


def compose_spread(ms: int, zone: int, worker: int, sequence: int) -> int:
    """The sequence-first id of these parts."""
    return ((sequence << TIME_BITS | ms) << _NODE_BITS) | (zone << WORKER_BITS) | worker


def decode(value: int) -> IdParts:
    """The parts of a time-first id."""
    return IdParts(value >> (SEQUENCE_BITS + _NODE_BITS), (value >> (SEQUENCE_BITS + WORKER_BITS)) & MAX_ZONE,
                   (value >> SEQUENCE_BITS) & MAX_WORKER, value & MAX_SEQUENCE)


def decode_spread(value: int) -> IdParts:
    """The parts of a sequence-first id."""
    return IdParts((value >> _NODE_BITS) & MAX_TIME, (value >> WORKER_BITS) & MAX_ZONE, value & MAX_WORKER,
                   value >> (TIME_BITS + _NODE_BITS))


class SnowflakeIds:
    """Makes ids for one (zone, worker); one instance per process and worker id lease."""

    def __init__(self, zone: int, worker: int, clock, max_lead_ms: int = 1000, epoch_ms: int = EPOCH_MS) -> None:
        if not 0 <= zone <= MAX_ZONE:
            raise ValueError(f"zone must be 0-{MAX_ZONE}, not {zone!r}")
        if not 0 <= worker <= MAX_WORKER:
            raise ValueError(f"worker must be 0-{MAX_WORKER}, not {worker!r}")
        if max_lead_ms < 0:
            raise ValueError(f"max_lead_ms must not be negative, not {max_lead_ms!r}")
        self.zone = zone
        self.worker = worker
        self._clock = clock
        self._max_lead_ms = max_lead_ms
        self._epoch_ms = epoch_ms
        self._ms = -1  # the millisecond of the last id made (logical: never goes back)
        self._sequence = MAX_SEQUENCE
        self.clock_steps_back = 0
        """How often the clock was found behind the last millisecond used (for metrics)."""
        self.borrowed_ms = 0
        """How often a spent millisecond made the generator take the next one (for metrics)."""

    def _next_pair(self) -> tuple[int, int]:
        now = int(self._clock.seconds() * 1000) - self._epoch_ms
        if now < 0 or now > MAX_TIME:
            raise IdsExhausted(f"the clock ({now} ms from the epoch) is outside the 41-bit id time range")
        if now > self._ms:
            return self._take(now, 0)
        if now < self._ms:
            self.clock_steps_back += 1
        if self._sequence < MAX_SEQUENCE:
            return self._take(self._ms, self._sequence + 1)
        if self._ms + 1 - now > self._max_lead_ms:
            raise IdsExhausted(f"ids would run {self._ms + 1 - now} ms ahead of the clock "
                               f"(limit {self._max_lead_ms} ms)")
        self.borrowed_ms += 1
        return self._take(self._ms + 1, 0)

    def _take(self, ms: int, sequence: int) -> tuple[int, int]:
        self._ms, self._sequence = ms, sequence
        return ms, sequence

    def next_id(self) -> int:
        """A new time-first id (greater than every time-first id this generator made before)."""
        ms, sequence = self._next_pair()
        return compose(ms, self.zone, self.worker, sequence)

    def next_spread_id(self) -> int:
        """A new sequence-first id (unique, not ordered: consecutive ones are 2**53 apart)."""
        ms, sequence = self._next_pair()
        return compose_spread(ms, self.zone, self.worker, sequence)
