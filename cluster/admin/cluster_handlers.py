"""The admin routes the ``admin`` role serves for the whole cluster, gathered from the other processes.

It holds no state: members come from the controllers' metadata (as its member agent last read it;
``members()`` is None until it has read one, and every route answers 503 until then),
clients from every joined proxy over RPC (``cluster.admin.member_calls``), and the sessions no live
proxy holds (their proxy died or left) from the broker groups. The role passes in ``members()`` (the
metadata's member records), ``controllers()`` (the controllers as ``Member`` rows), ``call(node_id,
request_type, body) -> Deferred[dict]`` and ``stored() -> Deferred[list]`` (each broker's stored
sessions as ``{"client_id", "holder", "protocol_level", "subscriptions": [keys], "inflight", "epoch"}``):
msgpack, the store codec and the RPC connections are the role's business (admin imports no rpc).

``GET clients`` pages in (proxy, client id) order (``x-page-key`` of openapi.json): each proxy at or
after the cursor's proxy is asked for at most limit + 1 clients after the cursor's position in it, and
the API cuts the merged list, so a page costs one call per proxy whatever the cluster's size. A proxy
that does not answer fails the list (503 naming it) rather than leave a gap in it.

``GET sessions`` is the proxies' sessions (as ``GET clients``) plus, offline, every session the broker
groups store whose holder is not a joined proxy, listed under that holder's id (empty: never claimed),
in the same order; a session is stored in parts (its meta in every group, each subscription in the
groups its filter spans, outbound messages in the group of their position), listed once: the distinct
subscriptions, the outbound messages of every part, the holder of the part claimed last. The stored
sessions are read whole from each broker for every page.
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
    """``cluster/members``, ``clients`` (list, show, kick) and ``sessions`` (list, show, delete) of the admin role."""

    def __init__(self, members, controllers, call, stored=None) -> None:
        self.members = members
        self.controllers = controllers
        self.call = call
        self.stored = stored

    def _members(self) -> list[dict]:
        members = self.members()
        if members is None:  # an answer now would leave out every proxy: not an empty cluster
            raise ApiError(503, "unavailable", "no metadata from the controllers yet (starting, or none reachable "
                           "since this process started); try again")
        return members

    def _proxies(self) -> list[str]:
        return sorted(r["node_id"] for r in self._members()
                      if r.get("node_type") == "proxy" and r.get("joined") and r.get("rpc_address"))

    def list_members(self, params, query, body):
        return self.controllers() + [member_row(r) for r in self._members()]

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
        live = self.list_clients(params, query, body)
        if self.stored is None or query.get("connected") is True:
            return live
        after = cursor_key(query["cursor"], CLIENT_KEY) if query.get("cursor") is not None else None
        held = set(self._proxies())
        like = query.get("like")

        def orphans(states, rows):
            merged: dict[str, dict] = {}  # client id -> its copies merged: each group holds part of a session
            for st in states:
                cid = st["client_id"]
                if like and like not in cid:
                    continue
                have = merged.setdefault(cid, {"holder": st["holder"], "epoch": st["epoch"], "subscriptions": set(),
                                               "inflight": 0, "protocol_level": st["protocol_level"]})
                if st["epoch"] > have["epoch"]:
                    have.update(holder=st["holder"], epoch=st["epoch"])
                have["subscriptions"].update(st["subscriptions"])
                have["inflight"] += st["inflight"]
            extra = [{"client_id": cid, "connected": False, "proxy": m["holder"], "protocol_level": m["protocol_level"],
                      "subscriptions": len(m["subscriptions"]), "inflight": m["inflight"], "username": None,
                      "peer": None} for cid, m in merged.items() if m["holder"] not in held]
            return rows + [r for r in extra if after is None or (r["proxy"], r["client_id"]) > after]

        def unavailable(failure):
            raise ApiError(503, "unavailable", f"a broker did not list its sessions ({failure.getErrorMessage()}): "
                           "the list would have gaps; try again")

        return live.addCallback(lambda rows: self.stored().addCallback(orphans, rows).addErrback(unavailable))

    def _ask_all(self, request_type: str, client_id: str) -> defer.Deferred:
        return _gathered([(p, self.call(p, request_type, {"client_id": client_id})) for p in self._proxies()])

    def _held(self, request_type: str, field: str, client_id: str, what: str) -> defer.Deferred:
        """Each proxy's ``field`` answer for ``client_id``: the one where it is connected first, else any; 404 if
        no proxy holds it, 503 if none that answered does and some did not answer."""
        def found(answers):
            held = [dict(a[field], proxy=p) for p, a in answers if a is not None and a.get(field)]
            if not held:
                down = [p for p, a in answers if a is None]
                if down:
                    raise ApiError(503, "unavailable", f"no answering proxy holds {client_id!r}; proxies "
                                   f"{', '.join(down)} did not answer")
                raise not_found(f"no {what} {client_id!r}")
            return next((c for c in held if c["connected"]), held[0])

        return self._ask_all(request_type, client_id).addCallback(found)

    def get_client(self, params, query, body):
        return self._held("admin.client", "client", params["client_id"], "client")

    def kick_client(self, params, query, body):
        client_id = params["client_id"]

        def kicked(answers):
            got = [a for _, a in answers if a is not None and a.get("found")]
            if not got:
                raise not_found(f"no client {client_id!r}")
            return {"client_id": client_id, "kicked": any(a.get("kicked") for a in got)}

        return self._ask_all("admin.kick", client_id).addCallback(kicked)

    def get_session(self, params, query, body):
        """The session as the proxy holding it shows it; a session no live proxy holds is not shown (404)."""
        return self._held("admin.session", "session", params["client_id"], "session on a live proxy")

    def delete_session(self, params, query, body):
        """Kick the client and forget its session on every live proxy holding it; 404 if none does."""
        client_id = params["client_id"]

        def done(answers):
            if not any(a is not None and a.get("found") for _, a in answers):
                raise not_found(f"no session {client_id!r} on a live proxy")
            return {"client_id": client_id, "deleted": True}

        return self._ask_all("admin.end_session", client_id).addCallback(done)
