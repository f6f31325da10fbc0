"""The admin routes a controller serves: the members it knows, the controllers and the leader, elect-leader.

A controller has no clients, sessions or store: its API is the rows of openapi.json whose
``x-roles`` names ``controller`` (``served_by``). ``controller`` is the role's
``cluster.controller.service.Controller`` and ``raft`` its ``RaftNode`` (passed in: admin imports
neither).
"""

from __future__ import annotations

from twisted.internet import defer, task

from cluster.admin.api import ApiError

ELECT_MASTER_STATUS = {"unknown_group": 404, "unknown_broker": 404, "not_in_sync_state_set": 409,
                       "not_alive": 409, "no_candidate": 409}
"""ElectMaster's refusals as HTTP statuses (the code goes along as the error's code)."""

ELECT_WAIT = 3.0
"""Seconds elect-leader waits to see the new leader before it answers with ``leader: null``."""


def member_row(record: dict) -> dict:
    """A member record as ``cluster/members`` lists it (the Member schema of openapi.json)."""
    return {"id": record["node_id"], "role": record["node_type"], "group": record.get("group") or None,
            "active": record["active"], "healthy": record["healthy"], "leader": False,
            "joined": record["joined"], "zone": record.get("zone", ""), "version": record.get("version", ""),
            "address": record.get("rpc_address", ""), "last_heartbeat": record.get("last_heartbeat", 0.0)}


class ControllerHandlers:
    """``cluster/members``, ``cluster/elect-leader``, ``cluster/controllers/metadata`` and the broker groups'
    ``sync-state-set`` and ``elect-master`` on a controller."""

    def __init__(self, controller, raft, version: str, clock, node_id: str = "", health=lambda: True) -> None:
        self.controller = controller
        self.raft = raft
        self.version = version
        self.clock = clock
        self.health = health  # this controller's health flag (the one its RPC heartbeats carry)
        # Raft address -> member id: its own (--node-id) and the peers named ID=HOST:PORT; others by address
        self.ids = {**raft.cfg.peer_ids(), **({raft.address: node_id} if node_id else {})}

    def _id(self, address: str | None) -> str | None:
        return None if address is None else self.ids.get(address, address)

    def _controllers(self) -> list[dict]:
        leader = self.raft.leader
        connected = self.raft.status().get("peers_connected", [])
        me = self.raft.address
        return [{"id": self._id(address), "role": "controller", "group": None, "active": True,
                 "healthy": bool(self.health()) if address == me else True,
                 "leader": address == leader, "joined": address == me or address in connected,
                 "zone": "", "version": self.version if address == me else "", "address": address,
                 "last_heartbeat": 0.0}
                for address in [me, *self.raft.cfg.peer_addresses()]]

    def list_members(self, params, query, body):
        return self._controllers() + [member_row(r) for r in self.controller.members()]

    def get_controller_metadata(self, params, query, body):
        view = self.raft.read(lambda m: m.view())
        return {"controllers": self._controllers(), "raft": self.raft.status(), **view}

    @defer.inlineCallbacks
    def elect_leader(self, params, query, body):
        target = (body or {}).get("id")
        if target is not None and not isinstance(target, str):
            raise ApiError(400, "bad_request", "id must be a controller's id or Raft address (a string) or null")
        previous = self.raft.address
        if not self.raft.is_leader:
            leader = self._id(self.raft.leader) or "the leader once one is elected"
            raise ApiError(409, "not_leader", f"this controller is not the Raft leader; ask {leader}")
        peers = self.raft.cfg.peer_addresses()
        if target is not None:
            target = next((a for a in peers if self._id(a) == target), target)  # an id names its address
        if target is not None and target not in peers:
            named = ", ".join(self._id(a) for a in peers)
            raise ApiError(404, "not_found", f"no other controller {target!r} (the others: {named})")
        try:
            yield self.raft.transfer_leadership(target)
        except Exception as exc:  # noqa: BLE001 - pysyncobj's refusals: the target lags, or no peer is connected
            reason = getattr(exc, "reason", str(exc))
            raise ApiError(409, "conflict", f"leadership not transferred ({reason}): the target has not caught up "
                           "with the leader's log or is not connected; try again") from None
        deadline = self.clock.seconds() + ELECT_WAIT
        while self.clock.seconds() < deadline:
            leader = self.raft.leader
            if leader is not None and leader != previous:
                return {"previous": self._id(previous), "leader": self._id(leader)}
            yield task.deferLater(self.clock, 0.02, lambda: None)
        return {"previous": self._id(previous), "leader": None}

    def get_sync_state_set(self, params, query, body):
        info = self.controller.replica_info(params["group"])
        if info is None:
            raise ApiError(404, "not_found", f"no broker of group {params['group']!r} has registered")
        return info

    @defer.inlineCallbacks
    def elect_master(self, params, query, body):
        broker = (body or {}).get("broker")
        if broker is not None and not isinstance(broker, str):
            raise ApiError(400, "bad_request", "broker must be a broker's id in cluster.json (a string) or null")
        if not self.raft.is_leader:
            leader = self.raft.leader or "the leader once one is elected"
            raise ApiError(409, "not_leader", f"this controller is not the Raft leader; ask {leader}")
        try:
            code, info = yield self.controller.elect_master(params["group"], broker)
        except Exception as exc:  # noqa: BLE001 - not committed: leadership lost meanwhile, no quorum
            raise ApiError(503, "unavailable", f"election not committed: {exc}") from None
        if code != "ok":
            raise ApiError(ELECT_MASTER_STATUS.get(code, 409), code, f"no master elected in {params['group']!r}: "
                           f"{code.replace('_', ' ')} (the group now: master {info and info['master']!r}, "
                           f"sync state set {info and info['sync_state_set']})")
        return info
