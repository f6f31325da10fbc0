"""``twistmq-admin passwd FILE USER``: add a user, change its password, or ``--delete`` it.

The password comes from ``--password P`` (visible to other local users in the
process list: for scripts on single-user machines), else from a prompt asked
twice on a terminal, else from the first line of standard input. The file is
created if missing and always rewritten atomically with mode 0600. The
password is never printed.
"""

from __future__ import annotations

import getpass
import os
import sys

from cluster.admin.errors import AdminError
from mqtt_proxy.auth.passwords import PasswordFile, PasswordFileError, validate_username

__all__ = ["read_password", "register", "run"]


def register(subparsers) -> None:
    """Add ``passwd`` to the ``twistmq-admin`` subcommands."""
    parser = subparsers.add_parser(
        "passwd", help="add, change or delete a user in a password file",
        description="Add USER to the password file FILE (or change its password); with --delete, remove it.")
    parser.add_argument("file", metavar="FILE", help="password file (created if missing)")
    parser.add_argument("user", metavar="USER", help="username")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--password", metavar="P", help="the password (default: prompt, or read stdin)")
    group.add_argument("--delete", action="store_true", help="remove USER from FILE")
    parser.set_defaults(func=run)


def read_password(stdin=None) -> str:
    """Prompt twice on a terminal, else read one line from *stdin*; refuse an empty password."""
    stdin = stdin or sys.stdin
    if stdin.isatty():
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Password (again): "):
            raise AdminError("the passwords do not match")
    else:
        first = stdin.readline().rstrip("\r\n")
    if not first:
        raise AdminError("empty password")
    return first


def run(args) -> int:
    """Apply the change to the password file."""
    try:
        validate_username(args.user)
        table = PasswordFile.load(args.file) if os.path.exists(args.file) else PasswordFile(path=args.file)
    except PasswordFileError as exc:
        raise AdminError(str(exc)) from None
    if args.delete:
        if args.user not in table:
            raise AdminError(f"no user {args.user!r} in {args.file}")
        table.delete(args.user)
        table.save(args.file)
        print(f"deleted {args.user!r} from {args.file}")
        return 0
    password = args.password if args.password is not None else read_password()
    if not password:
        raise AdminError("empty password")
    existed = args.user in table
    table.add(args.user, password)
    table.save(args.file)
    print(f"{'updated' if existed else 'added'} {args.user!r} in {args.file}")
    return 0
