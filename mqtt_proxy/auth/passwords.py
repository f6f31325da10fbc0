"""The password file: one ``username:$scrypt$...`` line per user, scrypt hashes from ``cryptography``.

File format (UTF-8, ``#`` comments and blank lines ignored)::

    alice:$scrypt$ln=14,r=8,p=1$<salt, base64>$<hash, base64>

``ln`` is log2 of the scrypt cost N; salt and hash are unpadded standard base64
(16-byte salt, 32-byte hash). A username is non-empty and holds no ``:``, no
control characters and no surrounding spaces.

Hashing and verifying are deliberately slow (tens of milliseconds and 16 MiB of
memory each), so ``PasswordFile.verify`` must not run on the reactor thread:
the authenticator hands it to an executor. The comparison of hashes is
constant-time (``Scrypt.verify``), and a lookup for an unknown user still costs
one scrypt run, so timing tells nothing about which usernames exist.

Plain text never leaves this module: nothing here logs, and ``repr`` of a
``PasswordFile`` shows only the user count.
"""

from __future__ import annotations

import base64
import os
import re
import tempfile

from cryptography.exceptions import InvalidKey
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

__all__ = [
    "PasswordFile",
    "PasswordFileError",
    "hash_password",
    "validate_username",
    "verify_password",
]

DEFAULT_LOG_N = 14
"""log2 of the scrypt cost N for new hashes (N=16384, r=8: 16 MiB, ~50 ms)."""
SALT_BYTES = 16
HASH_BYTES = 32
_MAX_LOG_N = 20  # refuse absurd costs from a tampered file: 2**20 * 8 * 128 = 1 GiB
_PREFIX = "$scrypt$"
_PARAMS = re.compile(r"^ln=(\d+),r=(\d+),p=(\d+)$")
_DUMMY_SALT = b"\x00" * SALT_BYTES


class PasswordFileError(ValueError):
    """The password file, a line of it, a username or a hash is malformed; the message names where."""


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


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _kdf(salt: bytes, log_n: int, r: int, p: int, length: int = HASH_BYTES) -> Scrypt:
    return Scrypt(salt=salt, length=length, n=1 << log_n, r=r, p=p)


def hash_password(password: str, *, log_n: int = DEFAULT_LOG_N, r: int = 8, p: int = 1,
                  salt: bytes | None = None) -> str:
    """Return the ``$scrypt$ln=..,r=..,p=..$salt$hash`` encoding of *password* with a fresh random salt."""
    if not isinstance(password, str):
        raise TypeError("password must be str")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = _kdf(salt, log_n, r, p).derive(password.encode("utf-8"))
    return f"{_PREFIX}ln={log_n},r={r},p={p}${_b64(salt)}${_b64(digest)}"


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    """Split an encoded hash into ``(log_n, r, p, salt, digest)``; raise ``PasswordFileError``."""
    if not encoded.startswith(_PREFIX):
        raise PasswordFileError("hash does not start with $scrypt$")
    parts = encoded[len(_PREFIX):].split("$")
    if len(parts) != 3:
        raise PasswordFileError("hash must be $scrypt$PARAMS$SALT$HASH")
    match = _PARAMS.match(parts[0])
    if match is None:
        raise PasswordFileError("hash parameters must be ln=N,r=N,p=N")
    log_n, r, p = (int(g) for g in match.groups())
    if not (1 <= log_n <= _MAX_LOG_N and 1 <= r <= 32 and 1 <= p <= 16):
        raise PasswordFileError("hash parameters out of range")
    try:
        salt, digest = _unb64(parts[1]), _unb64(parts[2])
    except ValueError:
        raise PasswordFileError("hash salt or digest is not base64") from None
    if not salt or not 16 <= len(digest) <= 64:
        raise PasswordFileError("hash salt or digest has a bad length")
    return log_n, r, p, salt, digest


def verify_password(password: str, encoded: str) -> bool:
    """Tell whether *password* matches the encoded hash (constant-time compare). Blocking: run off the reactor."""
    log_n, r, p, salt, digest = _parse_hash(encoded)
    try:
        _kdf(salt, log_n, r, p, len(digest)).verify(password.encode("utf-8"), digest)
    except InvalidKey:
        return False
    return True


class PasswordFile:
    """The users and hashes of one password file, in file order.

    ``load``/``save`` read and write the file (``save`` replaces it atomically,
    mode 0600); ``add``/``delete`` change the in-memory table. ``verify`` is
    blocking and thread-safe as long as nobody mutates the table meanwhile
    (the broker reloads by building a new ``PasswordFile`` and swapping it in).
    """

    def __init__(self, entries: dict[str, str] | None = None, path: str | None = None) -> None:
        self._entries: dict[str, str] = dict(entries or {})
        self.path = path
        """Where it was loaded from, or None."""

    @classmethod
    def load(cls, path: str) -> PasswordFile:
        """Read *path*; raise ``PasswordFileError`` naming ``path:line`` on a bad line, ``OSError`` if unreadable."""
        entries: dict[str, str] = {}
        with open(path, encoding="utf-8") as handle:
            for lineno, raw in enumerate(handle, 1):
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                username, sep, encoded = line.partition(":")
                try:
                    if not sep:
                        raise PasswordFileError("expected username:$scrypt$...")
                    validate_username(username)
                    _parse_hash(encoded)
                    if username in entries:
                        raise PasswordFileError(f"user {username!r} is listed twice")
                except PasswordFileError as exc:
                    raise PasswordFileError(f"{path}:{lineno}: {exc}") from None
                entries[username] = encoded
        return cls(entries, path)

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
        """Tell whether *password* is *username*'s. Blocking (scrypt); unknown users cost the same time."""
        encoded = self._entries.get(username)
        if encoded is None:
            # Burn one scrypt run so that unknown users are not faster to reject.
            _kdf(_DUMMY_SALT, DEFAULT_LOG_N, 8, 1).derive(password.encode("utf-8"))
            return False
        return verify_password(password, encoded)
