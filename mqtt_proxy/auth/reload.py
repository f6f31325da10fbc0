"""Re-reading the security files on SIGHUP: the password file, the ACL, each TLS listener's certificates.

What Mosquitto operators expect from ``kill -HUP`` / ``systemctl reload``: the
files named at start are read again, and every connection stays up. Each
target's ``reload()`` either swaps the new content in or raises and keeps what
it had, so a bad file never leaves the broker with no password table, no ACL
or no certificate. One log line per target says which::

    reload_ok kind=passwords file=/etc/twistmq/passwd users=12
    reload_ok kind=acl file=/etc/twistmq/acl users=3 clients=1 rules=9
    reload_ok kind=tls listener=mqtt-tls file=server.pem key=server.key ca=ca.pem subject=... serial=... not_after=...
    reload_failed kind=acl file=/etc/twistmq/acl line=7 reason="unknown access 'rw' ..." kept=previous

The configuration file itself (twistmq.toml) is not re-read: which files and
listeners exist is fixed at start. A reload does not re-check connected
clients: a removed user stays connected until it reconnects, while a changed
ACL applies to every client's next publish and subscribe, and to every message
delivered after it (subscriptions made before the reload included).

Nothing here installs the signal handler: the composition root does, and hands
the work to the reactor thread with ``callFromThread``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twisted.logger import Logger

__all__ = ["ReloadTarget", "Reloader", "security_targets"]

_log = Logger(namespace="twistmq.reload")  # not a class attribute: Logger, a descriptor, would take the class's name


@dataclass(frozen=True)
class ReloadTarget:
    """One thing SIGHUP re-reads."""

    kind: str
    """``passwords``, ``acl`` or ``tls``."""
    file: str
    """The file named in the log line (for TLS the certificate)."""
    reload: Callable[[], dict[str, Any]]
    """Re-reads and swaps in; returns the fields of the ``reload_ok`` line; raises (and keeps the old) on error."""
    listener: str | None = None
    """For TLS: which listener the context belongs to."""


def _fields(values: dict[str, Any]) -> str:
    """``key=value`` pairs; strings with spaces or quotes are quoted with repr."""
    parts = []
    for key, value in values.items():
        text = str(value)
        if isinstance(value, str) and (not text or any(ch in text for ch in " \t'\"=")):
            text = repr(value)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def _why(exc: BaseException) -> tuple[int | str, str]:
    """The line number (or ``-``) and the reason of a failed reload, without the path prefix when known."""
    line = getattr(exc, "line", None)
    reason = getattr(exc, "reason", None)
    if isinstance(exc, OSError) and not reason:
        reason = exc.strerror or str(exc)
    return (line if line is not None else "-"), (reason or str(exc) or type(exc).__name__)


class Reloader:
    """Runs every target's reload and logs one line per target; one bad target never stops the others."""


    def __init__(self, targets: list[ReloadTarget], log: Logger | None = None) -> None:
        self.targets = list(targets)
        self._log = log or _log

    def reload(self, trigger: str = "SIGHUP") -> dict[str, bool]:
        """Re-read every target now; return ``{kind[:listener]: succeeded}``."""
        if not self.targets:
            self._log.info("reload_ok trigger={trigger} nothing to reload "
                          "(no password_file, acl_file or TLS listener)", trigger=trigger)
            return {}
        results: dict[str, bool] = {}
        for target in self.targets:
            name = target.kind if target.listener is None else f"{target.kind}:{target.listener}"
            head = {"kind": target.kind}
            if target.listener is not None:
                head["listener"] = target.listener
            try:
                details = target.reload()
            except (ValueError, OSError) as exc:  # the errors a bad or missing file raises
                line, reason = _why(exc)
                event = {**head, "file": target.file, "line": line, "reason": reason, "kept": "previous"}
                self._log.error("reload_failed {fields}", fields=_fields(event), **event)
                results[name] = False
            except Exception:  # noqa: BLE001 - a bug in one target must not stop the others or the node
                self._log.failure("reload_failed {fields}", fields=_fields(
                    {**head, "file": target.file, "reason": "internal error", "kept": "previous"}))
                results[name] = False
            else:
                event = {**head, "file": target.file, **details}
                self._log.info("reload_ok {fields}", fields=_fields(event), **event)
                results[name] = True
        return results


def security_targets(password_file: Any, acl: Any, tls_contexts: list[tuple[str, Any]]) -> list[ReloadTarget]:
    """The targets of a node: its password file (or None), its ACL (if configured), each TLS listener's context.

    *password_file* is a ``PasswordFile``, *acl* an ``ACL``, *tls_contexts*
    ``(listener name, ServerContextFactory)`` pairs; each has a ``reload()``.
    """
    targets: list[ReloadTarget] = []
    if password_file is not None and password_file.path:
        def passwords() -> dict[str, Any]:
            password_file.reload()
            return {"users": len(password_file)}
        targets.append(ReloadTarget("passwords", password_file.path, passwords))
    if acl is not None and acl.configured and acl.path:
        def rules() -> dict[str, Any]:
            acl.reload()
            return acl.stats()
        targets.append(ReloadTarget("acl", acl.path, rules))
    for listener, context in tls_contexts:
        def certificates(context=context) -> dict[str, Any]:
            details = dict(context.reload())
            details.pop("file", None)  # already in the line
            return details
        targets.append(ReloadTarget("tls", context.cert, certificates, listener))
    return targets
