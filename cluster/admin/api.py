"""The admin API as a Twisted Web resource: auth, routing by the OpenAPI table, paging, JSON errors.

Every request under ``/api/v1/`` is matched against the route table
(``cluster.admin.routes``) and handed to the handler its ``operationId`` names,
with the path parameters (percent-decoded), the typed query parameters and the
JSON body. A handler returns a value or a Deferred; a list answer is paged here
(``?limit=N&cursor=C`` -> ``{"items": [...], "next": C or null}``, cut on the
route's ``x-page-key``). Any failure becomes an HTTP status and
``{"code": ..., "message": ...}``.

Auth: with ``[admin] token`` set, every request needs ``Authorization: Bearer
TOKEN``; without one, only a listener bound to a loopback address serves the API.
A request with a body is checked from its headers before the body is read
(``refusal``, asked by ``cluster.runtime.http_bounds``).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import logging
from urllib.parse import unquote

from twisted.internet import defer
from twisted.python.failure import Failure
from twisted.web import resource, server

from cluster.runtime.http_bounds import Refusal
from cluster.admin.routes import Route, match

log = logging.getLogger("twistmq.admin")

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
MAX_BODY = 1 << 20


class ApiError(Exception):
    """An answer other than success: HTTP ``status`` and the body ``{"code": code, "message": message}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", what)


def bind_handlers(table: list[Route], handlers) -> dict[str, object]:
    """operationId -> bound handler; a row without a handler is a programming error, raised at build time."""
    bound = {}
    for route in table:
        if route.segments:
            fn = getattr(handlers, route.operation_id, None)
            if fn is None:
                raise LookupError(f"openapi.json names {route.operation_id!r}: no such handler")
            bound[route.operation_id] = fn
    return bound


def _loopback(request) -> bool:
    try:
        return ipaddress.ip_address(request.getHost().host).is_loopback
    except (AttributeError, ValueError):
        return False  # a UNIX socket or an unknown transport: not a loopback listener we know of


def _cursor_text(cursor: str) -> str:
    try:
        raw = cursor.encode("ascii") + b"=" * (-len(cursor) % 4)
        return base64.b64decode(raw, altchars=b"-_", validate=True).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        raise ApiError(400, "bad_request", f"cursor {cursor[:64]!r} is not one this server gave") from None


def cursor_key(cursor: str, key: str | tuple[str, ...]):
    """The key a cursor names: a string for a one-field page key, a tuple of strings for a composite one."""
    text = _cursor_text(cursor)
    if isinstance(key, str):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or len(value) != len(key) or not all(isinstance(v, str) for v in value):
        raise ApiError(400, "bad_request", f"cursor {cursor[:64]!r} is not one this server gave")
    return tuple(value)


def _make_cursor(key) -> str:
    text = json.dumps(list(key), separators=(",", ":")) if isinstance(key, tuple) else str(key)
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def item_key(item: dict, key: str | tuple[str, ...]):
    """``item``'s place in the paging order: ``str(item[key])``, or the tuple of them for a composite key."""
    if isinstance(key, str):
        return str(item[key])
    return tuple(str(item[k]) for k in key)


def page(items: list[dict], key: str | tuple[str, ...], limit: int, cursor: str | None) -> dict:
    """One page of *items* ordered by ``item[key]`` (a tuple of fields: by each in turn), after the cursor's key."""
    items = sorted(items, key=lambda item: item_key(item, key))
    if cursor is not None:
        after = cursor_key(cursor, key)
        items = [item for item in items if item_key(item, key) > after]
    chunk = items[:limit]
    more = len(items) > limit
    return {"items": chunk, "next": _make_cursor(item_key(chunk[-1], key)) if more and chunk else None}


def _typed(name: str, kind: str, raw: str):
    if kind == "boolean":
        if raw in ("true", "1"):
            return True
        if raw in ("false", "0"):
            return False
        raise ApiError(400, "bad_request", f"{name} must be true or false, not {raw[:64]!r}")
    if kind == "integer":
        try:
            return int(raw)
        except ValueError:
            raise ApiError(400, "bad_request", f"{name} must be an integer, not {raw[:64]!r}") from None
    return raw


class AdminAPI(resource.Resource):
    """``/api/...``: routes the request to its handler (see the module doc)."""

    isLeaf = True

    def __init__(self, table: list[Route], handlers, token: str = "", max_body: int = MAX_BODY) -> None:
        super().__init__()
        self.table = [r for r in table if r.segments]
        self.handlers = bind_handlers(self.table, handlers)
        self.token = token.encode("utf-8") if token else b""
        self.max_body = max_body

    def refusal(self, request) -> Refusal | None:
        """The 401/403 a request would get, decided from its headers alone (before its body is read)."""
        try:
            self._authorize(request)
        except ApiError as err:
            headers = {"WWW-Authenticate": 'Bearer realm="twistmq"'} if err.status == 401 else {}
            return Refusal(err.status, err.code, err.message, headers)
        return None

    def render(self, request):
        try:
            route, params, query, body = self._route(request)
            result = self.handlers[route.operation_id](params=params, query=query, body=body)
        except Exception:  # noqa: BLE001 - every failure gets the error shape
            self._fail(request, Failure())
            return server.NOT_DONE_YET
        d = result if isinstance(result, defer.Deferred) else defer.succeed(result)
        d.addCallback(self._paged, route, query)
        d.addCallbacks(lambda value: self._send(request, route.status, value), lambda f: self._fail(request, f))
        return server.NOT_DONE_YET

    def _route(self, request):
        self._authorize(request)
        raw = request.path.decode("latin-1").split("?", 1)[0]
        parts = raw.split("/")[3:]  # "", "api", "v1", ...
        if raw.split("/")[1:3] != ["api", "v1"] or not parts:
            raise not_found(f"no route {raw[:200]}")
        segments = [unquote(p, errors="strict") for p in parts]
        method = request.method.decode("ascii", "replace")
        route, params, known = match(self.table, method, segments)
        if route is None:
            if known:
                raise ApiError(405, "method_not_allowed", f"{method} is not served on {raw[:200]}")
            raise not_found(f"no route {raw[:200]}")
        query = {}
        kinds = dict(route.query)
        for name, values in request.args.items():
            key = name.decode("utf-8", "replace")
            if key not in kinds:
                raise ApiError(400, "bad_request", f"unknown query parameter {key[:64]!r}")
            query[key] = _typed(key, kinds[key], values[-1].decode("utf-8", "replace"))
        body = None
        if route.body_schema is not None:
            data = request.content.read(self.max_body + 1) if request.content is not None else b""
            if len(data) > self.max_body:
                raise ApiError(413, "too_large", f"the body exceeds {self.max_body} bytes")
            try:
                body = json.loads(data)
            except ValueError as exc:
                raise ApiError(400, "bad_json", f"the body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise ApiError(400, "bad_request", "the body must be a JSON object")
        return route, params, query, body

    def _authorize(self, request) -> None:
        if self.token:
            given = request.getHeader(b"authorization") or b""
            if not hmac.compare_digest(given, b"Bearer " + self.token):
                request.setHeader(b"www-authenticate", b'Bearer realm="twistmq"')
                raise ApiError(401, "unauthorized", "a bearer token is required (Authorization: Bearer TOKEN)")
        elif not _loopback(request):
            raise ApiError(403, "forbidden", "no [admin] token is set: the API is served on loopback listeners only")

    @staticmethod
    def _paged(value, route: Route, query: dict):
        if route.page_key is None:
            return value
        limit = query.pop("limit", DEFAULT_LIMIT)
        if not 1 <= limit <= MAX_LIMIT:
            raise ApiError(400, "bad_request", f"limit must be 1 to {MAX_LIMIT}, not {limit}")
        return page(value, route.page_key, limit, query.pop("cursor", None))

    @staticmethod
    def _send(request, status: int, value) -> None:
        if request.finished or getattr(request, "_disconnected", False):
            return
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        request.write(json.dumps(value, separators=(",", ":")).encode("utf-8"))
        request.finish()

    def _fail(self, request, failure: Failure) -> None:
        if failure.check(ApiError):
            err = failure.value
        else:
            log.error("admin_api_failed path=%s error=%s", request.path[:200], failure.getTraceback())
            err = ApiError(500, "internal", failure.getErrorMessage()[:200] or failure.type.__name__)
        self._send(request, err.status, {"code": err.code, "message": err.message})
