"""``twistmq-admin``: argparse entry point; each subcommand lives in its own module.

``twistmq-admin [--server URL] [--token T] [--json] NOUN VERB ARGS`` runs the
admin API's operations (``cluster.admin.commands``); ``certs``, ``passwd`` and
``users`` (MQTT users in MongoDB or the password file) work without the API. Global options come before the command.

A subcommand module exposes ``register(subparsers)``, which adds its parser and
sets ``func=run`` with ``run(args) -> int``. To add one (e.g. ``status``), add
its module to ``SUBCOMMANDS``. A subcommand reports a user error by raising
``cluster.admin.errors.AdminError``: ``main`` prints it as one line on stderr and exits 2; usage
errors are one line and exit 2 too.
"""

from __future__ import annotations

import argparse
import sys

from cluster.admin import commands
from cluster.admin.errors import AdminError
from cluster.runtime.version import twistmq_version
from cluster.tools import certs, passwd

__all__ = ["AdminError", "SUBCOMMANDS", "build_parser", "main"]

PROG = "twistmq-admin"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line."""

    def error(self, message):  # noqa: D102 - argparse interface
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


SUBCOMMANDS = [certs, passwd, commands]
"""Modules with ``register(subparsers)``, in help order."""


def build_parser() -> argparse.ArgumentParser:
    """Build the parser with every subcommand registered."""
    parser = _Parser(prog=PROG, description="twistmq operator tools")
    parser.add_argument("--version", action="version", version=f"twistmq {twistmq_version()}",
                        help="print twistmq's version and exit")
    commands.add_global_options(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for module in SUBCOMMANDS:
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``twistmq-admin`` with *argv* (default ``sys.argv[1:]``); return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except AdminError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"{PROG}: error:{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
