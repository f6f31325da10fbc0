"""The ``[admin]`` section: who may use the admin API and how this process names itself in it."""

from __future__ import annotations

from dataclasses import dataclass

from store.config import ConfigError


@dataclass(frozen=True)
class AdminConfig:
    """The ``[admin]`` section: the admin HTTP API (``/api/v1/``) and dashboard (``/dashboard/``) on the http listeners."""

    token: str = ""
    """Bearer token the admin API requires (``Authorization: Bearer TOKEN``; ``twistmq-admin --token`` or ``TWISTMQ_ADMIN_TOKEN``). Empty: no token, and only http listeners bound to a loopback address serve the API. /health and /metrics never need it."""
    member_id: str = ""
    """This process's id in ``cluster/members`` and the ``proxy`` field of clients. Empty: ``node@HOSTNAME``."""
    dashboard: bool = True
    """Serve the dashboard at /dashboard/ (static files; the page reads the API, so the same auth applies)."""
    max_body_bytes: int = 1_048_576
    """Largest HTTP request body; a larger ``Content-Length`` (or chunked body) is answered 413 and the connection closed before the rest is read."""
    request_timeout_s: float = 30.0
    """Seconds an HTTP request has to arrive whole (request line, headers and body) before it is answered 408 and the connection closed; the idle timeout restarts with every byte, this does not."""

    def validate(self) -> None:
        if self.max_body_bytes <= 0:
            raise ConfigError("max_body_bytes must be positive")
        if self.request_timeout_s <= 0:
            raise ConfigError("request_timeout_s must be positive")
        if self.token != self.token.strip() or any(ch in self.token for ch in "\r\n"):
            raise ConfigError("token must not have surrounding spaces or line breaks")
