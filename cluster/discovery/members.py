"""The member record: what the cluster knows of one process (Turms' ``Member``), and its wire form.

A record is immutable; the lease table replaces it when a field changes. ``as_dict`` is what the
admin API lists and RPC carries; ``from_dict`` reads it back and names a bad field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

NODE_TYPES = ("broker", "proxy", "controller", "admin", "node")


class BadMember(ValueError):
    """A member record sent by a peer is malformed (the message names the field)."""


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """One member of the cluster (Turms' member record)."""

    cluster_id: str
    """The cluster it belongs to: a register with another cluster's id is refused."""
    node_id: str
    """Its member id, kept across restarts (``[cluster] node_id``)."""
    node_type: str
    """broker, proxy, controller, admin or node: which calls it answers."""
    zone: str = ""
    """Its zone (data centre, cloud region); the zone number of its snowflake ids."""
    version: str = ""
    """Its twistmq version, so a mixed-version cluster is visible."""
    seed: bool = False
    """A seed member stays listed (not joined) when its lease ends instead of being forgotten."""
    registration_date: float = 0.0
    """When it registered (seconds since the Unix epoch, the controller's clock)."""
    priority: int = 0
    """Preference among equals (higher first), as Turms' leader priority."""
    rpc_address: str = ""
    """How members dial it: a client endpoint string (``tcp:127.0.0.1:7800``); may differ from what it binds."""
    addresses: dict = dataclasses.field(default_factory=dict)
    """Its client-facing addresses by kind (``mqtt``, ``native``, ``http``), for operators and clients."""
    group: str = ""
    """The broker group a broker serves (empty for other roles)."""
    joined: bool = True
    """It holds a live lease: registered and heartbeating (set by the lease table, not by the member)."""
    healthy: bool = True
    """Its own health flag from its last heartbeat: calls without a fixed target avoid an unhealthy member."""
    active: bool = True
    """Serving clients; an operator may set it false to drain the member before an upgrade."""
    last_heartbeat: float = 0.0
    """When its last register or heartbeat arrived (seconds since the Unix epoch, the controller's clock)."""
    generation: int = 0
    """Its lease generation: a new one per registration; a heartbeat naming another one is refused."""
    boot: str = ""
    """Its process life (random, drawn at start; also in its RPC HELLO): a broker keeps the sessions a proxy
    restarted under the same id claims when its old life is evicted (a generation comes only with a register,
    which may follow the new life's claims)."""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values) -> "MemberRecord":
        """A record from its wire form; a missing, unknown or mistyped field is ``BadMember`` naming it."""
        if not isinstance(values, dict):
            raise BadMember("a member record is a map")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise BadMember(f"unknown member field {unknown[0]!r}")
        for name in ("cluster_id", "node_id", "node_type"):
            if not isinstance(values.get(name), str) or not values.get(name):
                raise BadMember(f"member field {name!r} must be a non-empty string")
        if values["node_type"] not in NODE_TYPES:
            raise BadMember(f"member field 'node_type' must be one of {', '.join(NODE_TYPES)}")
        for name, value in values.items():
            want = {"str": str, "bool": bool, "int": int, "float": (int, float), "dict": dict}[fields[name].type]
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise BadMember(f"member field {name!r} has the wrong type")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in values.get("addresses", {}).items()):
            raise BadMember("member field 'addresses' maps kinds to address strings")
        return cls(**values)


def broker_addresses(members) -> dict[str, str]:
    """Broker group -> the RPC address to dial for it, from the metadata's member records (as dicts).

    Per group, a joined broker with an address is preferred to one whose lease ended (a broker that
    moved registers anew, its old record lingers until evicted), then the newest registration (highest
    generation), then the node id; a group whose brokers have no address others can dial is left out (a
    broker bound to 0.0.0.0 without ``[cluster] advertise_rpc`` advertises an address only its own host
    reaches: the dialler keeps the one it has).
    """
    best: dict[str, tuple] = {}
    for record in members:
        if not isinstance(record, dict) or record.get("node_type") != "broker":
            continue
        group, address = record.get("group"), record.get("rpc_address")
        if not isinstance(group, str) or not group or not dialable(address):
            continue
        rank = (bool(record.get("joined")), record.get("generation", 0) if isinstance(record.get("generation"), int)
                else 0, str(record.get("node_id", "")), address)
        if group not in best or rank > best[group]:
            best[group] = rank
    return {group: rank[3] for group, rank in best.items()}


_UNSPECIFIED = ("", "0.0.0.0", "::", "[::]")


def dialable(address) -> bool:
    """Whether an advertised RPC address can be dialled from another host: ``unix:PATH``, or ``tcp:HOST:PORT``
    (``tcp6:``, ``ssl:``) whose host is not the unspecified address."""
    if not isinstance(address, str) or not address:
        return False
    kind, _, rest = address.partition(":")
    if kind == "unix":
        return bool(rest)
    if kind not in ("tcp", "tcp6", "ssl"):
        return False
    parts = rest.split(":")
    named = dict(p.split("=", 1) for p in parts if "=" in p)
    positional = [p for p in parts if "=" not in p]
    host = named.get("host", positional[0] if positional else "")
    return host not in _UNSPECIFIED
