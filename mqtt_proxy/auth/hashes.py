"""Password hash encodings: twistmq's scrypt, and Mosquitto's ``$7$`` (PBKDF2-SHA512) and ``$6$`` (SHA512).

The three encodings a password file line may hold after ``username:``::

    $scrypt$ln=14,r=8,p=1$<salt>$<hash>    twistmq (twistmq-admin passwd): scrypt, N = 2**ln;
                                           unpadded standard base64
    $7$<iterations>$<salt>$<hash>          Mosquitto 2.0 (mosquitto_passwd's default):
                                           PBKDF2-HMAC-SHA512(password, salt, iterations), 64 bytes
    $6$<salt>$<hash>                       Mosquitto 1.x (mosquitto_passwd -H sha512):
                                           SHA512(password + salt), one round

Mosquitto writes padded standard base64 and a 12-byte salt; both paddings are
accepted here. ``$6$`` is accepted so a Mosquitto 1.x file keeps working, but a
single salted SHA512 is cheap to brute-force: re-hash those users with
``twistmq-admin passwd`` (Mosquitto's ``$6$`` is not crypt(3)'s SHA512-crypt,
which shares the prefix; there are no rounds here).

``parse_hash`` checks an encoding (at load time, so a bad file is refused
whole); ``verify`` is blocking (scrypt and PBKDF2 are deliberately slow) and
compares in constant time. Neither ever logs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidKey
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

__all__ = ["DEFAULT_LOG_N", "HashError", "ParsedHash", "burn", "hash_scrypt", "parse_hash", "verify"]

DEFAULT_LOG_N = 14
"""log2 of the scrypt cost N for new hashes (N=16384, r=8: 16 MiB, ~50 ms)."""
SALT_BYTES = 16
HASH_BYTES = 32
SCRYPT = "$scrypt$"
PBKDF2_SHA512 = "$7$"
SHA512 = "$6$"
_MAX_LOG_N = 20  # refuse absurd costs from a tampered file: 2**20 * 8 * 128 = 1 GiB
_MAX_ITERATIONS = 10_000_000  # PBKDF2-SHA512 at this count takes seconds: a tampered file, not a real one
_PARAMS = re.compile(r"^ln=(\d+),r=(\d+),p=(\d+)$")
_DUMMY_SALT = b"\x00" * SALT_BYTES


class HashError(ValueError):
    """An encoded hash is malformed; the message says how, never what it holds."""


@dataclass(frozen=True, slots=True)
class ParsedHash:
    """One decoded hash: its scheme (one of the prefixes above), cost parameters, salt and digest."""

    scheme: str
    params: tuple[int, ...]
    """scrypt: (log_n, r, p); $7$: (iterations,); $6$: ()."""
    salt: bytes
    digest: bytes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    text = text.rstrip("=")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _salt_and_digest(salt_text: str, digest_text: str, digest_sizes: range) -> tuple[bytes, bytes]:
    try:
        salt, digest = _unb64(salt_text), _unb64(digest_text)
    except ValueError:
        raise HashError("hash salt or digest is not base64") from None
    if not salt or len(digest) not in digest_sizes:
        raise HashError("hash salt or digest has a bad length")
    return salt, digest


def parse_hash(encoded: str) -> ParsedHash:
    """Decode an encoded hash of any accepted scheme; raise ``HashError`` naming what is wrong."""
    if encoded.startswith(SCRYPT):
        parts = encoded[len(SCRYPT):].split("$")
        if len(parts) != 3:
            raise HashError("hash must be $scrypt$PARAMS$SALT$HASH")
        match = _PARAMS.match(parts[0])
        if match is None:
            raise HashError("hash parameters must be ln=N,r=N,p=N")
        log_n, r, p = (int(g) for g in match.groups())
        if not (1 <= log_n <= _MAX_LOG_N and 1 <= r <= 32 and 1 <= p <= 16):
            raise HashError("hash parameters out of range")
        return ParsedHash(SCRYPT, (log_n, r, p), *_salt_and_digest(parts[1], parts[2], range(16, 65)))
    if encoded.startswith(PBKDF2_SHA512):
        parts = encoded[len(PBKDF2_SHA512):].split("$")
        if len(parts) != 3 or not parts[0].isdigit():
            raise HashError("hash must be $7$ITERATIONS$SALT$HASH (mosquitto_passwd)")
        iterations = int(parts[0])
        if not 1 <= iterations <= _MAX_ITERATIONS:
            raise HashError(f"$7$ iterations must be within 1..{_MAX_ITERATIONS}")
        return ParsedHash(PBKDF2_SHA512, (iterations,), *_salt_and_digest(parts[1], parts[2], range(16, 65)))
    if encoded.startswith(SHA512):
        parts = encoded[len(SHA512):].split("$")
        if len(parts) != 2:
            raise HashError("hash must be $6$SALT$HASH (mosquitto_passwd -H sha512)")
        return ParsedHash(SHA512, (), *_salt_and_digest(parts[0], parts[1], range(64, 65)))
    raise HashError("hash must start with $scrypt$, $7$ or $6$")


def _scrypt(salt: bytes, log_n: int, r: int, p: int, length: int = HASH_BYTES) -> Scrypt:
    return Scrypt(salt=salt, length=length, n=1 << log_n, r=r, p=p)


def hash_scrypt(password: str, *, log_n: int = DEFAULT_LOG_N, r: int = 8, p: int = 1,
                salt: bytes | None = None) -> str:
    """Return the ``$scrypt$ln=..,r=..,p=..$salt$hash`` encoding of *password* (fresh random salt by default)."""
    if not isinstance(password, str):
        raise TypeError("password must be str")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = _scrypt(salt, log_n, r, p).derive(password.encode("utf-8"))
    return f"{SCRYPT}ln={log_n},r={r},p={p}${_b64(salt)}${_b64(digest)}"


def verify(password: str, parsed: ParsedHash) -> bool:
    """Tell whether *password* matches *parsed* (constant-time compare). Blocking: run off the reactor."""
    secret = password.encode("utf-8")
    if parsed.scheme == SCRYPT:
        log_n, r, p = parsed.params
        try:
            _scrypt(parsed.salt, log_n, r, p, len(parsed.digest)).verify(secret, parsed.digest)
        except InvalidKey:
            return False
        return True
    if parsed.scheme == PBKDF2_SHA512:
        candidate = hashlib.pbkdf2_hmac("sha512", secret, parsed.salt, parsed.params[0], len(parsed.digest))
    else:
        candidate = hashlib.sha512(secret + parsed.salt).digest()
    return hmac.compare_digest(candidate, parsed.digest)


def burn(password: str) -> None:
    """Spend one default scrypt run on *password*, so an unknown user costs what a twistmq user does."""
    _scrypt(_DUMMY_SALT, DEFAULT_LOG_N, 8, 1).derive(password.encode("utf-8"))
