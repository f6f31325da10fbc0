"""What both ends of the replication channel are tuned by (built by the role from its config)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HASettings:
    """Replication channel settings; ``secret`` is ``[cluster] secret``."""

    secret: str = ""
    heartbeat_s: float = 1.0
    """An idle master sends an empty transfer this often; the slave acks it."""
    timeout_s: float = 5.0
    """A peer silent this long is dropped (the slave then reconnects)."""
    max_body: int = 1 << 20
    """Bytes of records in one transfer frame at most (one larger record goes alone)."""
    window: int = 8 << 20
    """Bytes sent to a slave and not yet acked at most."""
    max_time_not_caught_up_s: float = 15.0
    """``ha_max_time_slave_not_catchup``: a slave behind the master this long leaves the SyncStateSet."""
    check_interval_s: float = 0.5
    """How often timeouts, heartbeats and the SyncStateSet are checked."""
