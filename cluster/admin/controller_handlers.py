"""The admin routes a controller serves: the members it knows, the controllers and the leader.

A controller has no clients, sessions or store: its API is the ``cluster/*`` rows only (the
role builds its ``AdminAPI`` over ``CONTROLLER_OPERATIONS``). ``controller`` is the role's
``cluster.controller.service.Controller`` and ``raft`` its ``RaftNode``.
"""

from __future__ import annotations

CONTROLLER_OPERATIONS = ("list_members",)
"""The operationIds of openapi.json a controller answers."""


def member_row(record: dict) -> dict:
    """A member record as ``cluster/members`` lists it (the Member schema of openapi.json)."""
    return {"id": record["node_id"], "role": record["node_type"], "group": record.get("group") or None,
            "active": record["active"], "healthy": record["healthy"], "leader": False,
            "joined": record["joined"], "zone": record.get("zone", ""), "version": record.get("version", ""),
            "address": record.get("rpc_address", ""), "last_heartbeat": record.get("last_heartbeat", 0.0)}


class ControllerHandlers:
    """``cluster/members`` on a controller: every controller (``leader`` marks the Raft leader), then the members."""

    def __init__(self, controller, raft, version: str) -> None:
        self.controller = controller
        self.raft = raft
        self.version = version

    def list_members(self, params, query, body):
        leader = self.raft.leader
        rows = [{"id": address, "role": "controller", "group": None, "active": True, "healthy": True,
                 "leader": address == leader, "joined": address == self.raft.address or address in connected,
                 "zone": "", "version": self.version if address == self.raft.address else "", "address": address,
                 "last_heartbeat": 0.0}
                for connected in [self.raft.status().get("peers_connected", [])]
                for address in [self.raft.address, *self.raft.cfg.peers]]
        return rows + [member_row(r) for r in self.controller.members()]
