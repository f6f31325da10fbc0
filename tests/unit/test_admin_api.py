"""The admin API framework without sockets: the OpenAPI route table, handler binding, paging, auth, errors;
the metrics' histograms and msg/s history on a task.Clock; the twistmq-admin command grammar."""

from __future__ import annotations

import io
import json

import pytest
from twisted.internet import defer, task
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.web.test.requesthelper import DummyRequest

from cluster.admin.broker_handlers import BrokerHandlers
from cluster.admin import commands
from cluster.admin.api import AdminAPI, ApiError, page
from cluster.admin.cluster_handlers import ClusterHandlers
from cluster.admin.controller_handlers import ControllerHandlers
from cluster.admin.handlers import Handlers
from cluster.admin.main import build_parser
from cluster.admin.metrics import Histogram, RateHistory
from cluster.admin.routes import load_spec, match, routes, served_by
from cluster.controller.config import ControllerConfig
from cluster.runtime.http import http_site


def _public_methods(cls) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_") and callable(getattr(cls, name))}


def test_every_operation_has_a_handler_and_every_handler_an_operation():
    """The server's routes are the file's: no handler the file lacks, no operation without a handler (a node's
    Handlers for the rows a node serves, a controller's for the rows whose x-roles name controller)."""
    api_ops = {r.operation_id for r in served_by(routes(), "node") if r.segments}
    assert api_ops == _public_methods(Handlers)
    controller_ops = {r.operation_id for r in served_by(routes(), "controller") if r.segments}
    assert controller_ops == _public_methods(ControllerHandlers)
    assert controller_ops == {"list_members", "elect_leader", "get_controller_metadata", "get_sync_state_set",
                              "elect_master"}
    broker_ops = {r.operation_id for r in served_by(routes(), "broker") if r.segments}
    assert broker_ops == _public_methods(BrokerHandlers) == {"get_broker_epoch"}
    admin_ops = {r.operation_id for r in served_by(routes(), "admin") if r.segments}
    assert admin_ops == _public_methods(ClusterHandlers)
    assert admin_ops == {"list_members", "list_clients", "get_client", "kick_client", "list_sessions", "get_session",
                         "delete_session"}


def test_the_site_serves_nothing_the_file_lacks():
    """Top-level resources are /health and /metrics (both in the file), /api (the table) and the static dashboard."""
    spec = load_spec()

    class Front:
        stats = None
        sessions = {}

    site = http_site(Front(), store=None, api=AdminAPI(routes(), _StubHandlers()), dashboard_dir="/nonexistent")
    children = {name.decode() for name in site.resource.children}
    assert children == {"health", "metrics", "api", "dashboard"}
    for name in ("health", "metrics"):
        assert "/" + name in spec["paths"]
    assert spec["info"]["x-static"] == ["/dashboard/"]
    assert all(p.startswith("/api/v1/") for p in spec["paths"] if p not in ("/health", "/metrics"))


def test_the_cluster_routes_the_design_names_are_rows():
    """cluster/members is served now; its response has the fields DESIGN.md's contract lists."""
    table = {(r.method, r.path): r for r in routes()}
    members = table[("GET", "/api/v1/cluster/members")]
    assert members.page_key == "id"
    fields = load_spec()["components"]["schemas"]["Member"]["required"]
    assert set(fields) >= {"id", "role", "group", "active", "healthy", "leader"}


def test_match_tells_unknown_paths_from_unknown_methods():
    """A path no row has is a 404; a known path with another method a 405; parameters come back decoded."""
    table = routes()
    route, params, known = match(table, "GET", ["clients", "a/b"])
    assert route.operation_id == "get_client" and params == {"client_id": "a/b"} and known
    route, params, known = match(table, "PUT", ["clients", "x"])
    assert route is None and known
    assert match(table, "GET", ["nothing", "here"]) == (None, {}, False)


def test_paging_walks_every_item_once_in_key_order():
    """limit/cursor pages cover all items in order; the last page's next is null."""
    items = [{"id": f"c{i:03d}"} for i in range(25)]
    seen, cursor = [], None
    for _ in range(10):
        p = page(list(reversed(items)), "id", 7, cursor)
        seen += [i["id"] for i in p["items"]]
        cursor = p["next"]
        if cursor is None:
            break
    assert seen == [i["id"] for i in items]
    with pytest.raises(ApiError) as err:
        page(items, "id", 7, "%%%")
    assert err.value.status == 400


class _StubHandlers:
    """Answers for the routes these tests call (the API framework is under test, not the handlers)."""

    def list_clients(self, params, query, body):
        return [{"client_id": f"c{i}", "connected": True, "proxy": "n"} for i in range(3)]

    def get_client(self, params, query, body):
        if params["client_id"] != "known":
            raise ApiError(404, "not_found", "no client")
        return {"client_id": "known"}

    def publish(self, params, query, body):
        return defer.succeed({"echo": body})

    def __getattr__(self, name):
        return lambda params, query, body: {}


def _call(api, method, path, host="127.0.0.1", headers=None, body=b"", query=None):
    request = DummyRequest(path.strip("/").split("/"))
    request.path = path.encode()
    request.method = method.encode()
    request.content = io.BytesIO(body)
    address = IPv6Address if ":" in host else IPv4Address
    request.getHost = lambda: address("TCP", host, 8080)
    for k, v in (query or {}).items():
        request.addArg(k.encode(), v.encode())
    for k, v in (headers or {}).items():
        request.requestHeaders.setRawHeaders(k.encode(), [v.encode()])
    api.render(request)
    assert request.finished, "the API answers every request"
    return request.responseCode, json.loads(b"".join(request.written))


def test_with_a_token_every_call_needs_it():
    """[admin] token set: a missing or wrong bearer token is 401 in the error shape; the right one is served."""
    api = AdminAPI(routes(), _StubHandlers(), token="s3cret")
    assert _call(api, "GET", "/api/v1/clients")[0] == 401
    status, body = _call(api, "GET", "/api/v1/clients", headers={"Authorization": "Bearer nope"})
    assert status == 401 and body["code"] == "unauthorized" and body["message"]
    status, body = _call(api, "GET", "/api/v1/clients", host="10.1.2.3", headers={"Authorization": "Bearer s3cret"})
    assert status == 200 and len(body["items"]) == 3


def test_without_a_token_only_loopback_listeners_serve():
    """No token: a request that reached a non-loopback listener is refused with 403."""
    api = AdminAPI(routes(), _StubHandlers())
    status, body = _call(api, "GET", "/api/v1/clients", host="10.1.2.3")
    assert status == 403 and body["code"] == "forbidden"
    assert _call(api, "GET", "/api/v1/clients", host="::1")[0] == 200


def test_errors_have_the_design_shape():
    """Unknown route 404, wrong method 405, bad JSON 400, bad query 400, bad limit 400, unknown id 404."""
    api = AdminAPI(routes(), _StubHandlers())
    cases = [
        (("GET", "/api/v1/nothing"), 404, "not_found"),
        (("PUT", "/api/v1/clients/x"), 405, "method_not_allowed"),
        (("POST", "/api/v1/publish", "127.0.0.1", None, b"{not json"), 400, "bad_json"),
        (("POST", "/api/v1/publish", "127.0.0.1", None, b"[1]"), 400, "bad_request"),
        (("GET", "/api/v1/clients", "127.0.0.1", None, b"", {"connected": "maybe"}), 400, "bad_request"),
        (("GET", "/api/v1/clients", "127.0.0.1", None, b"", {"limit": "0"}), 400, "bad_request"),
        (("GET", "/api/v1/clients", "127.0.0.1", None, b"", {"colour": "red"}), 400, "bad_request"),
        (("GET", "/api/v1/clients/unknown"), 404, "not_found"),
    ]
    for args, status, code in cases:
        got, body = _call(api, *args)
        assert (got, body["code"]) == (status, code), args
        assert set(body) == {"code", "message"}
    assert _call(api, "POST", "/api/v1/publish", body=b'{"topic": "t"}') == (200, {"echo": {"topic": "t"}})


def test_a_row_without_a_handler_fails_at_build_time():
    """An operationId with no handler method is refused when the API is built, not at the first request."""
    class Missing:
        pass
    with pytest.raises(LookupError):
        AdminAPI(routes(), Missing())


def test_histogram_buckets_cumulate_and_quantiles_take_the_bucket_bound():
    """observe() lands in the first bucket whose bound is at or above the value; +Inf takes the rest."""
    h = Histogram((0.01, 0.1, 1.0))
    for v in (0.005, 0.01, 0.05, 0.5, 7.0):
        h.observe(v)
    assert h.cumulative() == [("0.01", 2), ("0.1", 3), ("1.0", 4), ("+Inf", 5)]
    assert h.count == 5 and h.sum == pytest.approx(7.565)
    assert h.quantile(0.5) == 0.1 and h.quantile(1.0) == 1.0
    assert Histogram().quantile(0.99) == 0.0


def test_rate_history_records_msg_per_second_in_and_out():
    """Each second adds a point of the counters' rate; topic rates come from their stored counts (every 10 s)."""
    clock = task.Clock()
    counts = {"in": 0, "out": 0, "dev": 0}
    history = RateHistory(clock, lambda: (counts["in"], counts["out"]), lambda: {"dev": counts["dev"]})
    history.start()
    for step in range(RateHistory.TOPIC_EVERY):
        counts["in"] += 10
        counts["out"] += 20
        counts["dev"] += 10
        clock.advance(1.0)
    history.stop()
    series = history.series()
    assert series["in"] == [10.0] * 10 and series["out"] == [20.0] * 10
    assert history.topic_rates == {"dev": 10.0}


def test_native_codec_parses_cancel_timer():
    """cancel_timer (14) needs a msg_id and no queue; without one the codec names the missing field."""
    from mqtt_proxy.native.codec import RequestError, parse_request
    from store.config import NativeConfig

    req = parse_request({"action": "cancel_timer", "msg_id": 42, "seq": 1}, NativeConfig())
    assert (req.name, req.msg_id, req.echo["seq"]) == ("cancel_timer", 42, 1)
    with pytest.raises(RequestError, match="missing field msg_id"):
        parse_request({"action": 14}, NativeConfig())


def test_admin_command_grammar():
    """Global options come before NOUN VERB; mqadmin names parse as their rows; arguments fill the path encoded."""
    parser = build_parser()
    args = parser.parse_args(["--server", "http://h:1", "--json", "clients", "kick", "a/b c"])
    assert args.server == "http://h:1" and args.json
    assert commands.request_for(args.command_row, args) == ("clients/a%2Fb%20c", {}, None)
    args = parser.parse_args(["getSyncStateSet", "g1"])
    assert commands.request_for(args.command_row, args)[0] == "cluster/groups/g1/sync-state-set"
    args = parser.parse_args(["clients", "list", "--offline", "--like", "dev"])
    assert commands.request_for(args.command_row, args)[1] == {"like": "dev", "connected": "false"}
    args = parser.parse_args(["messages", "publish", "t/1", "hi", "--qos", "1"])
    assert commands.request_for(args.command_row, args)[2] == {"topic": "t/1", "payload": "hi", "qos": 1,
                                                               "retain": False}
    with pytest.raises(SystemExit):
        parser.parse_args(["clients", "explode"])


def test_tables_for_people():
    """A list prints as aligned columns of its scalar fields; an object as key/value lines."""
    text = commands.render([{"client_id": "a", "connected": True, "subs": [1]},
                            {"client_id": "bbbb", "connected": False, "subs": []}])
    assert text.splitlines() == ["CLIENT_ID  CONNECTED", "a          yes", "bbbb       no"]
    assert commands.render({"pending": 2, "x": None}).splitlines() == ["pending  2", "x        -"]
    assert commands.render([]) == "(none)"


class _Raft:
    """A controller's RaftNode stand-in: three controllers, this one the leader; a transfer is seen at once."""

    def __init__(self, metadata) -> None:
        self.address, self.leader, self.term = "127.0.0.1:7900", "127.0.0.1:7900", 3
        self.cfg = ControllerConfig(raft=self.address, peers=("127.0.0.1:7901", "127.0.0.1:7902"))
        self.metadata = metadata

    @property
    def is_leader(self) -> bool:
        return self.leader == self.address

    def status(self) -> dict:
        return {"address": self.address, "leader": self.leader, "is_leader": self.is_leader, "term": self.term,
                "has_quorum": True, "commit_index": 9, "peers_connected": list(self.cfg.peers)}

    def read(self, fn):
        return fn(self.metadata)

    def transfer_leadership(self, target):
        self.leader = target or self.cfg.peers[0]
        return defer.succeed(None)


def test_the_cluster_commands_of_twistmq_admin_are_rows_whose_answers_fit_their_schemas():
    """cluster members, cluster elect-leader [ID] and controllers metadata (and their mqadmin aliases) send what
    a row of openapi.json serves on a controller, with a body its request schema takes; a controller's answers
    to them validate against the rows' response schemas."""
    from jsonschema import Draft202012Validator

    from cluster.controller.metadata import Metadata
    from cluster.discovery.members import MemberRecord

    spec = load_spec()

    def validate(schema_name, value):
        Draft202012Validator({"$ref": f"#/components/schemas/{schema_name}",
                              "components": spec["components"]}).validate(value)

    metadata = Metadata()
    metadata.seed({"g1": [[0, 1023]]}, {"sensors": "g1"})
    records = [MemberRecord("c", "broker-g1", "broker", rpc_address="tcp:127.0.0.1:7800", group="g1").as_dict(),
               MemberRecord("c", "proxy-1", "proxy", rpc_address="tcp:127.0.0.1:7801").as_dict()]
    for record in records:
        metadata.join(record)
    raft = _Raft(metadata)
    controller = type("Controller", (), {"members": lambda self: records})()
    api = AdminAPI(served_by(routes(), "controller"), ControllerHandlers(controller, raft, "1.0", task.Clock()))
    parser = build_parser()
    table = routes()
    for argv, schema in ((["cluster", "members"], "MemberPage"),
                         (["controllers", "metadata"], "ControllerMetadata"),
                         (["getControllerMetaData"], "ControllerMetadata"),
                         (["cluster", "elect-leader", "127.0.0.1:7902"], "LeaderElected"),
                         (["cluster", "elect-leader"], "LeaderElected")):
        args = parser.parse_args(argv)
        path, query, body = commands.request_for(args.command_row, args)
        route, _params, _known = match(table, args.command_row.method, path.split("/"))
        assert route is not None and "controller" in route.roles, argv
        assert route.response_schema == schema, argv
        if body is not None:
            validate(route.body_schema, body)
        raft.leader = raft.address  # each elect-leader starts on the leader
        status, answer = _call(api, route.method, "/api/v1/" + path,
                               body=json.dumps(body).encode() if body is not None else b"")
        assert status == route.status, (argv, answer)
        validate(schema, answer)
    raft.leader = raft.address
    members = _call(api, "GET", "/api/v1/cluster/members")[1]["items"]
    assert [m["id"] for m in members if m["leader"]] == ["127.0.0.1:7900"]
    assert {m["id"] for m in members} >= {"broker-g1", "proxy-1", "127.0.0.1:7901"}
    assert _call(api, "POST", "/api/v1/cluster/elect-leader", body=b'{"id": "127.0.0.1:7902"}')[1] == {
        "previous": "127.0.0.1:7900", "leader": "127.0.0.1:7902"}
