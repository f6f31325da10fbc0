"""Who may join, with real processes: a broker whose RPC listener is ``ssl:`` and whose ``[cluster] secret`` is
A; a proxy with secret A dials it with a ``tls:`` endpoint and serves paho clients, a proxy with secret B (or none)
is refused and both logs say so without either secret in them.

One broker for the module; each test starts its own proxy and stops it.
"""

from __future__ import annotations

import subprocess
import threading

import paho.mqtt.client as mqtt
import pytest

from cluster.tools.certs import make_ca, make_server_cert, write_issued
from tests.integration.node import NodeProcess
from tests.integration.pki_fixtures import escape
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

WAIT = 15.0
SECRET_A = "secret-of-cluster-a"
SECRET_B = "secret-of-cluster-b"
CLUSTER = "c-secret"


def log_of(node: NodeProcess) -> str:
    with open(node.data_dir.rstrip("/") + ".stderr.log", errors="replace") as f:
        return f.read()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker with secret A, its RPC on TLS with a certificate of the module's CA (in ``trust/``)."""
    path = tmp_path_factory.mktemp("secret")
    ca = make_ca()
    (path / "trust").mkdir()
    write_issued(ca, str(path / "trust" / "ca.pem"), str(path / "ca.key"))
    write_issued(make_server_cert(ca, ["127.0.0.1", "localhost"]), str(path / "server.pem"), str(path / "server.key"))
    conf = path / "broker.toml"
    conf.write_text(f'[cluster]\ncluster_id = "{CLUSTER}"\nsecret = "{SECRET_A}"\n')
    rpc = f"ssl:0:interface=127.0.0.1:privateKey={escape(str(path / 'server.key'))}" \
          f":certKey={escape(str(path / 'server.pem'))}"
    b = NodeProcess(str(path / "b1"), listeners=("http",), role="broker",
                    extra_args=["--config", str(conf), "--node-id", "b1", "--rpc", rpc]).start()
    b.path = path
    yield b
    b.stop()


def proxy(broker: NodeProcess, name: str, secret: str | None) -> NodeProcess:
    """A proxy dialling the broker over tls: (host name checked against the CA) with ``secret`` (None: no key)."""
    conf = broker.path / f"{name}.toml"
    secret_line = f'secret = "{secret}"\n' if secret is not None else ""
    conf.write_text(f'[cluster]\ncluster_id = "{CLUSTER}"\ncall_timeout = 1.0\n{secret_line}'
                    f'[[cluster.members]]\nid = "b1"\nrole = "broker"\ngroup = "g1"\n'
                    f'rpc = "tls:127.0.0.1:{broker.port("rpc")}:trustRoots={escape(str(broker.path / "trust"))}"\n')
    return NodeProcess(str(broker.path / name), listeners=("mqtt", "http"), role="proxy",
                       extra_args=["--config", str(conf), "--node-id", name])


def round_trip(port: int) -> bytes:
    """Subscribe and publish QoS 1 through the proxy at ``port``; the payload that came back."""
    got, done = [], threading.Event()
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="secret-sub", protocol=mqtt.MQTTv311)
    sub.on_message = lambda c, u, m: (got.append(m.payload), done.set())
    subscribed = threading.Event()
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.connect("127.0.0.1", port)
    sub.loop_start()
    try:
        sub.subscribe("joined/#", qos=1)
        assert subscribed.wait(WAIT), "no SUBACK"
        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="secret-pub", protocol=mqtt.MQTTv311)
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        try:
            pub.publish("joined/a", b"over tls", qos=1).wait_for_publish(WAIT)
        finally:
            pub.loop_stop()
            pub.disconnect()
        assert done.wait(WAIT), "the message did not come back"
    finally:
        sub.loop_stop()
        sub.disconnect()
    return got[0]


def test_a_proxy_with_the_same_secret_joins_over_tls(broker):
    """Same secret, tls: endpoint: the proxy connects to the broker and a QoS 1 round trip goes through it."""
    p = proxy(broker, "p-good", SECRET_A).start()
    try:
        wait_until(lambda: "rpc_peer_connected peer=b1" in log_of(p), WAIT, 0.05, "the proxy's connection")
        assert round_trip(p.port("mqtt")) == b"over tls"
    finally:
        p.stop()


@pytest.mark.parametrize("secret", [SECRET_B, None], ids=["another-secret", "no-secret"])
def test_a_proxy_with_another_secret_or_none_is_refused_and_both_logs_say_so(broker, secret):
    """The broker proves secret A; the proxy (secret B, or none) refuses it and never connects: it exits with one
    line naming the broker, the refusal and the key, the broker's log names the refusal, no secret in either."""
    p = proxy(broker, f"p-{'none' if secret is None else 'wrong'}", secret)
    run = subprocess.run(p.args(), capture_output=True, text=True, timeout=60, cwd="/")
    reason = "broker 'b1' did not prove the cluster secret ([cluster] secret differs between the two nodes)"
    assert run.returncode != 0
    assert [line for line in run.stderr.splitlines() if line.startswith("twistmq:")] == [
        f"twistmq: cannot start: broker b1 unreachable for 1 s (its handshake was refused: {reason})"]
    assert f"rpc_refused peer=- addr=127.0.0.1:{broker.port('rpc')} reason={reason}" in run.stderr
    wait_until(lambda: "rpc_closed_by_peer peer=- addr=127.0.0.1" in log_of(broker) and reason in log_of(broker),
               WAIT, 0.05, "the refusal in the broker's log")
    for text in (run.stderr, log_of(broker)):
        assert SECRET_A not in text and SECRET_B not in text
