"""The ``[controller]`` section: a controller's Raft address, its peers and pysyncobj's timings."""

from __future__ import annotations

from dataclasses import dataclass

from store.config import ConfigError


def _host_port(key: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key} must be HOST:PORT (like 127.0.0.1:7900), not {value!r}")


@dataclass(frozen=True)
class ControllerConfig:
    """The ``[controller]`` section: a ``twistmq controller`` process (3 or 5 of them hold the cluster metadata in Raft)."""

    raft: str = "127.0.0.1:7900"
    """This controller's Raft address, HOST:PORT: it binds it and its peers dial it (``--raft``). pysyncobj unpickles what reaches it: keep it on loopback or a private network."""
    raft_bind: str = ""
    """HOST:PORT this controller binds for Raft when its peers dial another address for it (a relay, NAT: then raft is that address, as its peers list it); empty: it binds raft itself."""
    peers: tuple[str, ...] = ()
    """The other controllers' Raft addresses (``--peer``, repeatable), each HOST:PORT or ID=HOST:PORT to name the controller by its member id (its --node-id) in cluster/members and elect-leader; empty: a single controller, its own majority."""
    rpc: tuple[str, ...] = ("tcp:7910:interface=127.0.0.1",)
    """RPC listeners members register, heartbeat and read metadata on (``--rpc``)."""
    tick: float = 0.05
    """Seconds pysyncobj's thread waits for socket events per tick (autoTickPeriod): commits and elections are seen at most this late. Smaller costs idle CPU."""
    append_period: float = 0.1
    """Seconds between the Raft leader's append-entries (its heartbeat to the other controllers). Must be well under election_min."""
    election_min: float = 0.4
    """Shortest Raft election timeout (seconds): a follower that hears no leader for a random time between election_min and election_max starts an election."""
    election_max: float = 0.8
    """Longest Raft election timeout (seconds); a killed leader is replaced within about this plus one election round."""
    connection_retry: float = 0.5
    """Seconds between attempts to dial a controller that is down (a restarted one rejoins this fast)."""
    leader_fallback: float = 5.0
    """Seconds a leader that hears from no majority keeps leading before it steps down."""
    compaction_entries: int = 5000
    """Raft log entries after which the metadata is snapshotted to the data dir and the journal cut."""
    compaction_seconds: float = 300.0
    """Seconds after which the metadata is snapshotted even with fewer entries."""
    broker_heartbeat_interval: float = 0.5
    """Seconds between a broker's heartbeats, sent to every controller at once so a new leader hears each broker within one interval (told to brokers when they register): faster than the member heartbeat, since a dead master is replaced on it."""
    broker_timeout: float = 1.5
    """Seconds without a broker heartbeat after which the leader counts the broker dead; a dead master's group gets a new master from its SyncStateSet. A new leader first gives every broker one member lease."""
    broker_scan_interval: float = 0.5
    """Seconds between the leader's scans for brokers whose heartbeats stopped (RocketMQ's scanNotActiveBroker)."""
    unclean_master_election: bool = False
    """Allow electing a broker group's master from outside its SyncStateSet when no member of the set is alive (RIP-44's enableUncleanMasterElect): the group serves again, but messages the old master acknowledged may be lost."""

    def peer_addresses(self) -> tuple[str, ...]:
        """The peers' Raft addresses (an ``ID=`` prefix left out)."""
        return tuple(peer.rpartition("=")[2] for peer in self.peers)

    def peer_ids(self) -> dict[str, str]:
        """Raft address -> member id of the peers named ``ID=HOST:PORT``."""
        return {address: name for name, sep, address in (p.rpartition("=") for p in self.peers) if sep}

    def validate(self) -> None:
        _host_port("raft", self.raft)
        if self.raft_bind:
            _host_port("raft_bind", self.raft_bind)
        for peer in self.peers:
            name, sep, address = peer.rpartition("=")
            if sep and not name:
                raise ConfigError(f"peers: {peer!r} names no controller before '=' (ID=HOST:PORT, like c2=127.0.0.1:7901)")
            _host_port("peers", address)
        addresses = self.peer_addresses()
        if self.raft in addresses:
            raise ConfigError(f"peers lists this controller's own raft address {self.raft!r}")
        if len(set(addresses)) != len(addresses):
            raise ConfigError("peers lists an address twice")
        names = list(self.peer_ids().values())
        if len(set(names)) != len(names):
            raise ConfigError("peers names two controllers alike")
        for key in ("tick", "append_period", "election_min", "election_max", "connection_retry", "leader_fallback",
                    "compaction_seconds", "broker_heartbeat_interval", "broker_timeout", "broker_scan_interval"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{key} must be positive, not {getattr(self, key)!r}")
        if self.election_max < self.election_min:
            raise ConfigError(f"election_max ({self.election_max}) must not be below election_min "
                              f"({self.election_min})")
        if self.append_period * 2 > self.election_min:
            raise ConfigError(f"append_period ({self.append_period}) must be at most half of election_min "
                              f"({self.election_min}): followers would start elections against a live leader")
        if self.broker_timeout <= self.broker_heartbeat_interval:
            raise ConfigError(f"broker_timeout ({self.broker_timeout}) must be longer than broker_heartbeat_interval "
                              f"({self.broker_heartbeat_interval}): one late heartbeat must not replace a master")
        if self.compaction_entries < 10:
            raise ConfigError(f"compaction_entries must be at least 10, not {self.compaction_entries!r}")
