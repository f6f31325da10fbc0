"""The admin calls a proxy answers over RPC, for the ``admin`` role: its clients, one client, a kick.

Registered on the proxy's RPC dispatcher (``register(dispatcher)``; handlers are
``handler(protocol, body) -> bytes``, bodies msgpack maps):

- ``admin.clients`` ``{"after": client id or null, "limit": n, "connected": bool or null, "like": text or
  null}`` -> ``{"items": [Client, ...]}``: this proxy's clients in client-id order, those after ``after``,
  at most ``limit`` (1-1001);
- ``admin.client`` ``{"client_id"}`` -> ``{"client": Client or null}``;
- ``admin.kick`` ``{"client_id"}`` -> ``{"found": bool, "kicked": bool}`` (kicked: it was connected);
- ``admin.session`` ``{"client_id"}`` -> ``{"session": Session or null}`` (with its subscriptions);
- ``admin.end_session`` ``{"client_id"}`` -> ``{"found": bool}`` once the session is kicked and forgotten.

``Client`` and ``Session`` are the openapi.json schemas of those names, read through ``NodeView``. A malformed body is
answered with ``invalid_argument`` (``store.api.InvalidArgument``).
"""

from __future__ import annotations

import heapq

import msgpack

from store import api

MAX_ITEMS = 1001
"""Most clients one ``admin.clients`` answer carries (the API's largest page and one to tell there are more)."""


def _body(body: bytes) -> dict:
    try:
        value = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - any malformed body is the caller's fault
        raise api.InvalidArgument(f"body is not msgpack: {exc}") from None
    if not isinstance(value, dict):
        raise api.InvalidArgument("body must be a map")
    return value


def _optional(body: dict, name: str, kind):
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise api.InvalidArgument(f"field {name!r} has the wrong type")
    return value


class MemberCalls:
    """``MemberCalls(view)``: the admin calls over a ``cluster.admin.view.NodeView`` of this proxy."""

    def __init__(self, view) -> None:
        self.view = view

    def register(self, dispatcher) -> None:
        dispatcher.register("admin.clients", self._clients)
        dispatcher.register("admin.client", self._client)
        dispatcher.register("admin.kick", self._kick)
        dispatcher.register("admin.session", self._session_detail)
        dispatcher.register("admin.end_session", self._end_session)

    def clients(self, after: str | None, limit: int, connected: bool | None = None, like: str | None = None) -> list:
        """This proxy's clients after ``after`` in client-id order, at most ``limit``: the ids are filtered and the
        ``limit`` smallest picked (O(n log limit)); rows are made for those alone."""
        ids = (cid for cid in self.view.client_ids()
               if (after is None or cid > after) and (not like or like in cid))
        if connected is not None:
            ids = (cid for cid in ids if self.view.is_connected(cid) == connected)
        rows = (self.view.session(cid) for cid in heapq.nsmallest(limit, ids))
        return [self.view.client(session) for session in rows if session is not None]

    def _clients(self, protocol, body: bytes) -> bytes:
        request = _body(body)
        limit = _optional(request, "limit", int) or MAX_ITEMS
        if not 1 <= limit <= MAX_ITEMS:
            raise api.InvalidArgument(f"limit must be 1 to {MAX_ITEMS}")
        items = self.clients(_optional(request, "after", str), limit, _optional(request, "connected", bool),
                             _optional(request, "like", str))
        return msgpack.packb({"items": items})

    def _session(self, body: bytes):
        client_id = _optional(_body(body), "client_id", str)
        if client_id is None:
            raise api.InvalidArgument("field 'client_id' missing")
        return self.view.session(client_id)

    def _client(self, protocol, body: bytes) -> bytes:
        session = self._session(body)
        return msgpack.packb({"client": self.view.client(session) if session is not None else None})

    def _kick(self, protocol, body: bytes) -> bytes:
        session = self._session(body)
        if session is None:
            return msgpack.packb({"found": False, "kicked": False})
        return msgpack.packb({"found": True, "kicked": self.view.kick(session)})

    def _session_detail(self, protocol, body: bytes) -> bytes:
        session = self._session(body)
        return msgpack.packb({"session": self.view.session_detail(session) if session is not None else None})

    def _end_session(self, protocol, body: bytes):
        session = self._session(body)
        if session is None:
            return msgpack.packb({"found": False})
        return self.view.end_session(session).addCallback(lambda _: msgpack.packb({"found": True}))
