"""The admin API and twistmq-admin against a real node with paho and native clients: every route of
openapi.json answered and validated against its schema, then list, detail, kick, delete, paging, auth,
bad input and the new metrics one by one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from urllib.parse import quote

import pytest

from cluster.admin.routes import routes, served_by
from mqtt_proxy.native.client import BlockingClient
from tests.integration.admin_support import call, close, paho, validate, wait_for
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow

TOKEN = "admin-test-token"
ADMIN = os.path.join(os.path.dirname(sys.executable), "twistmq-admin")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("admin")
    config = base / "twistmq.toml"
    config.write_text(f'[admin]\ntoken = "{TOKEN}"\nmember_id = "node-a"\n\n[mqtt]\nsys_interval = 1.0\n'
                      '[cluster]\nzone = "lab-2"\nmin_free_memory = 1.0\n')  # never that free: listed unhealthy
    n = NodeProcess(str(base / "data"), listeners=("mqtt", "http", "native"),
                    extra_args=["--config", str(config)]).start()
    yield n
    n.stop()


def api(node, method, path, body=None, token=TOKEN, raw=None):
    return call(node.port("http"), method, path, body, token, raw)


def ok(node, method, path, schema, body=None, status=200):
    """Call, check the status and validate the JSON answer against *schema*; return the answer."""
    got, _ctype, answer = api(node, method, path, body)
    assert got == status, (method, path, got, answer)
    validate(schema, answer)
    return answer


def test_every_route_of_the_file_answers_to_its_schema(node):
    """Each operation of openapi.json is called once with real state behind it, and its answer validates."""
    mqtt_port = node.port("mqtt")
    # State for the routes to show: a persistent offline session, a live subscriber, a retained message,
    # an idle light queue, a native queue and a delayed native message (a timer).
    close(paho(mqtt_port, "adm-sub", clean=False, subscribe="adm/+/t"))
    live = paho(mqtt_port, "adm-live", subscribe="live/#")
    kicked = paho(mqtt_port, "adm-kick")
    close(paho(mqtt_port, "adm-gone", clean=False, subscribe="gone/#"))
    idle = paho(mqtt_port, "adm-idle", subscribe="idle/q")
    idle.unsubscribe("idle/q")
    pub = paho(mqtt_port, "adm-pub")
    pub.publish("adm/1/t", b"21.5", qos=1, retain=True).wait_for_publish(10)
    with BlockingClient("127.0.0.1", node.port("native")) as native:
        native.produce("jobs", "j1")
        timer_id = native.produce("later", "soon", delay=600)
    wait_for(lambda: api(node, "GET", "/api/v1/queues/" + quote("%LMQ%idle/q", safe=""))[2].get("subscribers") == 0,
             what="the idle queue's subscriber to leave")

    samples = {
        "health": ("GET", "/health", None),
        "metrics": ("GET", "/metrics", None),
        "get_stats": ("GET", "/api/v1/stats", None),
        "list_clients": ("GET", "/api/v1/clients?connected=true", None),
        "get_client": ("GET", "/api/v1/clients/adm-live", None),
        "kick_client": ("DELETE", "/api/v1/clients/adm-kick", None),
        "list_sessions": ("GET", "/api/v1/sessions?like=adm-", None),
        "get_session": ("GET", "/api/v1/sessions/adm-sub", None),
        "delete_session": ("DELETE", "/api/v1/sessions/adm-gone", None),
        "list_subscriptions": ("GET", "/api/v1/subscriptions?client_id=adm-sub", None),
        "list_queues": ("GET", "/api/v1/queues?limit=1000", None),
        "get_queue": ("GET", "/api/v1/queues/" + quote("%LMQ%adm/+/t", safe=""), None),
        "delete_queue": ("DELETE", "/api/v1/queues/" + quote("%LMQ%idle/q", safe=""), None),
        "list_bridges": ("GET", "/api/v1/bridges", None),
        "list_retained": ("GET", "/api/v1/retained", None),
        "delete_retained": ("DELETE", "/api/v1/retained/" + quote("adm/1/t", safe=""), None),
        "list_topics": ("GET", "/api/v1/topics", None),
        "list_native_queues": ("GET", "/api/v1/native/queues", None),
        "get_timers": ("GET", "/api/v1/timers", None),
        "cancel_timer": ("DELETE", f"/api/v1/timers/{timer_id}", None),
        "publish": ("POST", "/api/v1/publish", {"topic": "live/x", "payload": "from the API", "qos": 1}),
        "list_members": ("GET", "/api/v1/cluster/members", None),
    }
    table = served_by(routes(), "node")
    assert set(samples) == {r.operation_id for r in table}, "every operation a node serves has a sample call here"
    answers = {}
    for route in table:
        method, path, body = samples[route.operation_id]
        assert method == route.method
        status, ctype, answer = api(node, method, path, body)
        assert status == route.status, (route.operation_id, status, answer)
        if route.response_schema:
            validate(route.response_schema, answer)
        else:
            assert ctype.startswith("text/plain") and "twistmq_" in answer
        answers[route.operation_id] = answer
    assert answers["kick_client"] == {"client_id": "adm-kick", "kicked": True}
    assert answers["delete_queue"]["deleted"] and answers["cancel_timer"] == {"timer_id": timer_id, "cancelled": True}
    assert answers["get_session"]["subscriptions"][0]["topic_filter"] == "adm/+/t"
    assert answers["get_session"]["queued"] >= 1  # the retained publish waits in its queue while it is away
    [me] = answers["list_members"]["items"]  # a standalone node lists itself, as it is now
    assert me == {"id": "node-a", "role": "node", "group": "g1", "active": True, "healthy": False,
                  "leader": False, "joined": True, "zone": "lab-2", "version": answers["get_stats"]["version"]}
    assert {"jobs"} <= {q["queue"] for q in answers["list_native_queues"]["queues"]}
    wait_for(lambda: kicked.disconnects, what="the kicked client to see its disconnect")
    for client in (live, idle, pub):
        close(client)


def test_a_route_the_file_lacks_is_not_served(node):
    """Paths outside the file answer 404 in the error shape, and a known path with another method 405."""
    for path in ("/api/v1/brokers", "/api/v2/clients", "/api/v1/clients/a/b"):
        status, _ctype, answer = api(node, "GET", path)
        assert status == 404
        validate("Error", answer)
    status, _ctype, answer = api(node, "PUT", "/api/v1/clients/x")
    assert status == 405 and answer["code"] == "method_not_allowed"


def test_kick_disconnects_and_keeps_the_session(node):
    """DELETE clients/{id} closes the paho client's connection; its persistent session stays, offline."""
    c = paho(node.port("mqtt"), "kick-me", clean=False, subscribe="k/#")
    assert ok(node, "GET", "/api/v1/clients/kick-me", "Client")["connected"] is True
    assert ok(node, "DELETE", "/api/v1/clients/kick-me", "Kicked")["kicked"] is True
    wait_for(lambda: c.disconnects, what="paho's on_disconnect")
    c.loop_stop()
    answer = ok(node, "GET", "/api/v1/clients/kick-me", "Client")
    assert answer["connected"] is False and answer["subscriptions"] == 1
    assert ok(node, "DELETE", "/api/v1/clients/kick-me", "Kicked")["kicked"] is False  # offline: nothing to kick


def test_delete_session_forgets_it(node):
    """DELETE sessions/{id} disconnects the client and its session is gone (404 after)."""
    c = paho(node.port("mqtt"), "del-me", clean=False, subscribe="d/#")
    assert ok(node, "DELETE", "/api/v1/sessions/del-me", "SessionDeleted")["deleted"] is True
    wait_for(lambda: c.disconnects, what="paho's on_disconnect")
    c.loop_stop()
    status, _ctype, answer = api(node, "GET", "/api/v1/sessions/del-me")
    assert status == 404 and answer["code"] == "not_found"


def test_a_queue_in_use_is_not_deleted(node):
    """DELETE queues/{name} of a light queue with a subscriber answers 409 and the queue stays."""
    c = paho(node.port("mqtt"), "busy-q", subscribe="busy/#")
    name = quote("%LMQ%busy/#", safe="")
    status, _ctype, answer = api(node, "DELETE", "/api/v1/queues/" + name)
    assert status == 409 and answer["code"] == "conflict"
    assert ok(node, "GET", "/api/v1/queues/" + name, "LightQueueDetail")["subscribers"] == 1
    close(c)


def test_paging_covers_every_client_once(node):
    """?limit=2 pages through the clients in id order; next is null on the last page."""
    for i in range(5):
        close(paho(node.port("mqtt"), f"pg-{i}", clean=False))
    seen, cursor = [], None
    for _ in range(10):
        path = "/api/v1/clients?like=pg-&limit=2" + (f"&cursor={cursor}" if cursor else "")
        answer = ok(node, "GET", path, "ClientPage")
        assert len(answer["items"]) <= 2
        seen += [c["client_id"] for c in answer["items"]]
        cursor = answer["next"]
        if cursor is None:
            break
    assert seen == [f"pg-{i}" for i in range(5)]


def test_auth_is_refused_without_the_token_but_health_and_metrics_answer(node):
    """No or a wrong bearer token: 401 in the error shape; /health and /metrics need none."""
    for token in (None, "wrong"):
        status, _ctype, answer = api(node, "GET", "/api/v1/clients", token=token)
        assert status == 401 and answer["code"] == "unauthorized"
        validate("Error", answer)
    assert api(node, "GET", "/health", token=None)[0] == 200
    assert api(node, "GET", "/metrics", token=None)[0] == 200


def test_bad_input_and_unknown_ids_get_the_error_shape(node):
    """Bad JSON, a bad topic, an unknown client, queue, retained topic or timer: 4xx and {code, message}."""
    cases = [
        (("POST", "/api/v1/publish", None, TOKEN, b"{nope"), 400, "bad_json"),
        (("POST", "/api/v1/publish", {"topic": "a/+"}), 400, "bad_request"),
        (("POST", "/api/v1/publish", {"topic": "a", "qos": 3}), 400, "bad_request"),
        (("GET", "/api/v1/clients/nobody"), 404, "not_found"),
        (("GET", "/api/v1/sessions/nobody"), 404, "not_found"),
        (("GET", "/api/v1/queues/" + quote("%LMQ%no/such", safe="")), 404, "not_found"),
        (("DELETE", "/api/v1/retained/no%2Fsuch"), 404, "not_found"),
        (("DELETE", "/api/v1/timers/0"), 404, "not_found"),
        (("DELETE", "/api/v1/timers/x"), 400, "bad_request"),
        (("GET", "/api/v1/clients?limit=0"), 400, "bad_request"),
        (("GET", "/api/v1/clients?cursor=***"), 400, "bad_request"),
    ]
    for args, status, code in cases:
        got, _ctype, answer = api(node, *args)
        assert (got, answer.get("code")) == (status, code), (args, answer)
        validate("Error", answer)


def test_native_cancel_timer_action(node):
    """The native protocol's cancel_timer (14) cancels a delayed produce by its msg_id; an unknown id is an error."""
    with BlockingClient("127.0.0.1", node.port("native")) as c:
        msg_id = c.produce("cancel-me", "never", delay=600)
        reply = c.request({"action": "cancel_timer", "msg_id": msg_id, "seq": 7})
        assert reply["code"] == 0 and reply["cancelled"] is True and reply["seq"] == 7
        bad = c.request({"action": 14, "msg_id": 0})
        assert bad["code"] == -1 and "no timer" in bad["reason"]
        assert c.request({"action": "cancel_timer"})["code"] == -1


def test_metrics_and_sys_show_latency_listeners_process_and_lag(node):
    """After traffic, /metrics and $SYS show latency histograms, per-listener connections, process figures, lag."""
    sub = paho(node.port("mqtt"), "lat-sub", subscribe="lat/#")
    got = []
    sub.on_message = lambda *_a: got.append(1)
    pub = paho(node.port("mqtt"), "lat-pub")
    for i in range(64):
        pub.publish(f"lat/{i}", b"x", qos=1)
    wait_for(lambda: len(got) >= 64, what="64 deliveries")
    text = api(node, "GET", "/metrics")[2]

    def value(pattern):
        m = re.search(pattern + r" ([0-9.e+]+)$", text, re.M)
        assert m, pattern
        return float(m.group(1))

    assert value(r"twistmq_deliver_latency_seconds_count") >= 1  # one observation per batch a session sends
    assert value(r"twistmq_store_append_latency_seconds_count") >= 1
    assert value(r'twistmq_store_append_latency_seconds_bucket\{le="\+Inf"\}') >= 1
    assert value(r'twistmq_listener_connections\{listener="mqtt 127\.0\.0\.1:%d"\}' % node.port("mqtt")) >= 2
    assert value(r"process_resident_memory_bytes") > 1e6
    assert value(r"process_cpu_seconds_total") > 0
    value(r"twistmq_lightqueue_lag_messages")
    value(r'twistmq_reactor_lag_seconds\{quantile="1"\}')
    wait_for(lambda: {"$SYS/broker/latency/deliver_p99_ms", "$SYS/broker/process/rss_bytes",
                      "$SYS/broker/lightqueue/lag", "$SYS/broker/reactor/lag_max_ms"}
             <= {r["topic"] for r in api(node, "GET", "/api/v1/retained?limit=1000")[2]["items"]},
             what="$SYS figures")
    stats = ok(node, "GET", "/api/v1/stats", "Stats")
    assert stats["latency_ms"]["deliver_p99"] > 0 and stats["process"]["rss_bytes"] > 1e6
    close(sub)
    close(pub)


def _admin(node, *argv, token=TOKEN):
    env = dict(os.environ, TWISTMQ_ADMIN_TOKEN=token)
    return subprocess.run([ADMIN, "--server", f"http://127.0.0.1:{node.port('http')}", *argv],
                          capture_output=True, text=True, timeout=60, env=env)


def test_twistmq_admin_is_a_client_of_the_api(node):
    """The command prints the API's objects as JSON or a table, kicks, and reports errors in one line, exit 2."""
    c = paho(node.port("mqtt"), "cli-client", clean=False, subscribe="cli/#")
    out = _admin(node, "--json", "clients", "list", "--like", "cli-")
    assert out.returncode == 0, out.stderr
    assert [x["client_id"] for x in json.loads(out.stdout)] == ["cli-client"]
    table = _admin(node, "sessions", "show", "cli-client")
    assert table.returncode == 0 and re.search(r"^client_id\s+cli-client$", table.stdout, re.M)
    assert "topic_filter" in table.stdout.lower()
    kick = _admin(node, "clients", "kick", "cli-client")
    assert kick.returncode == 0 and re.search(r"^kicked\s+yes$", kick.stdout, re.M)
    wait_for(lambda: c.disconnects, what="the CLI's kick")
    c.loop_stop()
    missing = _admin(node, "clients", "show", "nobody")
    assert missing.returncode == 2 and missing.stderr.strip() == \
        "twistmq-admin: error: 404 not_found: no client 'nobody'"
    assert _admin(node, "clients", "list", token="wrong").stderr.startswith("twistmq-admin: error: 401 unauthorized")
    later = _admin(node, "getSyncStateSet", "g1")  # the cluster issues add this route
    assert later.returncode == 2 and "404 not_found" in later.stderr
    members = _admin(node, "--json", "cluster", "members")
    assert json.loads(members.stdout)[0]["id"] == "node-a"
