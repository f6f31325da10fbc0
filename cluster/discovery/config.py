"""The ``[discovery]`` section: member heartbeats, leases and the wheel that evicts them."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.discovery.leases import LeaseTimings
from store.config import ConfigError


@dataclass(frozen=True)
class DiscoveryConfig:
    """The ``[discovery]`` section: how members keep their place in the cluster (the controllers' Raft leader keeps the leases and tells members the heartbeat interval)."""

    heartbeat_interval: float = 1.0
    """Seconds between a member's heartbeats, sent to every controller at once (the leader renews the lease)."""
    lease: float = 3.0
    """Seconds a member's lease lasts without a heartbeat; then it is evicted (listed with joined false, sent no notify events). A new controller leader gives every member one lease before evicting any. Also how long a broker waits for a proxy whose RPC connection is gone before its group takes over the proxy's sessions (wills, expiry), and how long a proxy waits for a broker group it cannot reach before it closes the sessions with a part there."""
    wheel_tick: float = 0.1
    """Seconds per tick of the hashed wheel that runs the evict checks: an eviction is at most one tick late."""
    wheel_slots: int = 512
    """Buckets of the hashed wheel (one per tick; deadlines further out wait for their round)."""
    forget_after: float = 60.0
    """Seconds an evicted member stays listed (joined false) before it is forgotten; seed members stay."""

    def validate(self) -> None:
        for key in ("heartbeat_interval", "lease", "wheel_tick", "forget_after"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, not {getattr(self, key)!r}")
        if self.lease <= self.heartbeat_interval:
            raise ConfigError(f"lease ({self.lease}) must be longer than heartbeat_interval "
                              f"({self.heartbeat_interval}): one late heartbeat must not evict a member")
        if self.wheel_tick > self.lease:
            raise ConfigError(f"wheel_tick ({self.wheel_tick}) must not be longer than lease ({self.lease})")
        if self.wheel_slots < 1:
            raise ConfigError(f"wheel_slots must be at least 1, not {self.wheel_slots!r}")

    def timings(self) -> LeaseTimings:
        return LeaseTimings(self.lease, self.wheel_tick, self.forget_after, self.wheel_slots)
