"""``twistd twistmq ROLE [options]``: the plugin's Options and makeService (see ``twisted/plugins/``).

Each role of ``cluster.roles.table.ROLES`` is a subcommand. This is the one place that
takes the global reactor and hands it to the role it builds. A bad configuration
found while building is one line on stderr and exit code 2, no traceback.
"""

from __future__ import annotations

import sys

from twisted.python import usage

from cluster.roles.table import ROLES, role
from cluster.runtime.version import print_version


class Options(usage.Options):
    """``twistd twistmq <role>``."""

    subCommands = [[row.name, None, row.options, row.summary] for row in ROLES]

    def opt_version(self):
        """print twistmq's version and exit"""
        print_version()

    def postOptions(self) -> None:
        if self.subCommand is None:
            raise usage.UsageError("name a role: " + ", ".join(row.name for row in ROLES))


def makeService(options: Options, reactor=None):  # noqa: N802 - twistd's interface
    """Build the role named on the command line; a bad config or a locked data dir exits with one line."""
    if reactor is None:
        from twisted.internet import (
            reactor,  # the composition root is where the global reactor is used
        )
    row = role(options.subCommand)
    try:
        return row.build(options.subOptions, reactor)
    except row.start_errors as exc:
        print(f"twistmq: {exc}", file=sys.__stderr__, flush=True)
        raise SystemExit(2)
