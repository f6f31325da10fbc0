"""The ``[mongodb]`` section, and what is checked at start when something uses MongoDB.

``uri`` holds credentials: it is never logged, and no message here repeats it
(a parse error names the key and, with any user:password part blanked out, the
reason). ``check_usable`` runs at start when a part of the config uses MongoDB
(``[auth] backends`` naming ``"mongodb"``, a bridge): without ``pymongo``
installed, or with a bad or missing ``uri``, it raises a ConfigError, which the
roles print as one line before exiting with code 2.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from store.config import ConfigError

__all__ = ["MongoConfig", "check_usable", "pymongo_installed"]

INSTALL_HINT = "pip install 'twistmq[mongodb]'"


@dataclass(frozen=True)
class MongoConfig:
    """The ``[mongodb]`` section: the MongoDB server (a replica set or Atlas in production) the process talks to."""

    uri: str = ""
    """Connection string, passed to pymongo's MongoClient as is (``mongodb://user:pass@host1,host2/?replicaSet=rs0``, ``mongodb+srv://...`` for Atlas). It holds credentials: never logged. Empty: no MongoDB; required once [auth] backends names "mongodb" or a bridge writes to MongoDB."""
    database: str = "twistmq"
    """Database holding the collections ([auth.mongodb] collection and acl_collection, the bridges' collections)."""
    timeout: float = 5.0
    """Seconds a MongoDB operation may wait for a server (server selection, connect and socket timeouts); past it the operation fails and counts as an outage."""

    def validate(self) -> None:
        if not self.database or any(ch in self.database for ch in '/\\. "$\x00') or len(self.database) > 63:
            raise ConfigError(f"database must be a MongoDB database name (1-63 characters, none of "
                              f"/\\. \"$), not {self.database!r}")
        if not self.timeout > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, not {self.timeout!r}")
        if self.uri and not self.uri.startswith(("mongodb://", "mongodb+srv://")):
            raise ConfigError("uri must start with mongodb:// or mongodb+srv:// (value not shown: it may hold "
                              "credentials)")

    @property
    def timeout_ms(self) -> int:
        """``timeout`` in the milliseconds pymongo's options take."""
        return max(1, int(self.timeout * 1000))


def pymongo_installed() -> bool:
    """Whether ``pymongo`` can be imported (it comes with the ``mongodb`` extra)."""
    return importlib.util.find_spec("pymongo") is not None


def _blank_credentials(message: str, uri: str) -> str:
    """*message* without the user:password part of *uri* (pymongo's parse errors may quote pieces of it)."""
    scheme, _, rest = uri.partition("://")
    userinfo, at, _ = rest.partition("@")
    if at and "/" not in userinfo:
        for secret in {userinfo, *userinfo.split(":")}:
            if secret:
                message = message.replace(secret, "***")
    return message


def check_usable(config: MongoConfig, used_by: str) -> None:
    """Raise a ConfigError (naming *used_by*) unless pymongo is installed and ``uri`` is set and well formed."""
    if not pymongo_installed():
        raise ConfigError(f"{used_by} uses MongoDB but pymongo is not installed ({INSTALL_HINT})")
    if not config.uri:
        raise ConfigError(f"mongodb.uri must be set: {used_by} uses MongoDB")
    if config.uri.startswith("mongodb+srv://"):
        return  # parsing it resolves DNS SRV records: the client does that, off the reactor
    from pymongo.errors import PyMongoError
    from pymongo.uri_parser import parse_uri

    try:
        parsed = parse_uri(config.uri)
    except (PyMongoError, ValueError) as exc:
        raise ConfigError(f"mongodb.uri is not a valid MongoDB URI: {_blank_credentials(str(exc), config.uri)}") \
            from None
    if not parsed.get("nodelist"):
        raise ConfigError("mongodb.uri names no host")
