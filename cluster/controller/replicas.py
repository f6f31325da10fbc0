"""Broker groups' replicas as the controllers keep them (RIP-44's ``SyncStateInfo``): pure, deterministic.

Per broker group: the brokers registered in it (each given a numeric broker id, kept across its
restarts), the master, the master epoch (one master per epoch: RIP-44's analogue of a Raft
term), the SyncStateSet (the replicas that keep up with the master, the master included) and
the set's epoch. Brokers are named by their ``cluster.json`` ids; the numeric ids are shown
beside them, never instead.

The rules (RIP-44 "AlterSyncStateSet" and "ElectMaster"):

- ``register_broker``: a new broker gets the next broker id; the first broker that may master
  (``can_master``) registering in a group without a master becomes its master, with a set of
  itself, both epochs moving on.
- ``alter_sync_state_set``: only the current master, at the current master epoch and set epoch,
  may change the set; the new set holds the master and only registered brokers; the set epoch
  moves on. Anything else is refused with a code (a stale or deposed master learns it at once).
- ``elect_master``: the new master comes from the SyncStateSet and must be alive (the caller, the
  Raft leader, passes who is alive: this module reads no clock); a named broker must be in the
  set; with no one, ``unclean`` allows any alive registered broker (messages may be lost). The
  master epoch moves on and the set becomes the new master alone (the others join again as they
  catch up).

Every change returns ``(code, info)``: ``code`` is ``"ok"`` or a refusal, ``info`` the group's
replica info after it (``info`` of ``None`` for an unknown group).
"""

from __future__ import annotations

OK = "ok"
UNKNOWN_GROUP = "unknown_group"
UNKNOWN_BROKER = "unknown_broker"
NOT_MASTER = "not_master"
STALE_MASTER_EPOCH = "stale_master_epoch"
STALE_SET_EPOCH = "stale_set_epoch"
BAD_SET = "bad_sync_state_set"
NO_CANDIDATE = "no_candidate"
NOT_IN_SET = "not_in_sync_state_set"
NOT_ALIVE = "not_alive"


def new_group() -> dict:
    return {"brokers": {}, "addresses": {}, "master": None, "master_epoch": 0, "sync_state_set": [],
            "set_epoch": 0, "next_broker_id": 1}


def info(group: str, state: dict | None) -> dict | None:
    """The replica info a broker, a proxy or an operator reads (GetReplicaInfo / GetSyncStateData)."""
    if state is None:
        return None
    brokers = state["brokers"]
    return {"group": group, "master": state["master"], "master_broker_id": brokers.get(state["master"]),
            "master_address": state["addresses"].get(state["master"], ""), "master_epoch": state["master_epoch"],
            "sync_state_set": list(state["sync_state_set"]),
            "sync_state_set_broker_ids": [brokers[b] for b in state["sync_state_set"]],
            "set_epoch": state["set_epoch"], "brokers": dict(brokers), "addresses": dict(state["addresses"])}


class Replicas:
    """group -> its replica state (plain dicts, so a Raft snapshot holds them as they are)."""

    def __init__(self, groups: dict | None = None) -> None:
        self.groups: dict[str, dict] = groups if groups is not None else {}

    def _answer(self, code: str, group: str):
        return code, info(group, self.groups.get(group))

    def register_broker(self, group: str, broker: str, address: str, can_master: bool):
        """A broker of ``group`` announces itself (``address``: where its replicas reach it)."""
        state = self.groups.setdefault(group, new_group())
        if broker not in state["brokers"]:
            state["brokers"][broker] = state["next_broker_id"]
            state["next_broker_id"] += 1
        if address:
            state["addresses"][broker] = address
        if state["master"] is None and can_master:
            self._make_master(state, broker)
        return self._answer(OK, group)

    def alter_sync_state_set(self, group: str, master: str, master_epoch: int, new_set: list, set_epoch: int):
        """The master proposes a new SyncStateSet; applied only if it is still the master at these epochs."""
        state = self.groups.get(group)
        if state is None:
            return self._answer(UNKNOWN_GROUP, group)
        if state["master"] != master:
            return self._answer(NOT_MASTER, group)
        if master_epoch != state["master_epoch"]:
            return self._answer(STALE_MASTER_EPOCH, group)
        if set_epoch != state["set_epoch"]:
            return self._answer(STALE_SET_EPOCH, group)
        members = list(dict.fromkeys(new_set))
        if master not in members or any(b not in state["brokers"] for b in members):
            return self._answer(BAD_SET, group)
        state["sync_state_set"] = sorted(members, key=lambda b: state["brokers"][b])
        state["set_epoch"] += 1
        return self._answer(OK, group)

    def elect_master(self, group: str, broker: str | None, alive: list, unclean: bool = False):
        """A new master for ``group``: ``broker`` if named, else the first alive in the set (lowest broker id)."""
        state = self.groups.get(group)
        if state is None:
            return self._answer(UNKNOWN_GROUP, group)
        alive_set = set(alive)
        if broker is not None:
            if broker not in state["brokers"]:
                return self._answer(UNKNOWN_BROKER, group)
            if broker not in state["sync_state_set"] and not unclean:
                return self._answer(NOT_IN_SET, group)
            if broker not in alive_set:
                return self._answer(NOT_ALIVE, group)
            chosen = broker
        else:
            in_set = [b for b in state["sync_state_set"] if b in alive_set and b != state["master"]]
            if not in_set and unclean:
                in_set = sorted((b for b in state["brokers"] if b in alive_set and b != state["master"]),
                                key=lambda b: state["brokers"][b])
            if not in_set:
                return self._answer(NO_CANDIDATE, group)
            chosen = in_set[0]
        self._make_master(state, chosen)
        return self._answer(OK, group)

    def _make_master(self, state: dict, broker: str) -> None:
        state["master"] = broker
        state["master_epoch"] += 1
        state["sync_state_set"] = [broker]
        state["set_epoch"] += 1

    def view(self) -> dict:
        return {group: info(group, state) for group, state in sorted(self.groups.items())}
