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
    all_ack: bool = True
    """``all_ack_in_sync_state_set``: acknowledge once every SyncStateSet member holds a record, else once
    ``min_in_sync_replicas`` copies do."""
    min_in_sync_replicas: int = 1
    """Copies a record needs before it is acknowledged, and the smallest set a master acknowledges with."""
    ack_timeout_s: float = 5.0
    """``call_timeout``: an acknowledgement held this long is answered as by an unreachable group."""
