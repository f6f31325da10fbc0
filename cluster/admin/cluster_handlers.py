"""The admin routes the ``admin`` role serves for the whole cluster, gathered from the other processes.

It holds no state: members come from the controllers' metadata (as its member agent last read it),
clients from every joined proxy over RPC (``cluster.admin.member_calls``). The role passes in
``members()`` (the metadata's member records), ``controllers()`` (the controllers as ``Member`` rows)
and ``call(node_id, request_type, body) -> Deferred[dict]`` (msgpack and the RPC connection are the
role's business: admin imports no rpc).

``GET clients`` pages in (proxy, client id) order (``x-page-key`` of openapi.json): each proxy at or
after the cursor's proxy is asked for at most limit + 1 clients after the cursor's position in it, and
the API cuts the merged list, so a page costs one call per proxy whatever the cluster's size. A proxy
that does not answer fails the list (503 naming it) rather than leave a gap in it.
"""

from __future__ import annotations

from twisted.internet import defer

from cluster.admin.api import DEFAULT_LIMIT, MAX_LIMIT, ApiError, cursor_key, not_found
from cluster.admin.controller_handlers import member_row

CLIENT_KEY = ("proxy", "client_id")
"""The paging order of clients across proxies (openapi.json's x-page-key of ``GET clients``)."""


def _gathered(calls: list[tuple[str, defer.Deferred]]) -> defer.Deferred:
    """Fires with [(node id, answer or None)], None where the call failed."""
    ids = [node_id for node_id, _ in calls]
    d = defer.DeferredList([d for _, d in calls], consumeErrors=True)
    return d.addCallback(lambda results: [(node_id, value if ok else None) for node_id, (ok, value)
                                          in zip(ids, results)])


class ClusterHandlers:
    """``cluster/members``, ``clients`` (list, show, kick) and ``sessions`` (list) of the admin role."""

    def __init__(self, members, controllers, call) -> None:
        self.members = members
        self.controllers = controllers
        self.call = call

    def _proxies(self) -> list[str]:
        return sorted(r["node_id"] for r in self.members()
                      if r.get("node_type") == "proxy" and r.get("joined") and r.get("rpc_address"))

    def list_members(self, params, query, body):
        return self.controllers() + [member_row(r) for r in self.members()]

    def list_clients(self, params, query, body):
        limit = query.get("limit", DEFAULT_LIMIT)
        want = min(max(limit, 1), MAX_LIMIT) + 1  # one more than a page: the API tells whether more follow
        after = cursor_key(query["cursor"], CLIENT_KEY) if query.get("cursor") is not None else None
        calls = []
        for proxy in self._proxies():
            if after is not None and proxy < after[0]:
                continue  # every client of this proxy is on an earlier page
            start = after[1] if after is not None and proxy == after[0] else None
            request = {"after": start, "limit": want, "connected": query.get("connected"), "like": query.get("like")}
            calls.append((proxy, self.call(proxy, "admin.clients", request)))

        def merged(answers):
            down = [proxy for proxy, answer in answers if answer is None]
            if down:
                raise ApiError(503, "unavailable", f"proxies {', '.join(down)} did not answer: the list would have "
                               "gaps; try again")
            return [dict(item, proxy=proxy) for proxy, answer in answers for item in answer["items"]]

        return _gathered(calls).addCallback(merged)

    def list_sessions(self, params, query, body):
        return self.list_clients(params, query, body)

    def _ask_all(self, request_type: str, client_id: str) -> defer.Deferred:
        return _gathered([(p, self.call(p, request_type, {"client_id": client_id})) for p in self._proxies()])

    def get_client(self, params, query, body):
        client_id = params["client_id"]

        def found(answers):
            held = [dict(a["client"], proxy=p) for p, a in answers if a is not None and a.get("client")]
            if not held:
                down = [p for p, a in answers if a is None]
                if down:
                    raise ApiError(503, "unavailable", f"no answering proxy holds {client_id!r}; proxies "
                                   f"{', '.join(down)} did not answer")
                raise not_found(f"no client {client_id!r}")
            return next((c for c in held if c["connected"]), held[0])

        return self._ask_all("admin.client", client_id).addCallback(found)

    def kick_client(self, params, query, body):
        client_id = params["client_id"]

        def kicked(answers):
            got = [a for _, a in answers if a is not None and a.get("found")]
            if not got:
                raise not_found(f"no client {client_id!r}")
            return {"client_id": client_id, "kicked": any(a.get("kicked") for a in got)}

        return self._ask_all("admin.kick", client_id).addCallback(kicked)
