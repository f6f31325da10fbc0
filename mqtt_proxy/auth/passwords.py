"""The password file: one ``username:HASH`` line per user; twistmq's scrypt or Mosquitto's hashes.

File format (UTF-8, ``#`` comments and blank lines ignored)::

    alice:$scrypt$ln=14,r=8,p=1$<salt, base64>$<hash, base64>     # twistmq-admin passwd
    bob:$7$101$<salt, base64>$<hash, base64>                       # mosquitto_passwd (2.0)
    carol:$6$<salt, base64>$<hash, base64>                         # mosquitto_passwd -H sha512 (1.x)

So a Mosquitto password file works as it is; the encodings are described in
``mqtt_proxy.auth.hashes``. ``twistmq-admin passwd`` writes scrypt and keeps
the other lines as they are. A username is non-empty and holds no ``:``, no
control characters and no surrounding spaces.

Hashing and verifying are deliberately slow (scrypt: tens of milliseconds and
16 MiB of memory each), so ``PasswordFile.verify`` must not run on the reactor
thread: the authenticator hands it to an executor. The comparison of hashes is
constant-time, and a lookup for an unknown user still costs one scrypt run, so
timing tells nothing about which usernames exist (users with Mosquitto hashes
answer in their own time: PBKDF2 with few iterations, or one SHA512, is faster).

``PasswordFile.reload()`` re-reads the file it was loaded from (SIGHUP): the
new table replaces the old in one assignment, so a check running on a thread
sees either the old table or the new one; on a bad file it raises and keeps the
old table.

Plain text never leaves this module: nothing here logs, and ``repr`` of a
``PasswordFile`` shows only the user count.
"""

from __future__ import annotations

import os
import tempfile

from mqtt_proxy.auth import hashes
from mqtt_proxy.auth.hashes import DEFAULT_LOG_N, HashError

__all__ = [
    "DEFAULT_LOG_N",
    "PasswordFile",
    "PasswordFileError",
    "hash_password",
    "validate_username",
    "verify_password",
]


class PasswordFileError(ValueError):
    """The password file, a line of it, a username or a hash is malformed; the message names where.

    ``path``, ``line`` and ``reason`` hold the parts of the message (None when unknown) for log lines.
    """

    def __init__(self, reason: str, path: str | None = None, line: int | None = None) -> None:
        where = f"{path}:{line}: " if path is not None and line is not None else (f"{path}: " if path else "")
        super().__init__(where + reason)
        self.reason = reason
        self.path = path
        self.line = line


def validate_username(username: str) -> None:
    """Raise ``PasswordFileError`` unless *username* can be stored in a password file."""
    if not isinstance(username, str) or not username:
        raise PasswordFileError("username must be a non-empty string")
    if ":" in username:
        raise PasswordFileError("username must not contain ':'")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in username):
        raise PasswordFileError("username must not contain control characters")
    if username != username.strip():
        raise PasswordFileError("username must not start or end with white space")


def hash_password(password: str, *, log_n: int = DEFAULT_LOG_N, r: int = 8, p: int = 1,
                  salt: bytes | None = None) -> str:
    """Return the ``$scrypt$ln=..,r=..,p=..$salt$hash`` encoding of *password* with a fresh random salt."""
    return hashes.hash_scrypt(password, log_n=log_n, r=r, p=p, salt=salt)


def verify_password(password: str, encoded: str) -> bool:
    """Tell whether *password* matches the encoded hash, any accepted scheme. Blocking: run off the reactor."""
    try:
        parsed = hashes.parse_hash(encoded)
    except HashError as exc:
        raise PasswordFileError(str(exc)) from None
    return hashes.verify(password, parsed)


def _read_entries(path: str) -> dict[str, str]:
    """Parse the file at *path* into ``{username: encoded hash}``; raise ``PasswordFileError`` or ``OSError``."""
    entries: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except UnicodeDecodeError as exc:
        raise PasswordFileError(f"not UTF-8 text (byte {exc.start})", path) from None
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        username, sep, encoded = line.partition(":")
        try:
            if not sep:
                raise PasswordFileError("expected username:HASH")
            validate_username(username)
            hashes.parse_hash(encoded)
            if username in entries:
                raise PasswordFileError(f"user {username!r} is listed twice")
        except PasswordFileError as exc:
            raise PasswordFileError(exc.reason, path, lineno) from None
        except HashError as exc:
            raise PasswordFileError(str(exc), path, lineno) from None
        entries[username] = encoded
    return entries


class PasswordFile:
    """The users and hashes of one password file, in file order.

    ``load``/``save`` read and write the file (``save`` replaces it atomically,
    mode 0600); ``add``/``delete`` change the in-memory table; ``reload``
    re-reads the file. ``verify`` is blocking and thread-safe as long as nobody
    calls ``add``/``delete`` meanwhile (the broker never does): ``reload``
    replaces the table in one assignment instead of changing it in place.
    """

    def __init__(self, entries: dict[str, str] | None = None, path: str | None = None) -> None:
        self._entries: dict[str, str] = dict(entries or {})
        self.path = path
        """Where it was loaded from, or None."""

    @classmethod
    def load(cls, path: str) -> PasswordFile:
        """Read *path*; raise ``PasswordFileError`` naming ``path:line`` on a bad line, ``OSError`` if unreadable."""
        return cls(_read_entries(path), path)

    def reload(self) -> None:
        """Re-read the file it was loaded from; on any error raise and keep the current table."""
        if self.path is None:
            raise ValueError("this password table was not loaded from a file")
        self._entries = _read_entries(self.path)  # one assignment: a check on a thread sees old or new

    def save(self, path: str | None = None) -> None:
        """Write the table to *path* (default: where it was loaded from) atomically, readable by the owner only."""
        target = path or self.path
        if target is None:
            raise ValueError("no path to save the password file to")
        directory = os.path.dirname(os.path.abspath(target))
        fd, tmp = tempfile.mkstemp(prefix=".passwd-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                for username, encoded in self._entries.items():
                    handle.write(f"{username}:{encoded}\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self.path = target

    def add(self, username: str, password: str, *, log_n: int = DEFAULT_LOG_N) -> None:
        """Add *username* or replace its password (blocking: hashes)."""
        validate_username(username)
        self._entries[username] = hash_password(password, log_n=log_n)

    def delete(self, username: str) -> None:
        """Remove *username*; raise ``KeyError`` if it is not there."""
        del self._entries[username]

    def users(self) -> list[str]:
        """Return the usernames, in file order."""
        return list(self._entries)

    def __contains__(self, username: object) -> bool:
        return username in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<PasswordFile {self.path!r} with {len(self._entries)} users>"

    def verify(self, username: str, password: str) -> bool:
        """Tell whether *password* is *username*'s. Blocking (scrypt, PBKDF2); unknown users cost one scrypt run."""
        encoded = self._entries.get(username)
        if encoded is None:
            hashes.burn(password)  # so that unknown users are not faster to reject than scrypt users
            return False
        return verify_password(password, encoded)
