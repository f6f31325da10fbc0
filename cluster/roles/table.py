"""The roles table: which service tree each ``twistd twistmq ROLE`` runs.

One row per role: its subcommand, its options, and the function that builds
its ``MultiService`` (a ``cluster.runtime.services.RoleService``) from those options
and the reactor. ``cluster.tap`` turns the rows into subcommands; adding a
role (``proxy``, ``broker``, ...) is a row here plus its composition module,
as ``node`` is a row plus ``cluster.roles.node``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from twisted.application import service
from twisted.python import usage

from cluster.roles import admin, broker, controller, node, proxy


@dataclass(frozen=True)
class Role:
    """One row of the roles table."""

    name: str
    """The subcommand: ``twistd twistmq NAME``."""
    summary: str
    """One line for ``twistd twistmq --help``."""
    options: type[usage.Options]
    """Its command line."""
    build: Callable[[usage.Options, object], service.IService]
    """``build(options, reactor)``: the role's service tree; bad configuration raises a ``start_errors``."""
    start_errors: tuple[type[BaseException], ...]
    """What a bad configuration raises while the role is built: one line on stderr and exit code 2."""


ROLES: tuple[Role, ...] = (
    Role("node", "every role in one process (the embedded default)", node.NodeOptions, node.build_node,
         node.START_ERRORS),
    Role("broker", "one broker group's store, served to proxies over RPC", broker.BrokerOptions,
         broker.build_broker, broker.START_ERRORS),
    Role("proxy", "MQTT and native listeners and sessions over the brokers' stores (no durable state)",
         proxy.ProxyOptions, proxy.build_proxy, proxy.START_ERRORS),
    Role("controller", "cluster metadata in Raft (3 or 5 of them), member leases, members' register and heartbeat",
         controller.ControllerOptions, controller.build_controller, controller.START_ERRORS),
    Role("admin", "the admin API and dashboard for the whole cluster, gathered from the controllers and proxies",
         admin.AdminOptions, admin.build_admin, admin.START_ERRORS),
)


def role(name: str) -> Role:
    """The row named *name*; a name not in the table is a usage error listing the known ones."""
    for row in ROLES:
        if row.name == name:
            return row
    raise usage.UsageError(f"unknown role {name!r} (known: {', '.join(r.name for r in ROLES)})")
