"""The health flag a node publishes in its heartbeats (Turms' isHealthy): False when CPU or memory is overloaded.

Read from the kernel each heartbeat (``os.getloadavg`` per core, ``MemAvailable``
of ``/proc/meminfo``); where either is missing the flag only looks at the other.
A peer that reads False sends work elsewhere (``Peers.call_any``) but still
answers calls with a fixed target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class HealthLimits:
    """When a node calls itself unhealthy."""

    max_load_per_core: float = 4.0
    """1-minute load average divided by the number of cores above which the node is overloaded."""
    min_free_memory: float = 0.05
    """Fraction of memory that must stay available (MemAvailable / MemTotal)."""


def _free_memory(meminfo: str = "/proc/meminfo") -> float | None:
    try:
        with open(meminfo) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        total = int(fields["MemTotal"].split()[0])
        available = int(fields["MemAvailable"].split()[0])
    except (OSError, KeyError, ValueError):
        return None
    return available / total if total else None


def _load_per_core() -> float | None:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return None


class HealthProbe:
    """``probe()`` -> bool: the node's health flag now. ``load``/``memory`` can be replaced (tests)."""

    def __init__(self, limits: HealthLimits = HealthLimits(), load=_load_per_core, memory=_free_memory) -> None:
        self.limits = limits
        self._load = load
        self._memory = memory

    def __call__(self) -> bool:
        load, free = self._load(), self._memory()
        if load is not None and load > self.limits.max_load_per_core:
            return False
        return free is None or free >= self.limits.min_free_memory
