"""``twistmq-admin passwd FILE USER`` and ``twistmq-admin users add|passwd|delete|list``: MQTT users.

``passwd`` adds a user to a password file, changes its password, or ``--delete``\s it.
``users VERB [USER] --backend mongodb|file --config FILE`` does the same where the
node's config keeps users: MongoDB's ``[auth.mongodb] collection`` on the server of
``[mongodb] uri`` (documents ``{username, password_hash, is_superuser}``, hashed
here with scrypt as the password file's), or ``[mqtt] password_file``.

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

__all__ = ["read_password", "register", "register_users", "run", "run_users"]


def register(subparsers) -> None:
    """Add ``passwd`` and ``users`` to the ``twistmq-admin`` subcommands."""
    parser = subparsers.add_parser(
        "passwd", help="add, change or delete a user in a password file",
        description="Add USER to the password file FILE (or change its password); with --delete, remove it.")
    parser.add_argument("file", metavar="FILE", help="password file (created if missing)")
    parser.add_argument("user", metavar="USER", help="username")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--password", metavar="P", help="the password (default: prompt, or read stdin)")
    group.add_argument("--delete", action="store_true", help="remove USER from FILE")
    parser.set_defaults(func=run)
    register_users(subparsers)


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


# -- twistmq-admin users: the same, in the [auth] backends' stores ---------------------------------------------

USER_VERBS = ("add", "passwd", "delete", "list")


def register_users(subparsers) -> None:
    """Add ``users add|passwd|delete|list`` to the ``twistmq-admin`` subcommands."""
    parser = subparsers.add_parser(
        "users", help="add, change, delete or list MQTT users in MongoDB or the password file",
        description="Manage the users [auth] backends check: documents {username, password_hash, is_superuser} "
                    "in [auth.mongodb] collection (--backend mongodb, the server from [mongodb] uri), or lines "
                    "of [mqtt] password_file (--backend file). The hash is written here: nobody hand-writes one.")
    parser.add_argument("verb", choices=USER_VERBS, metavar="VERB", help="add, passwd, delete or list")
    parser.add_argument("user", metavar="USER", nargs="?", help="username (not for list)")
    parser.add_argument("--backend", choices=("mongodb", "file"), default="file", help="where users are kept")
    parser.add_argument("--config", metavar="FILE", required=True, help="the node's TOML config file")
    parser.add_argument("--password", metavar="P", help="the password (default: prompt, or read stdin)")
    parser.add_argument("--superuser", action="store_true", help="add: the user bypasses every ACL rule")
    parser.set_defaults(func=run_users)


def _read_config(path: str) -> dict:
    import tomllib

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise AdminError(f"config file {path} is not valid TOML: {exc}") from None


def run_users(args) -> int:
    """Apply ``users VERB USER`` to the store the backend names."""
    if args.verb != "list":
        if not args.user:
            raise AdminError(f"users {args.verb} needs a USER")
        try:
            validate_username(args.user)
        except PasswordFileError as exc:
            raise AdminError(str(exc)) from None
    elif args.user:
        raise AdminError("users list takes no USER")
    raw = _read_config(args.config)
    if args.backend == "file":
        return _file_users(args, raw)
    return _mongodb_users(args, raw)


def _file_users(args, raw: dict) -> int:
    path = (raw.get("mqtt") or {}).get("password_file", "")
    if not path:
        raise AdminError(f"{args.config} sets no [mqtt] password_file")
    path = os.path.join(os.path.dirname(os.path.abspath(args.config)), path)
    try:
        table = PasswordFile.load(path) if os.path.exists(path) else PasswordFile(path=path)
    except PasswordFileError as exc:
        raise AdminError(str(exc)) from None
    if args.verb == "list":
        for name in table.users():
            print(name)
        return 0
    if args.superuser:
        raise AdminError("--superuser needs --backend mongodb (the password file has no superusers)")
    if args.verb == "delete":
        if args.user not in table:
            raise AdminError(f"no user {args.user!r} in {path}")
        table.delete(args.user)
        table.save(path)
        print(f"deleted {args.user!r} from {path}")
        return 0
    _check_presence(args.verb, args.user in table, args.user, path)
    table.add(args.user, _password(args))
    table.save(path)
    print(f"{'added' if args.verb == 'add' else 'updated'} {args.user!r} in {path}")
    return 0


def _check_presence(verb: str, present: bool, user: str, where: str) -> None:
    if verb == "add" and present:
        raise AdminError(f"user {user!r} already exists in {where} (change its password with users passwd)")
    if verb == "passwd" and not present:
        raise AdminError(f"no user {user!r} in {where} (add it with users add)")


def _password(args) -> str:
    password = args.password if args.password is not None else read_password()
    if not password:
        raise AdminError("empty password")
    return password


def _mongodb_users(args, raw: dict) -> int:
    from cluster.mongodb.config import MongoConfig, check_usable
    from mqtt_proxy.auth.config import MongoAuthConfig
    from mqtt_proxy.auth.passwords import hash_password
    from store.config import ConfigError, from_mapping

    try:
        mongo = from_mapping(MongoConfig, "mongodb", raw.get("mongodb") or {})
        section = from_mapping(MongoAuthConfig, "auth.mongodb", (raw.get("auth") or {}).get("mongodb") or {})
        check_usable(mongo, "users --backend mongodb")
    except ConfigError as exc:
        raise AdminError(str(exc)) from None
    from pymongo import ASCENDING, MongoClient
    from pymongo.errors import DuplicateKeyError, PyMongoError

    ms = mongo.timeout_ms
    client = MongoClient(mongo.uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms,
                         appname="twistmq-admin")
    where = f"{mongo.database}.{section.collection}"  # never the URI: it holds credentials
    try:
        users = client[mongo.database][section.collection]
        if args.verb == "list":
            for doc in users.find({}, {"username": 1, "is_superuser": 1}).sort("username", ASCENDING):
                print(f"{doc.get('username')}{'  superuser' if doc.get('is_superuser') else ''}")
            return 0
        if args.verb == "delete":
            if users.delete_one({"username": args.user}).deleted_count == 0:
                raise AdminError(f"no user {args.user!r} in {where}")
            print(f"deleted {args.user!r} from {where}")
            return 0
        _check_presence(args.verb, users.count_documents({"username": args.user}, limit=1) > 0, args.user, where)
        encoded = hash_password(_password(args))
        if args.verb == "add":
            users.create_index([("username", ASCENDING)], unique=True)
            try:
                users.insert_one({"username": args.user, "password_hash": encoded,
                                  "is_superuser": bool(args.superuser)})
            except DuplicateKeyError:
                raise AdminError(f"user {args.user!r} already exists in {where}") from None
            print(f"added {args.user!r} in {where}")
        else:
            change = {"password_hash": encoded, **({"is_superuser": True} if args.superuser else {})}
            users.update_one({"username": args.user}, {"$set": change})
            print(f"updated {args.user!r} in {where}")
        return 0
    except PyMongoError as exc:
        raise AdminError(f"MongoDB ({where}): {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    finally:
        client.close()
