"""A promoted slave indexes for the stored sessions at once: 3 controllers, a group of 3 brokers, 2 proxies, paho.

A persistent session subscribes on the master through proxy-1 and goes offline; proxy-1 is SIGKILLed, so only the
brokers' own interest in stored sessions (``cluster.local.session_interest``) keeps its filter indexed. A slave is
elected master by hand; a message published through proxy-2 and acknowledged by the new master reaches the session
when its client comes back on proxy-2: the new master took interest in the sessions stored while it was a slave.
"""

from __future__ import annotations

import os
import signal

import paho.mqtt.client as mqtt
import pytest

from cluster.tools import launcher
from tests.integration.admin_support import close, paho, wait_for
from tests.integration.test_cluster_failover import GROUP, _http, _replica
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One group of three brokers behind two proxies, with three controllers."""
    root = tmp_path_factory.mktemp("promotion")
    base = root / "base.toml"
    base.write_text("[mqtt]\nallow_anonymous = true\n")
    doc = launcher.up(str(root / "c"), groups=1, proxies=2, replicas=3, controllers=3, base_config=str(base),
                      admin=False)
    yield doc
    launcher.down(str(root / "c"))


def test_a_slave_elected_master_indexes_for_sessions_stored_while_it_was_a_slave(cluster):
    """Persistent session subscribed through proxy-1 (then SIGKILLed), a slave elected master by hand, a QoS 1
    message acknowledged by it through proxy-2: the session, back on proxy-2, receives the message."""
    proxy1, proxy2 = (p for p in cluster["processes"] if p["role"] == "proxy")
    before = wait_until(lambda: (lambda i: i if i and len(i["sync_state_set"]) == 3 else None)(_replica(cluster)), 30,
                        what="a full SyncStateSet")
    sub = paho(proxy1["ports"]["mqtt"], "promo-sub", clean=False, subscribe="promo/#")
    close(sub)
    os.kill(proxy1["pid"], signal.SIGKILL)
    wait_for(lambda: not launcher.alive(proxy1["pid"]), what="proxy-1 gone")
    target = next(b for b in before["sync_state_set"] if b != before["master"])
    answers = [_http(c["ports"]["http"], "POST", f"cluster/groups/{GROUP}/elect-master", {"broker": target})
               for c in cluster["processes"] if c["role"] == "controller"]
    assert [a["master"] for status, a in answers if status == 200] == [target], answers
    pub = paho(proxy2["ports"]["mqtt"], "promo-pub")
    try:
        pub.publish("promo/1", b"after the promotion", qos=1).wait_for_publish(15)
    finally:
        close(pub)
    assert _replica(cluster)["master"] == target
    got = []
    back = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="promo-sub", clean_session=False)
    back.on_message = lambda _c, _u, m: got.append(m.payload)  # before the connect: the backlog comes at once
    back.connect("127.0.0.1", proxy2["ports"]["mqtt"])
    back.loop_start()
    try:
        wait_for(lambda: got, what="the message published after the promotion")
        assert got == [b"after the promotion"]
    finally:
        close(back)
