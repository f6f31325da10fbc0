"""The cluster metadata the controllers replicate: a deterministic state machine, pure.

Every controller applies the same commands in the same order (the Raft log), so every change is
a method here that reads only its arguments and the state: no clock, no randomness, no I/O. The
Raft adapter (``cluster.controller.raft``) calls them as pysyncobj replicated commands; the
snapshot is ``to_dict``/``from_dict`` (plain types, so a snapshot outlives code changes).

What it holds:

- ``members``: member records (``cluster.discovery.members.MemberRecord`` as dicts) by node id,
  as the leader's lease table last committed them (register, eviction, health flag);
- ``workers``: the snowflake worker id (0-255) leased to each member, kept across its restarts
  and freed when it is forgotten;
- ``slots`` (group -> hash-slot ranges) and ``routes`` (first topic level -> group): seeded once
  from the ``[cluster]`` config of the first leader; afterwards the controllers' copy wins;
- ``replicas``: per broker group its brokers (with numeric broker ids), master, master epoch,
  SyncStateSet and set epoch (``cluster.controller.replicas``);
- ``version``: bumped by every change, so members poll cheaply (``get-metadata`` only when it moved).

Fencing: a member's record carries its lease generation (the leader's Raft term in the high
bits), so a commit made by a deposed leader with an older generation than the stored one is
ignored instead of undoing the new leader's work.
"""

from __future__ import annotations

from cluster.controller.replicas import OK, Replicas
from cluster.discovery.ids import MAX_WORKER

SCHEMA = 2
"""Version of ``to_dict``'s layout (a snapshot records it). 2 added ``replicas``; a schema 1 snapshot reads as
one without replicas."""


class Metadata:
    """The replicated state; every public method that changes it is a Raft command."""

    def __init__(self) -> None:
        self.version = 0
        self.seeded = False
        self.members: dict[str, dict] = {}
        self.workers: dict[str, int] = {}
        self.slots: dict[str, list[list[int]]] = {}
        self.routes: dict[str, str] = {}
        self.replicas = Replicas()

    # -- commands -------------------------------------------------------------------------------------

    def seed(self, slots: dict, routes: dict) -> bool:
        """Take slots and routes from config, once: False (and no change) when already seeded."""
        if self.seeded:
            return False
        self.slots = {group: [list(r) for r in ranges] for group, ranges in slots.items()}
        self.routes = dict(routes)
        self.seeded = True
        self.version += 1
        return True

    def join(self, record: dict) -> int | None:
        """Store a newly registered member's record; its worker id (None when all 256 are leased)."""
        if not self._newer(record):
            return self.workers.get(record["node_id"])
        node_id = record["node_id"]
        self.members[node_id] = dict(record)
        if node_id not in self.workers:
            used = set(self.workers.values())
            free = next((w for w in range(MAX_WORKER + 1) if w not in used), None)
            if free is not None:
                self.workers[node_id] = free
        self.version += 1
        return self.workers.get(node_id)

    def update(self, record: dict) -> bool:
        """Replace a member's record (left, health flag, drain); ignored if its generation is older."""
        if record["node_id"] not in self.members or not self._newer(record):
            return False
        self.members[record["node_id"]] = dict(record)
        self.version += 1
        return True

    def forget(self, node_id: str, generation: int) -> bool:
        """Drop a member and free its worker id, unless it registered again since (a newer generation)."""
        member = self.members.get(node_id)
        if member is None or member["generation"] > generation:
            return False
        del self.members[node_id]
        self.workers.pop(node_id, None)
        self.version += 1
        return True

    def register_broker(self, group: str, broker: str, address: str, can_master: bool):
        """A broker of a group registers (``Replicas.register_broker``): ``(code, replica info)``."""
        return self._replicas_changed(self.replicas.register_broker(group, broker, address, can_master))

    def alter_sync_state_set(self, group: str, master: str, master_epoch: int, new_set: list, set_epoch: int):
        """The master's proposal for its SyncStateSet, checked against both epochs: ``(code, replica info)``."""
        return self._replicas_changed(self.replicas.alter_sync_state_set(group, master, master_epoch, new_set,
                                                                         set_epoch))

    def elect_master(self, group: str, broker: str | None, alive: list, unclean: bool):
        """A new master from the SyncStateSet (``alive``: what the leader saw heartbeat): ``(code, info)``."""
        return self._replicas_changed(self.replicas.elect_master(group, broker, alive, unclean))

    def _replicas_changed(self, answer):
        if answer[0] == OK:
            self.version += 1
        return answer

    def _newer(self, record: dict) -> bool:
        stored = self.members.get(record["node_id"])
        return stored is None or record["generation"] >= stored["generation"]

    # -- reading ----------------------------------------------------------------------------------------

    def groups(self) -> dict[str, list[str]]:
        """Broker group -> its brokers' node ids (every group with slots, even one without a broker yet)."""
        out: dict[str, list[str]] = {group: [] for group in self.slots}
        for node_id, member in sorted(self.members.items()):
            if member["node_type"] == "broker" and member.get("group"):
                out.setdefault(member["group"], []).append(node_id)
        return out

    def view(self) -> dict:
        """What ``get-metadata`` answers: everything, as plain data."""
        return {"version": self.version, "members": [self.members[k] for k in sorted(self.members)],
                "workers": dict(self.workers), "slots": self.slots, "routes": self.routes,
                "groups": self.groups(), "replicas": self.replicas.view()}

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": self.version, "seeded": self.seeded, "members": self.members,
                "workers": self.workers, "slots": self.slots, "routes": self.routes,
                "replicas": self.replicas.groups}

    @classmethod
    def from_dict(cls, data: dict) -> "Metadata":
        if data.get("schema") not in (1, SCHEMA):
            raise ValueError(f"metadata snapshot schema {data.get('schema')!r}, this code reads {SCHEMA}")
        out = cls()
        out.version, out.seeded = data["version"], data["seeded"]
        out.members, out.workers = dict(data["members"]), dict(data["workers"])
        out.slots, out.routes = dict(data["slots"]), dict(data["routes"])
        out.replicas = Replicas(dict(data.get("replicas", {})))
        return out
