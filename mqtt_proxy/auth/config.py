"""The ``[auth]`` and ``[auth.mongodb]`` sections: which sources authenticate clients and hold ACL rules."""

from __future__ import annotations

from dataclasses import dataclass

from store.config import ConfigError

__all__ = ["AuthConfig", "BACKENDS", "MongoAuthConfig", "NOMATCH"]

BACKENDS = ("file", "mongodb")
NOMATCH = ("allow", "deny")


@dataclass(frozen=True)
class AuthConfig:
    """The ``[auth]`` section: the chain of user and ACL sources."""

    backends: tuple[str, ...] = ("file",)
    """Sources of users and ACL rules, in the order a CONNECT asks them: "file" (the [mqtt] password_file and acl_file) and "mongodb" (the [auth.mongodb] collections). The first source that knows a username checks its password. Any source besides the file counts as authentication: allow_anonymous then defaults to false."""
    acl_nomatch: str = ""
    """What a publish or subscribe no ACL rule of any source matches gets: "allow" or "deny". Empty: deny when an ACL source is configured (an acl_file, or "mongodb" in backends), else allow. A deny from any source wins over an allow from any other."""

    def validate(self) -> None:
        if not self.backends:
            raise ConfigError('backends must name at least one source ("file", "mongodb")')
        for name in self.backends:
            if name not in BACKENDS:
                raise ConfigError(f'backends: unknown source {name!r} (expected "file" or "mongodb")')
        if len(set(self.backends)) != len(self.backends):
            raise ConfigError("backends names a source twice")
        if self.acl_nomatch not in ("", *NOMATCH):
            raise ConfigError(f'acl_nomatch must be "allow" or "deny", not {self.acl_nomatch!r}')

    @property
    def mongodb(self) -> bool:
        """Whether MongoDB is one of the sources."""
        return "mongodb" in self.backends


@dataclass(frozen=True)
class MongoAuthConfig:
    """The ``[auth.mongodb]`` section: where MongoDB keeps users and ACL rules ([mongodb] names the server)."""

    collection: str = "mqtt_user"
    """Collection of user documents: {"username", "password_hash" (any hash the password file accepts: $7$, $scrypt$, $6$), "is_superuser"}; twistmq-admin users ... --backend mongodb writes them."""
    acl_collection: str = "mqtt_acl"
    """Collection of ACL documents: {"username" or "clientid", "permission": "allow"|"deny", "action": "publish"|"subscribe"|"all", "topics": [...]} with ${username} / ${clientid} in topics."""
    cache_ttl: float = 30.0
    """Seconds a user document (with its hash) and a client's ACL answers are cached. A change stream on both collections drops cached entries at once where the server has change streams; else this bounds staleness. While MongoDB is down, answers younger than this are served."""

    def validate(self) -> None:
        for key in ("collection", "acl_collection"):
            value = getattr(self, key)
            if not value or "$" in value or "\x00" in value or value.startswith("system."):
                raise ConfigError(f"{key} must be a MongoDB collection name, not {value!r}")
        if not self.cache_ttl > 0:
            raise ConfigError(f"cache_ttl must be a positive number of seconds, not {self.cache_ttl!r}")
