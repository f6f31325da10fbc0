"""Decides whether a connecting client is who it says it is; slows down guessing from one address.

Order of decisions in ``Authenticator.authenticate``:

1. ``use_identity_as_username`` and a verified client certificate identity:
   the identity becomes the username and no password is checked (the
   certificate is the credential, as in mosquitto).
2. No username: accepted when ``allow_anonymous``, else refused
   (``NOT_AUTHORIZED``).
3. A username and a password file: the password must match (scrypt, or
   Mosquitto's PBKDF2-SHA512 / SHA512, run on the executor, never on the
   reactor thread); else ``BAD_CREDENTIALS``.
4. A username and no password file: nothing can verify it, so it is treated
   like an anonymous client: accepted only when ``allow_anonymous``, and the
   result says ``verified=False``; ``AuthResult.acl_username`` is then None, so
   a claimed name never earns another user's ACL rights.

Slowing down: every failure from one peer address doubles the delay before
that address's next answers (``base_delay``, ``2*base_delay``, ... capped at
``max_delay``). An attempt arriving while the address is penalised waits until
the penalty is over before it is even checked, and a failure is answered only
after the new delay, so one address gets at most one guess per delay, whatever
number of connections it opens (the per-address connection-rate limit bounds
those). A success clears the address. Entries idle longer than ``forget_after``
are dropped and at most ``max_tracked`` addresses are remembered.

Every attempt is logged (``mqtt.auth.ok`` / ``mqtt.auth.fail``) with client id,
username, peer address and reason; never the password.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet import defer, task
from twisted.logger import Logger

from mqtt_proxy.auth.passwords import PasswordFile

__all__ = ["AuthResult", "Authenticator", "BAD_CREDENTIALS", "NOT_AUTHORIZED", "OK"]

OK = "ok"
BAD_CREDENTIALS = "bad_credentials"
"""Wrong username or password: CONNACK 0x86 (v5) / return code 4 (v3.1.1)."""
NOT_AUTHORIZED = "not_authorized"
"""Anonymous refused or identity not acceptable: CONNACK 0x87 (v5) / return code 5 (v3.1.1)."""

_V5_CODES = {OK: 0x00, BAD_CREDENTIALS: 0x86, NOT_AUTHORIZED: 0x87}
_V3_CODES = {OK: 0, BAD_CREDENTIALS: 4, NOT_AUTHORIZED: 5}


@dataclass(frozen=True, slots=True)
class AuthResult:
    """The outcome of one authentication."""

    ok: bool
    username: str | None
    """The username the session runs as (the certificate identity with use_identity_as_username)."""
    reason: str
    """``OK``, ``BAD_CREDENTIALS`` or ``NOT_AUTHORIZED``."""
    verified: bool = False
    """True when the username was proven (password or certificate), False for anonymous/unverified."""

    @property
    def acl_username(self) -> str | None:
        """The username to check the ACL with: None (anonymous rules) unless it was verified."""
        return self.username if self.verified else None

    @property
    def v5_reason_code(self) -> int:
        """The CONNACK reason code for MQTT 5.0."""
        return _V5_CODES[self.reason]

    @property
    def v3_return_code(self) -> int:
        """The CONNACK return code for MQTT 3.1.1."""
        return _V3_CODES[self.reason]


class _Penalty:
    __slots__ = ("failures", "until", "last")

    def __init__(self) -> None:
        self.failures = 0
        self.until = 0.0
        self.last = 0.0


class Authenticator:
    """Authenticates CONNECTs against an optional password file, with per-address slow-down."""

    log = Logger(namespace="twistmq.mqtt.auth")

    def __init__(self, password_file: PasswordFile | str | None, allow_anonymous: bool, clock: Any,
                 executor: Any = None, *, use_identity_as_username: bool = False,
                 base_delay: float = 1.0, max_delay: float = 30.0, forget_after: float = 600.0,
                 max_tracked: int = 10000) -> None:
        """*executor* has ``submit(fn, *args) -> Deferred`` (``store.executor``); required with a password file."""
        if isinstance(password_file, str):
            password_file = PasswordFile.load(password_file) if password_file else None
        if password_file is not None and executor is None:
            raise ValueError("a password file needs an executor: scrypt must not run on the reactor thread")
        self._passwords = password_file
        self.allow_anonymous = allow_anonymous
        self.use_identity_as_username = use_identity_as_username
        self._clock = clock
        self._executor = executor
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._forget_after = forget_after
        self._max_tracked = max_tracked
        self._penalties: OrderedDict[str, _Penalty] = OrderedDict()

    @property
    def password_file(self) -> PasswordFile | None:
        """The password file checked against, or None; its ``reload()`` re-reads it in place (SIGHUP)."""
        return self._passwords

    def set_password_file(self, password_file: PasswordFile | None) -> None:
        """Swap in a reloaded password file (e.g. on SIGHUP); attempts under way finish with the old one."""
        if password_file is not None and self._executor is None:
            raise ValueError("a password file needs an executor")
        self._passwords = password_file

    def delay_for(self, peer_host: str) -> float:
        """Return how long an attempt from *peer_host* would wait now before being checked."""
        penalty = self._penalties.get(peer_host)
        if penalty is None:
            return 0.0
        return max(0.0, penalty.until - self._clock.seconds())

    def authenticate(self, username: str | None, password: str | bytes | None, client_id: str,
                     peer_host: str, cert_identity: str | None = None) -> defer.Deferred:
        """Check one CONNECT; the Deferred fires with an ``AuthResult`` (never errbacks except on cancel)."""
        self._expire()
        wait = self.delay_for(peer_host)
        if wait > 0:
            d = task.deferLater(self._clock, wait, lambda: None)
        else:
            d = defer.succeed(None)
        d.addCallback(lambda _: self._decide(username, password, cert_identity))
        d.addCallback(self._finish, client_id, peer_host, username, cert_identity)
        return d

    def _decide(self, username: str | None, password: str | bytes | None,
                cert_identity: str | None) -> AuthResult | defer.Deferred:
        if self.use_identity_as_username and cert_identity:
            return AuthResult(True, cert_identity, OK, verified=True)
        if username is None:
            if self.allow_anonymous:
                return AuthResult(True, None, OK)
            return AuthResult(False, None, NOT_AUTHORIZED)
        if self._passwords is None:
            if self.allow_anonymous:
                return AuthResult(True, username, OK, verified=False)
            return AuthResult(False, username, NOT_AUTHORIZED)
        if password is None:
            return AuthResult(False, username, BAD_CREDENTIALS)
        if isinstance(password, bytes):
            try:
                password = password.decode("utf-8")
            except UnicodeDecodeError:
                return AuthResult(False, username, BAD_CREDENTIALS)
        passwords = self._passwords
        d = self._executor.submit(passwords.verify, username, password)

        def verdict(matched: bool) -> AuthResult:
            return AuthResult(bool(matched), username, OK if matched else BAD_CREDENTIALS, verified=bool(matched))

        def broken(failure) -> AuthResult:
            if failure.check(defer.CancelledError):
                return failure
            self.log.failure("mqtt.auth.error password check failed for user={username!r}",
                             failure, username=username)
            return AuthResult(False, username, BAD_CREDENTIALS)

        return d.addCallbacks(verdict, broken)

    def _finish(self, result: AuthResult, client_id: str, peer_host: str, username: str | None,
                cert_identity: str | None) -> AuthResult | defer.Deferred:
        if result.ok:
            self._penalties.pop(peer_host, None)
            self.log.info(
                "mqtt.auth.ok client_id={client_id!r} username={username!r} peer={peer} "
                "cert={cert!r} verified={verified}",
                client_id=client_id, username=result.username, peer=peer_host, cert=cert_identity,
                verified=result.verified)
            return result
        delay = self._record_failure(peer_host)
        self.log.warn(
            "mqtt.auth.fail client_id={client_id!r} username={username!r} peer={peer} cert={cert!r} "
            "reason={reason} failures={failures} delay={delay:.3g}s",
            client_id=client_id, username=username, peer=peer_host, cert=cert_identity,
            reason=result.reason, failures=self._penalties[peer_host].failures, delay=delay)
        if delay <= 0:
            return result
        return task.deferLater(self._clock, delay, lambda: result)

    def _record_failure(self, peer_host: str) -> float:
        now = self._clock.seconds()
        penalty = self._penalties.pop(peer_host, None) or _Penalty()
        self._penalties[peer_host] = penalty  # most recently used last
        penalty.failures += 1
        penalty.last = now
        delay = min(self._max_delay, self._base_delay * (2 ** min(penalty.failures - 1, 62)))
        penalty.until = max(penalty.until, now + delay)
        while len(self._penalties) > self._max_tracked:
            self._penalties.popitem(last=False)
        return delay

    def _expire(self) -> None:
        now = self._clock.seconds()
        while self._penalties:
            host, penalty = next(iter(self._penalties.items()))
            if now - penalty.last < self._forget_after or penalty.until > now:
                break
            del self._penalties[host]


def make_authenticator(mqtt_config: Any, clock: Any, executor: Any,
                       loader: Callable[[str], PasswordFile] = PasswordFile.load) -> Authenticator:
    """Build the authenticator from the ``[mqtt]`` config (password_file, allow_anonymous, ...)."""
    path = getattr(mqtt_config, "password_file", "")
    return Authenticator(
        loader(path) if path else None,
        allow_anonymous=getattr(mqtt_config, "allow_anonymous", True),
        clock=clock,
        executor=executor,
        use_identity_as_username=getattr(mqtt_config, "use_identity_as_username", False),
        base_delay=getattr(mqtt_config, "auth_fail_delay", 1.0),
        max_delay=getattr(mqtt_config, "auth_fail_delay_max", 30.0),
    )
