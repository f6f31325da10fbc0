"""Who has been away for a lease: sans-IO bookkeeping of members (or broker groups) whose connections are gone.

A broker asks it which proxies have had no RPC connection to it for a lease (it then takes their
sessions over); a proxy asks it which broker groups it has not reached for a lease (it then closes the
sessions homed there). ``seen``/``gone`` record the connection's changes, ``lost(now)`` names each key
whose absence reached the lease, once per absence. It reads no clock: times (seconds) come in.
"""

from __future__ import annotations


class Absences:
    """``Absences(lease)``: keys away since a time, and which of them have been away for ``lease`` seconds."""

    def __init__(self, lease: float) -> None:
        if lease <= 0:
            raise ValueError(f"lease must be positive, not {lease!r}")
        self.lease = lease
        self._away: dict[str, float] = {}  # key -> when it went (absences not yet reported)
        self._reported: set[str] = set()  # away for a lease, reported: not again until seen

    def seen(self, key: str) -> None:
        """``key`` is connected (again): its absence, if any, ends."""
        self._away.pop(key, None)
        self._reported.discard(key)

    def gone(self, key: str, now: float) -> None:
        """``key`` has no connection since ``now`` (an absence already running keeps its start)."""
        if key not in self._reported:
            self._away.setdefault(key, now)

    def away(self, key: str) -> bool:
        return key in self._away

    def lost(self, now: float) -> list[str]:
        """Keys away for at least the lease at ``now``, in the order they went; each reported once per absence."""
        out = [key for key, since in self._away.items() if now - since >= self.lease]
        for key in out:
            del self._away[key]
            self._reported.add(key)
        return out
