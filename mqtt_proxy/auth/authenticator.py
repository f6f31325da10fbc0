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

Slowing down (``mqtt_proxy.auth.guessing``): failures are counted per
username and per peer address, separately. Each failure for a username doubles
the delay before that username's next attempt is checked (``base_delay``,
``2*base_delay``, ... capped at ``max_delay``), whichever address it comes
from, and only a success for that same username clears it. Failures from one
address slow that address down only past ``address_limit`` within ``window``
seconds, so one device's mistakes do not lock out everything behind a NAT, and
no success from it drains that count. A failure is answered only after the new
delay, and an attempt arriving during a delay waits for it before it is even
checked, however many connections it opens.

With ``[auth] backends`` naming more than the file (``chain``, a
``mqtt_proxy.auth.chain.PasswordChain``), step 3 asks the chain's sources in
order instead; a source that could not be asked (MongoDB down, nothing cached)
makes the answer ``SERVER_UNAVAILABLE`` (CONNACK 0x88 / 3) unless an earlier source
decided. That answer is not a failed login: it neither counts nor delays. An
accepted client's ACL rules are then read (``acl_loader``) before CONNACK, and
when they cannot be, the answer is ``SERVER_UNAVAILABLE`` too.

Every attempt is logged (``mqtt.auth.ok`` / ``mqtt.auth.fail`` /
``mqtt.auth.unavailable``) with client id, username, peer address and reason;
never the password.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twisted.internet import defer, task
from twisted.logger import Logger

from mqtt_proxy.auth.chain import MATCH, UNAVAILABLE
from mqtt_proxy.auth.guessing import FailureCounter
from mqtt_proxy.auth.passwords import PasswordFile

__all__ = ["AuthResult", "Authenticator", "BAD_CREDENTIALS", "NOT_AUTHORIZED", "OK", "SERVER_UNAVAILABLE"]

OK = "ok"
BAD_CREDENTIALS = "bad_credentials"
"""Wrong username or password: CONNACK 0x86 (v5) / return code 4 (v3.1.1)."""
NOT_AUTHORIZED = "not_authorized"
"""Anonymous refused or identity not acceptable: CONNACK 0x87 (v5) / return code 5 (v3.1.1)."""

SERVER_UNAVAILABLE = "server_unavailable"
"""A user source could not be asked (MongoDB down, nothing cached): CONNACK 0x88 (v5) / return code 3 (v3.1.1)."""

_V5_CODES = {OK: 0x00, BAD_CREDENTIALS: 0x86, NOT_AUTHORIZED: 0x87, SERVER_UNAVAILABLE: 0x88}
_V3_CODES = {OK: 0, BAD_CREDENTIALS: 4, NOT_AUTHORIZED: 5, SERVER_UNAVAILABLE: 3}


@dataclass(frozen=True, slots=True)
class AuthResult:
    """The outcome of one authentication."""

    ok: bool
    username: str | None
    """The username the session runs as (the certificate identity with use_identity_as_username)."""
    reason: str
    """``OK``, ``BAD_CREDENTIALS``, ``NOT_AUTHORIZED`` or ``SERVER_UNAVAILABLE``."""
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


class Authenticator:
    """Authenticates CONNECTs against an optional password file, with per-address slow-down."""

    log = Logger(namespace="twistmq.mqtt.auth")

    def __init__(self, password_file: PasswordFile | str | None, allow_anonymous: bool, clock: Any,
                 executor: Any = None, *, use_identity_as_username: bool = False,
                 base_delay: float = 1.0, max_delay: float = 30.0, forget_after: float = 600.0,
                 max_tracked: int = 10000, address_limit: int = 100, chain: Any = None,
                 acl_loader: Callable[[str | None, str], defer.Deferred] | None = None,
                 log_ok: bool = True) -> None:
        """*executor* has ``submit(fn, *args) -> Deferred`` (``store.executor``); required with a password file.

        *log_ok*: log each accepted login (``mqtt.auth.ok``; ``[log] connection_messages``). Off, the event
        is not even made (the log would drop it, after it cost a connect storm its making).

        *chain* (a ``PasswordChain``) replaces the password file's check; *acl_loader(username, client_id)*
        reads an accepted client's ACL rules before it is answered (failing when it cannot).
        """
        if isinstance(password_file, str):
            password_file = PasswordFile.load(password_file) if password_file else None
        if password_file is not None and executor is None:
            raise ValueError("a password file needs an executor: scrypt must not run on the reactor thread")
        self._passwords = password_file
        self._chain = chain
        self._acl_loader = acl_loader
        self.log_ok = log_ok
        self.allow_anonymous = allow_anonymous
        self.use_identity_as_username = use_identity_as_username
        self._clock = clock
        self._executor = executor
        self._failures = FailureCounter(clock, base_delay=base_delay, max_delay=max_delay,
                                        address_limit=address_limit, window=forget_after, max_tracked=max_tracked)

    @property
    def password_file(self) -> PasswordFile | None:
        """The password file checked against, or None; its ``reload()`` re-reads it in place (SIGHUP)."""
        return self._passwords

    def set_password_file(self, password_file: PasswordFile | None) -> None:
        """Swap in a reloaded password file (e.g. on SIGHUP); attempts under way finish with the old one."""
        if password_file is not None and self._executor is None:
            raise ValueError("a password file needs an executor")
        self._passwords = password_file

    def delay_for(self, peer_host: str, username: str | None = None) -> float:
        """Return how long an attempt for *username* from *peer_host* would wait now before being checked."""
        return max(0.0, self._failures.delay(username, peer_host))

    def authenticate(self, username: str | None, password: str | bytes | None, client_id: str,
                     peer_host: str, cert_identity: str | None = None) -> defer.Deferred:
        """Check one CONNECT; the Deferred fires with an ``AuthResult`` (never errbacks except on cancel)."""
        wait = self.delay_for(peer_host, username)
        if wait <= 0 and self._acl_loader is None:
            # Decided now in the common case (anonymous, a certificate): one Deferred, not a chain of three.
            try:  # (isinstance against AuthResult: Deferred's ABCMeta makes a check against it slow)
                result = self._decide(username, password, cert_identity)
                if isinstance(result, AuthResult):
                    result = self._finish(result, client_id, peer_host, username, cert_identity)
                    return defer.succeed(result) if isinstance(result, AuthResult) else result
            except Exception:  # noqa: BLE001 - as in the chain below: the caller sees a failed Deferred
                return defer.fail()
            return result.addCallback(self._finish, client_id, peer_host, username, cert_identity)
        if wait > 0:
            d = task.deferLater(self._clock, wait, lambda: None)
        else:
            d = defer.succeed(None)
        d.addCallback(lambda _: self._decide(username, password, cert_identity))
        if self._acl_loader is not None:
            d.addCallback(self._load_acl, client_id)
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
        if self._chain is not None:
            return self._ask_chain(username, password)
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

    def _ask_chain(self, username: str, password: str | bytes | None) -> AuthResult | defer.Deferred:
        if password is None:
            return AuthResult(False, username, BAD_CREDENTIALS)
        if isinstance(password, bytes):
            try:
                password = password.decode("utf-8")
            except UnicodeDecodeError:
                return AuthResult(False, username, BAD_CREDENTIALS)
        def verdict(answer: str) -> AuthResult:
            if answer == UNAVAILABLE:
                return AuthResult(False, username, SERVER_UNAVAILABLE)
            matched = answer == MATCH
            return AuthResult(matched, username, OK if matched else BAD_CREDENTIALS, verified=matched)

        def broken(failure) -> AuthResult:
            if failure.check(defer.CancelledError):
                return failure
            self.log.failure("mqtt.auth.error password check failed for user={username!r}",
                             failure, username=username)
            return AuthResult(False, username, SERVER_UNAVAILABLE)

        return self._chain.check(username, password).addCallbacks(verdict, broken)

    def _load_acl(self, result: AuthResult, client_id: str) -> AuthResult | defer.Deferred:
        if not result.ok:
            return result
        return self._acl_loader(result.acl_username, client_id).addCallbacks(
            lambda _: result, lambda _failure: AuthResult(False, result.username, SERVER_UNAVAILABLE))

    def _finish(self, result: AuthResult, client_id: str, peer_host: str, username: str | None,
                cert_identity: str | None) -> AuthResult | defer.Deferred:
        if result.reason == SERVER_UNAVAILABLE:
            # Nobody could say whether the credentials are good: not a failed login, no slow-down.
            self.log.warn("mqtt.auth.unavailable client_id={client_id!r} username={username!r} peer={peer}",
                          client_id=client_id, username=username, peer=peer_host)
            return result
        if result.ok:
            if result.verified and result.username == username:
                self._failures.succeeded(username)  # only the name it proved: not the address, not other names
            if self.log_ok:
                self.log.info(
                    "mqtt.auth.ok client_id={client_id!r} username={username!r} peer={peer} "
                    "cert={cert!r} verified={verified}",
                    client_id=client_id, username=result.username, peer=peer_host, cert=cert_identity,
                    verified=result.verified)
            return result
        delay = self._failures.failed(username, peer_host)
        user_failures, address_failures = self._failures.failures(username, peer_host)
        self.log.warn(
            "mqtt.auth.fail client_id={client_id!r} username={username!r} peer={peer} cert={cert!r} "
            "reason={reason} failures={failures} address_failures={address_failures} delay={delay:.3g}s",
            client_id=client_id, username=username, peer=peer_host, cert=cert_identity,
            reason=result.reason, failures=user_failures, address_failures=address_failures, delay=delay)
        if delay <= 0:
            return result
        return task.deferLater(self._clock, delay, lambda: result)


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
        address_limit=getattr(mqtt_config, "auth_fail_address_limit", 100),
        forget_after=getattr(mqtt_config, "auth_fail_window", 600.0),
    )
