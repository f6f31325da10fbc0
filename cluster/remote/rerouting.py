"""A proxy's routes kept up with the controllers' metadata: each group's broker address, slots, routes.

``Rerouter.apply(metadata)`` is a ``MemberAgent.on_metadata`` listener (pushed, and polled through the
heartbeat's version). From the metadata it takes the slot table and explicit routes
(``SlotTable.from_metadata``) and each group's broker address (``master_addresses``: the advertised RPC
address of the master the controllers name in ``replicas``, else ``broker_addresses``); a group whose
broker moved or whose master changed is dialled at its new address (the same
``RemoteStore``, so its watches and filter interest are taken again there as after any reconnect),
a group new to this proxy gets a store of its own, and the routed store routes by the new table.
A metadata version that names a group no broker address is known for is not applied (logged): the
proxy keeps routing by what it had. Without controllers nothing calls it: the static config stays.
"""

from __future__ import annotations

import logging
from typing import Callable

from cluster.discovery.members import broker_addresses, dialable
from cluster.remote.routed_store import RoutedStore
from cluster.routing import RoutingError, SlotTable
from store import api

log = logging.getLogger("twistmq.cluster.remote.rerouting")


def master_addresses(metadata: dict) -> dict[str, str]:
    """Broker group -> the RPC address to dial for it: its master's (``replicas[group]["master"]``, RIP-44), else
    what ``broker_addresses`` picks among its brokers (a group without replication, or no master yet)."""
    members = metadata.get("members") or ()
    out = broker_addresses(members)
    records = {r.get("node_id"): r for r in members if isinstance(r, dict) and r.get("node_type") == "broker"}
    for group, info in (metadata.get("replicas") or {}).items():
        master = info.get("master") if isinstance(info, dict) else None
        record = records.get(master)
        if record is not None and record.get("group") == group and dialable(record.get("rpc_address")):
            out[group] = record["rpc_address"]
    return out


class Rerouter:
    """``Rerouter(routed, addresses, connect, move)``.

    ``addresses``: group -> the address its store dials now (from the config); ``connect(group, address)``
    makes and starts a store for a group new to this proxy; ``move(store, address)`` points a group's
    store at a new address.
    """

    def __init__(self, routed: RoutedStore, addresses: dict[str, str], connect: Callable[[str, str], api.Store],
                 move: Callable[[api.Store, str], object]) -> None:
        self.routed = routed
        self.addresses = dict(addresses)
        self.connect = connect
        self.move = move
        self.version = -1
        """The metadata version last applied."""
        self.moves = 0
        """Groups re-dialled at a new address (for metrics and tests)."""

    def apply(self, metadata: dict) -> bool:
        """Route by ``metadata`` (the controllers' ``controller.metadata`` answer); False when it was not applied."""
        version = metadata.get("version", -1)
        try:
            table = SlotTable.from_metadata(metadata)
        except RoutingError as exc:
            log.warning("routes_not_applied version=%s reason=%s", version, exc)
            return False
        wanted = master_addresses(metadata)
        unknown = [g for g in table.groups if g not in self.routed.groups and g not in wanted]
        if unknown:
            log.warning("routes_not_applied version=%s reason=no broker address for groups %s", version,
                        ",".join(unknown))
            return False
        groups = dict(self.routed.groups)
        for group in table.groups:
            address = wanted.get(group)
            if address is None or address == self.addresses.get(group):
                continue
            try:
                if group in groups:
                    self.move(groups[group], address)
                    self.moves += 1
                    log.info("group_moved group=%s from=%s to=%s version=%s", group, self.addresses.get(group),
                             address, version)
                else:
                    groups[group] = self.connect(group, address)
                    log.info("group_added group=%s address=%s version=%s", group, address, version)
            except ValueError as exc:  # an address that is not a client endpoint: keep the old one
                log.warning("group_address_refused group=%s address=%r reason=%s", group, address, exc)
                if group not in groups:
                    return False
                continue
            self.addresses[group] = address
        if table != self.routed.table:
            log.info("routes_updated version=%s groups=%s routes=%d", version, ",".join(table.groups),
                     len(table.routes))
        self.routed.reroute(table, groups)
        self.version = version
        return True
