"""Which brokers of each group are alive, from their fast heartbeats (RIP-44's BrokerHeartbeat), pure.

The member lease (``cluster.discovery.leases``, 3 s by default) decides membership; whether a
broker master is dead enough to replace is decided here, faster: brokers heartbeat every
``broker_heartbeat_interval`` (500 ms) and one silent for ``broker_timeout`` (1.5 s) is dead.
The Raft leader keeps this table in memory (heartbeats are not replicated) and scans it every
``broker_scan_interval`` (500 ms, RocketMQ's ``scanNotActiveBroker``); a dead master triggers
ElectMaster.

A new leader has seen no heartbeats: ``grace(brokers, now)`` counts every broker it knows of as
heard at ``now + grace`` (one member lease), so none is declared dead before it could have
heartbeated to the new leader. A leader that was itself away (SIGSTOPped with a majority, starved)
is in the same place: its clock jumped past heartbeats it could not read, so when a scan comes
``PAUSED_SCANS`` intervals or more after the previous one, every broker not already dead gets the
same grace instead of being declared dead (the scan reports ``ScanPaused``).

No clock and no I/O: every call takes ``now``; ``scan`` returns who died since the last scan.
"""

from __future__ import annotations

from dataclasses import dataclass

PAUSED_SCANS = 2.0
"""A scan this many scan intervals (or more) after the previous one means the controller was away: with the
default timings (500 ms scans and heartbeats, 1.5 s timeout) a heartbeat sent just before a 1 s gap is 1.5 s
old at the late scan, though the broker may have sent more that still sit unread in the socket."""


@dataclass(frozen=True, slots=True)
class BrokerDied:
    """``broker`` of ``group`` sent no heartbeat for the timeout."""

    group: str
    broker: str


@dataclass(frozen=True, slots=True)
class ScanPaused:
    """The scan came ``gap`` seconds after the previous one (the controller was paused): every live broker got
    ``grace`` seconds and nobody was declared dead by this scan."""

    gap: float
    grace: float


class BrokerLiveness:
    """(group, broker) -> when it was last heard (or, in a grace, the end of the grace).

    ``scan_interval`` and ``pause_grace`` (seconds; None and 0: no pause detection) are the scan's period and
    the grace a pause gives, one member lease like a new leader's."""

    def __init__(self, timeout: float, scan_interval: float | None = None, pause_grace: float = 0.0) -> None:
        self.timeout = timeout
        self.scan_interval = scan_interval
        self.pause_grace = pause_grace
        self._last_scan: float | None = None
        self._heard: dict[tuple[str, str], float] = {}
        self._dead: set[tuple[str, str]] = set()
        self.offsets: dict[tuple[str, str], int] = {}
        """The max offset each broker last reported (for ElectMaster's choice and the admin's view)."""

    def grace(self, brokers, now: float, grace: float) -> None:
        """A new leader: each (group, broker) in ``brokers`` counts as heard ``grace`` seconds from now."""
        for key in brokers:
            self._heard[key] = max(self._heard.get(key, 0.0), now + grace - self.timeout)
            self._dead.discard(key)

    def heartbeat(self, group: str, broker: str, now: float, max_offset: int | None = None) -> bool:
        """A broker's heartbeat; True when it was dead (or unknown) and is alive again."""
        key = (group, broker)
        back = key in self._dead or key not in self._heard
        self._heard[key] = max(self._heard.get(key, 0.0), now)
        self._dead.discard(key)
        if max_offset is not None:
            self.offsets[key] = max_offset
        return back

    def alive(self, group: str, now: float) -> list[str]:
        """The brokers of ``group`` heard within the timeout, in name order."""
        return sorted(b for (g, b), at in self._heard.items()
                      if g == group and (g, b) not in self._dead and now - at < self.timeout)

    def scan(self, now: float) -> list[BrokerDied] | list[ScanPaused]:
        """Brokers silent for the timeout that were alive at the last scan (each reported once per death); or,
        when this scan comes ``PAUSED_SCANS`` intervals after the previous one, ``[ScanPaused]`` and a grace
        for every broker not already dead (what it did not hear meanwhile says nothing about them)."""
        last, self._last_scan = self._last_scan, now
        if last is not None and self.scan_interval and now - last >= PAUSED_SCANS * self.scan_interval:
            self.grace([key for key in self._heard if key not in self._dead], now, self.pause_grace)
            return [ScanPaused(now - last, self.pause_grace)]
        died = []
        for key, at in self._heard.items():
            if key not in self._dead and now - at >= self.timeout:
                self._dead.add(key)
                died.append(BrokerDied(*key))
        return sorted(died, key=lambda d: (d.group, d.broker))

    def forget(self, group: str, broker: str) -> None:
        key = (group, broker)
        self._heard.pop(key, None)
        self._dead.discard(key)
        self.offsets.pop(key, None)
