"""Delayed messages across a broker group's failovers: 3 controllers, a group of 3 brokers, one proxy, real paho
clients publishing to ``$delayed/{seconds}/{topic}``. The master is SIGKILLed while the link to its slaves drops
every byte (a relay, as in bench/chaos.py), so it dies with deliveries no slave holds (the controllers elect a
slave); then ``elect-master`` switches back to
the relaunched old master, which cut those deliveries from its log as it rejoined. Every delayed message is
delivered exactly once in the commit log of each master: none the old master delivered fires again, none whose
delivery was cut goes missing."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections import Counter

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from bench.relay import Relay
from cluster.tools import launcher
from store.reader import iter_records
from store.record import RecordKind
from tests.integration.test_cluster_failover import GROUP, _broker, _http, _procs, _replica
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow


FIRST_MASTER = "broker-g1-1"  # the launcher's master of a group at its first start


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One group of three brokers behind one proxy, with three controllers (the launcher's defaults); the first
    master's ``ha`` listener is reached through a relay the test can blackhole."""
    root = tmp_path_factory.mktemp("timers")
    base = root / "base.toml"
    base.write_text("[mqtt]\nallow_anonymous = true\n")
    relays: dict[str, Relay] = {}

    def dial(link: str, port: int) -> str:
        if link != f"{FIRST_MASTER}:ha":
            return f"tcp:127.0.0.1:{port}"
        if link not in relays:  # asked for its advertised address and for its slaves' argv: one relay
            relays[link] = Relay(("127.0.0.1", port))
        return relays[link].address

    try:
        doc = launcher.up(str(root / "c"), groups=1, proxies=1, replicas=3, controllers=3, base_config=str(base),
                          dial=dial)
        doc["root"] = str(root / "c")
        doc["relay"] = relays[f"{FIRST_MASTER}:ha"]
        yield doc
    finally:
        launcher.down(str(root / "c"))
        for relay in relays.values():
            relay.close()


def _schedule(port: int, prefix: str, delays: list[int]) -> float:
    """Publish ``prefix-i`` to ``$delayed/{delays[i]}/{prefix}/i`` at QoS 1, each PUBACKed; returns the time
    (epoch seconds) by which every one is due."""
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"timers-{prefix}", protocol=mqtt.MQTTv311)
    c.connect("127.0.0.1", port, keepalive=10)
    c.loop_start()
    try:
        for i, delay in enumerate(delays):
            info = c.publish(f"$delayed/{delay}/{prefix}/{i}", f"{prefix}-{i}".encode(), qos=1)
            info.wait_for_publish(10)
            assert info.is_published(), f"{prefix}-{i} not acknowledged"
    finally:
        c.disconnect()
        c.loop_stop()
    return time.time() + max(delays)


def _delivered(broker: dict, prefix: str) -> Counter:
    """How many times each ``prefix-i`` payload was delivered (a real publish record) in ``broker``'s log."""
    counts: Counter = Counter()
    for r in iter_records(os.path.join(broker["data_dir"], "commitlog")):
        if r.kind == RecordKind.MQTT_PUBLISH and r.topic.startswith(prefix + "/"):
            counts[r.body.decode()] += 1
    return counts


def _timer_metrics(broker: dict) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker['ports']['http']}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {line.split()[0][len("twistmq_timer_"):]: float(line.split()[1])
            for line in lines if line.startswith("twistmq_timer_")}


def _quiet(broker: dict, due_by: float) -> bool:
    """Every scheduled message is due, and the broker's timer holds nothing due, handed out or being put."""
    if time.time() < due_by + 1.0:
        return False
    m = _timer_metrics(broker)
    return m["timer_backlog"] == 0 and m.get("timer_pending", 0) == 0 and m["timer_puts_in_flight"] == 0


def _log_end(broker: dict) -> int:
    status, info = _http(broker["ports"]["http"], "GET", f"cluster/brokers/{broker['id']}/epoch")
    return info["max_offset"] if status == 200 else -1


def _since_slave(broker: dict) -> str:
    """What ``broker`` logged since it last became a slave."""
    with open(broker["data_dir"] + ".log", encoding="utf-8", errors="replace") as f:
        return f.read().split("ha_role role=slave")[-1]


def _master(cluster) -> dict:
    info = wait_until(lambda: (lambda i: i if i and i.get("master") else None)(_replica(cluster)), 20,
                      what="the group's master")
    return _broker(cluster, info["master"])


def _exactly_once(broker: dict, batches: dict[str, int], due_by: float, what: str) -> None:
    wait_until(lambda: all(len(_delivered(broker, p)) == n for p, n in batches.items()), 60,
               what=f"every delayed message in {broker['id']}'s log ({what})")
    wait_until(lambda: _quiet(broker, due_by), 30, what=f"{broker['id']}'s timers idle ({what})")
    for prefix, n in batches.items():
        counts = _delivered(broker, prefix)
        assert set(counts) == {f"{prefix}-{i}" for i in range(n)}, (what, prefix, sorted(counts))
        repeated = {p: c for p, c in counts.items() if c != 1}
        assert not repeated, f"{what}: delivered more than once in {broker['id']}'s log: {repeated}"


def test_delayed_messages_fire_once_across_a_sigkill_and_an_elect_master(cluster):
    """Delayed messages due before, during and after a SIGKILL of the master: the elected slave delivers each
    exactly once (the ones its old master delivered never again); the old master relaunched rejoins as a slave,
    more are scheduled, and ``elect-master`` hands the group back to it: it too delivers each exactly once."""
    proxy = _procs(cluster, "proxy")[0]
    port = proxy["ports"]["mqtt"]
    before = wait_until(lambda: (lambda i: i if i and len(i["sync_state_set"]) == 3 else None)(_replica(cluster)),
                        30, what="a full SyncStateSet")
    assert before["master"] == FIRST_MASTER, before
    old = _broker(cluster, before["master"])
    first = [1 + i % 8 for i in range(40)]  # due over 1..8 s: before the kill, during the election, after
    due_first = _schedule(port, "tma", first)
    wait_until(lambda: len(_delivered(old, "tma")) >= 5, 20, interval=0.1, what="the first deliveries")
    # A partition between the master and its slaves: what the master delivers now is in its log only when it
    # is killed (the controllers still hear every broker).
    slaves = [_broker(cluster, b) for b in before["sync_state_set"] if b != old["id"]]
    cluster["relay"].cut(blackhole=True)
    try:
        held = set(_delivered(slaves[0], "tma")) | set(_delivered(slaves[1], "tma"))
        wait_until(lambda: set(_delivered(old, "tma")) - held, 5, interval=0.05, what="a delivery on the master only")
        os.kill(old["pid"], signal.SIGKILL)
    finally:
        cluster["relay"].restore()
    assert set(_delivered(old, "tma")) - set(_delivered(slaves[0], "tma")) - set(_delivered(slaves[1], "tma"))
    info = wait_until(lambda: (lambda i: i if i and i["master"] != old["id"] else None)(_replica(cluster)), 20,
                      interval=0.1, what="a new master")
    new = _broker(cluster, info["master"])
    _exactly_once(new, {"tma": len(first)}, due_first, "after the SIGKILL")

    launcher.relaunch(cluster["root"], old["id"])
    with open(os.path.join(cluster["root"], "cluster.json"), encoding="utf-8") as f:
        cluster["processes"] = json.load(f)["processes"]
    rejoined = wait_until(lambda: (lambda text: text if "store_truncated" in text else None)(_since_slave(old)), 30,
                          interval=0.2, what="the old master cutting what only it held")
    assert "timer_rolled_back" in rejoined or "timer_reset" in rejoined, rejoined[-2000:]
    second = [1 + i % 6 for i in range(30)]
    due_second = _schedule(port, "tmb", second)
    wait_until(lambda: len(_delivered(new, "tmb")) >= 5, 20, interval=0.1, what="deliveries of the second batch")
    wait_until(lambda: _log_end(old) >= _log_end(new), 30, interval=0.1, what="the old master caught up")
    answers = [_http(c["ports"]["http"], "POST", f"cluster/groups/{GROUP}/elect-master", {"broker": old["id"]})
               for c in _procs(cluster, "controller")]
    assert sum(1 for status, _ in answers if status == 200) == 1, answers
    back = _master(cluster)
    assert back["id"] == old["id"], back
    _exactly_once(_broker(cluster, old["id"]), {"tma": len(first), "tmb": len(second)}, due_second,
                  "after elect-master back to the relaunched old master")
