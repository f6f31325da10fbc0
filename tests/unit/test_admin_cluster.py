"""The admin role's API without sockets: clients of several proxies paged in (proxy, client id) order through
the proxies' admin calls (msgpack bodies, as over RPC), show and kick on any proxy, the members row, and the
role's config checks."""

from __future__ import annotations

import io
import json

import msgpack
import pytest
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.web.test.requesthelper import DummyRequest

from cluster.admin.api import AdminAPI, ApiError, page
from cluster.admin.cluster_handlers import ClusterHandlers
from cluster.admin.member_calls import MemberCalls
from cluster.admin.routes import routes, served_by
from cluster.roles.admin import AdminOptions, admin_config
from store.config import ConfigError


class _Session:
    def __init__(self, client_id: str, connected: bool) -> None:
        self.client_id, self.connected = client_id, connected


class _View:
    """A proxy's NodeView stand-in: its sessions, as the API rows the view would make."""

    def __init__(self, member_id: str, sessions: dict[str, bool]) -> None:
        self.member_id = member_id
        self.sessions = {cid: _Session(cid, c) for cid, c in sessions.items()}
        self.kicked: list[str] = []

    def client(self, s):
        return {"client_id": s.client_id, "connected": s.connected, "proxy": self.member_id, "protocol_level": 4,
                "subscriptions": 0, "inflight": 0, "username": None, "peer": None}

    def client_ids(self):
        return list(self.sessions)

    def is_connected(self, client_id):
        return self.sessions[client_id].connected

    def session(self, client_id):
        return self.sessions.get(client_id)

    def kick(self, s):
        self.kicked.append(s.client_id)
        return s.connected

    def session_detail(self, s):
        return dict(self.client(s), subscriptions=[], expiry=0, persistent=True, queued=0)

    def end_session(self, s):
        self.kick(s)
        del self.sessions[s.client_id]
        return defer.succeed(None)


class _Dispatcher:
    def __init__(self) -> None:
        self.handlers = {}

    def register(self, name, handler):
        self.handlers[name] = handler


def _cluster(views: dict[str, _View], down=(), stored=None):
    """ClusterHandlers over proxies answering through MemberCalls, bodies packed as over RPC; ``down`` fail;
    ``stored``: the brokers' stored sessions (an exception: a broker that does not answer)."""
    dispatchers = {}
    for node_id, view in views.items():
        dispatchers[node_id] = _Dispatcher()
        MemberCalls(view).register(dispatchers[node_id])
    calls = []

    def call(node_id, request_type, body):
        calls.append((node_id, request_type, body))
        if node_id in down:
            return defer.fail(ConnectionError(f"{node_id} is down"))
        handler = dispatchers[node_id].handlers[request_type]  # may answer later, as the RPC dispatcher allows
        return defer.maybeDeferred(handler, None, msgpack.packb(body)).addCallback(msgpack.unpackb, raw=False)

    members = [{"node_id": n, "node_type": "proxy", "joined": True, "rpc_address": "tcp:127.0.0.1:1",
                "active": True, "healthy": True} for n in views]
    def from_brokers():
        if isinstance(stored, Exception):
            return defer.fail(stored)
        return defer.succeed(list(stored or ()))

    handlers = ClusterHandlers(lambda: members, lambda: [], call, from_brokers if stored is not None else None)
    return AdminAPI(served_by(routes(), "admin"), handlers), calls


def _get(api, path, query=None, method="GET"):
    request = DummyRequest(path.strip("/").split("/"))
    request.path, request.method, request.content = path.encode(), method.encode(), io.BytesIO(b"")
    request.getHost = lambda: IPv4Address("TCP", "127.0.0.1", 8080)
    for k, v in (query or {}).items():
        request.addArg(k.encode(), v.encode())
    api.render(request)
    assert request.finished
    return request.responseCode, json.loads(b"".join(request.written))


def _walk(api, limit, extra=None, path="/api/v1/clients"):
    seen, cursor = [], None
    for _ in range(100):
        query = {"limit": str(limit), **(extra or {})}
        if cursor:
            query["cursor"] = cursor
        status, answer = _get(api, path, query)
        assert status == 200, answer
        assert len(answer["items"]) <= limit
        seen += [(c["proxy"], c["client_id"]) for c in answer["items"]]
        cursor = answer["next"]
        if cursor is None:
            return seen
    raise AssertionError("paging did not end")


@pytest.fixture
def views():
    return {"proxy-b": _View("proxy-b", {f"c{i:02d}": i % 3 != 0 for i in range(0, 20, 2)}),
            "proxy-a": _View("proxy-a", {f"c{i:02d}": True for i in range(1, 20, 2)}),
            "proxy-c": _View("proxy-c", {"c05": False})}  # the same client id as on proxy-a: listed under each


def test_clients_of_every_proxy_page_once_in_proxy_then_client_order(views):
    """Whatever the limit, the pages cover every client of every proxy once, ordered by (proxy, client id)."""
    api, calls = _cluster(views)
    want = sorted((p, cid) for p, v in views.items() for cid in v.sessions)
    for limit in (1, 2, 3, 7, 10, 21, 1000):
        assert _walk(api, limit) == want, limit
    connected = sorted((p, cid) for p, v in views.items() for cid, s in v.sessions.items() if s.connected)
    assert _walk(api, 4, {"connected": "true"}) == connected


def test_a_page_asks_only_the_proxies_at_or_after_the_cursor(views):
    """Each proxy is asked for one page past the cursor's position in it; proxies before the cursor's are skipped."""
    api, calls = _cluster(views)
    first = _get(api, "/api/v1/clients", {"limit": "12"})[1]
    assert first["items"][-1]["proxy"] == "proxy-b"
    calls.clear()
    _get(api, "/api/v1/clients", {"limit": "12", "cursor": first["next"]})
    assert [(n, b["after"], b["limit"]) for n, _t, b in calls] == [("proxy-b", "c02", 13), ("proxy-c", None, 13)]


def test_a_silent_proxy_fails_the_list_instead_of_leaving_a_gap(views):
    """A proxy that does not answer: 503 naming it, not a page without its clients."""
    api, _calls = _cluster(views, down=("proxy-b",))
    status, answer = _get(api, "/api/v1/clients")
    assert status == 503 and answer["code"] == "unavailable" and "proxy-b" in answer["message"]


def test_show_prefers_the_connected_holder_and_kick_reaches_every_proxy(views):
    """GET clients/{id} answers the proxy where it is connected; DELETE kicks it wherever it is held; an id no
    proxy holds is 404."""
    api, _calls = _cluster(views)
    status, row = _get(api, "/api/v1/clients/c05")
    assert status == 200 and row["proxy"] == "proxy-a" and row["connected"]
    status, answer = _get(api, "/api/v1/clients/c05", method="DELETE")
    assert (status, answer) == (200, {"client_id": "c05", "kicked": True})
    assert views["proxy-a"].kicked == ["c05"] and views["proxy-c"].kicked == ["c05"]
    assert _get(api, "/api/v1/clients/nobody")[0] == 404
    assert _get(api, "/api/v1/clients/nobody", method="DELETE")[0] == 404


def _stored(client_id, holder, epoch, subscriptions=("a/#",), inflight=0):
    return {"client_id": client_id, "holder": holder, "protocol_level": 4, "subscriptions": list(subscriptions),
            "inflight": inflight, "epoch": epoch}


def test_sessions_add_the_stored_ones_no_live_proxy_holds(views):
    """GET sessions: the proxies' sessions, plus each stored session whose holder is not a joined proxy, once
    (its parts in every group merged: distinct subscriptions, every part's outbound messages, the last claim's
    holder), offline, under its holder; pages cover them all."""
    stored = [_stored("c01", "proxy-a", 3),  # held by a live proxy: that proxy lists it
              _stored("gone-1", "proxy-dead", 2, ("a/#", "+/x"), 1),  # its parts in two groups
              _stored("gone-1", "proxy-dead", 5, ("b/#", "+/x"), 2),
              _stored("gone-2", "proxy-dead", 1), _stored("gone-2", "proxy-older", 0),
              _stored("never", "", 0)]
    api, _calls = _cluster(views, stored=stored)
    want = sorted([(p, cid) for p, v in views.items() for cid in v.sessions]
                  + [("proxy-dead", "gone-1"), ("proxy-dead", "gone-2"), ("", "never")])
    for limit in (1, 3, 8, 1000):
        assert _walk(api, limit, path="/api/v1/sessions") == want, limit
    status, answer = _get(api, "/api/v1/sessions", {"like": "gone"})
    assert status == 200 and [(r["proxy"], r["client_id"], r["connected"], r["subscriptions"])
                              for r in answer["items"]] == [("proxy-dead", "gone-1", False, 3),
                                                            ("proxy-dead", "gone-2", False, 1)]
    assert _get(api, "/api/v1/sessions", {"like": "gone-1"})[1]["items"][0]["inflight"] == 3
    assert ("", "never") not in _walk(api, 5, {"connected": "true"}, path="/api/v1/sessions")
    api, _calls = _cluster(views, stored=ConnectionError("broker-g2 is down"))
    status, answer = _get(api, "/api/v1/sessions")
    assert status == 503 and "broker-g2 is down" in answer["message"]


def test_before_the_first_metadata_every_route_is_503(views):
    """Until the admin process has read the controllers' metadata it lists nothing rather than an empty
    cluster."""
    handlers = ClusterHandlers(lambda: None, lambda: [], None)
    api = AdminAPI(served_by(routes(), "admin"), handlers)
    for path in ("/api/v1/clients", "/api/v1/sessions", "/api/v1/cluster/members", "/api/v1/clients/x"):
        status, answer = _get(api, path)
        assert status == 503 and answer["code"] == "unavailable", path


def test_session_show_and_delete_reach_the_proxy_holding_it(views):
    """GET sessions/{id} answers the holding proxy's detail (connected there first); DELETE ends it on every
    live proxy holding it; an id no live proxy holds is 404 both ways."""
    api, _calls = _cluster(views)
    status, detail = _get(api, "/api/v1/sessions/c05")
    assert status == 200 and detail["proxy"] == "proxy-a" and detail["persistent"]
    status, answer = _get(api, "/api/v1/sessions/c05", method="DELETE")
    assert (status, answer) == (200, {"client_id": "c05", "deleted": True})
    assert "c05" not in views["proxy-a"].sessions and "c05" not in views["proxy-c"].sessions
    assert _get(api, "/api/v1/sessions/c05")[0] == 404
    assert _get(api, "/api/v1/sessions/c05", method="DELETE")[0] == 404


def test_composite_cursors_are_checked():
    """A cursor that does not name a (proxy, client id) pair is a 400, never a wrong page."""
    items = [{"proxy": "p", "client_id": "a"}]
    for bad in ("%%%", "bm90LWpzb24", "WyJvbmx5LW9uZSJd"):  # not base64, not JSON, a one-item list
        with pytest.raises(ApiError) as err:
            page(items, ("proxy", "client_id"), 5, bad)
        assert err.value.status == 400


def test_the_admin_role_needs_controllers_and_a_named_http_interface(tmp_path):
    """Without [cluster] controllers it refuses to start (nobody to ask); a bare tcp:PORT HTTP listener too."""
    config = tmp_path / "twistmq.toml"
    config.write_text("[cluster]\ncluster_id = \"c\"\n")
    options = AdminOptions()
    options.parseOptions(["--config", str(config), "--http", "tcp:0:interface=127.0.0.1"])
    with pytest.raises(ConfigError, match="controllers"):
        admin_config(options)
    config.write_text("[cluster]\ncontrollers = [\"tcp:127.0.0.1:7910\"]\n")
    options = AdminOptions()
    options.parseOptions(["--config", str(config), "--http", "tcp:8070"])
    with pytest.raises(ConfigError, match="interface"):
        admin_config(options)
    options = AdminOptions()
    options.parseOptions(["--config", str(config), "--http", "tcp:0:interface=127.0.0.1", "--node-id", "adm"])
    cfg = admin_config(options)
    assert cfg.cluster.node_id == "adm" and [listener.key for listener in cfg.listeners] == ["http"]
