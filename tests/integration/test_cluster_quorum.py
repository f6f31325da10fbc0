"""Controller outages under QoS 1 load (RIP-44): 3 controllers, a group of 3 brokers behind one proxy, real paho clients.

One cluster for the module (tests run in file order; each heals what it broke). A minority of the controllers
down (one SIGKILLed, one SIGSTOPped, the leader SIGSTOPped): publishing and delivery go on, no master is
elected, nothing acknowledged is lost. A majority down (two SIGSTOPped with the leader, or two SIGKILLed): the
master keeps acknowledging (its SyncStateSet does not change, so nothing needs the controllers), no master is
elected while they are down nor after they are back (same master, same epoch), and a resumed leader declares
no live broker dead and evicts no live member although its clock jumped past their heartbeats.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from cluster.tools import launcher
from tests.integration.test_cluster_controllers import Cluster
from tests.integration.test_cluster_failover import Load, _check_all_delivered, _first_log_time, _replica
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow

DOWN_FOR = 4.0
"""Seconds the controllers stay down: past a broker's timeout (1.5 s) and a member lease (3 s), so a resumed
leader that trusted its jumped clock would find every broker and member silent."""
ACKS_DURING = 50
"""Acknowledgements the master must give while the controllers are down (the load runs at 50/s)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One group of three brokers behind one proxy, with three controllers (the launcher's default timings)."""
    root = tmp_path_factory.mktemp("quorum")
    base = root / "base.toml"
    base.write_text("[mqtt]\nallow_anonymous = true\n")
    doc = launcher.up(str(root / "c"), groups=1, proxies=1, replicas=3, controllers=3, base_config=str(base))
    doc["root"] = str(root / "c")
    yield Cluster(str(root / "c"), doc)
    for proc in doc["processes"]:  # a test that failed half-way may leave one stopped
        try:
            os.kill(proc["pid"], signal.SIGCONT)
        except ProcessLookupError:
            pass
    launcher.down(str(root / "c"))


def _full_set(cluster: Cluster) -> dict:
    return wait_until(lambda: (lambda i: i if i and len(i["sync_state_set"]) == 3 else None)(_replica(cluster.doc)),
                      30, what="a full SyncStateSet")


def _controller_logs_since(cluster: Cluster, needle: str, since: float) -> list[str]:
    """The controllers whose log holds ``needle`` after ``since`` (epoch seconds)."""
    return [c["id"] for c in cluster.procs("controller")
            if _first_log_time(os.path.join(cluster.root, c["id"] + ".log"), needle, since)]


def _controller_story(cluster: Cluster, since: float) -> str:
    """The controllers' leadership and liveness lines since ``since``, in time order (for a failure's message)."""
    keep = ("raft_state", "controller_leading", "controller_paused", "broker_dead", "broker_alive", "lead_not_taken")
    lines = []
    for c in cluster.procs("controller"):
        with open(os.path.join(cluster.root, c["id"] + ".log"), encoding="utf-8", errors="replace") as f:
            lines += [f"{line[:23]} {c['id']} {line[24:].strip()[:160]}" for line in f
                      if any(k in line for k in keep) and line[:19] >= time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                      time.localtime(since - 1))]
    return "\n".join(sorted(lines))


def _down(cluster: Cluster, controllers: list[dict], how: str) -> None:
    for c in controllers:
        if how == "kill":
            cluster.kill(c)
        else:
            os.kill(c["pid"], signal.SIGSTOP)
            wait_until(lambda c=c: _state(c["pid"]) == "T", 5, what=f"{c['id']} stopped")


def _back(cluster: Cluster, controllers: list[dict], how: str) -> None:
    for c in controllers:
        if how == "kill":
            cluster.restart(c)
        else:
            os.kill(c["pid"], signal.SIGCONT)


def _state(pid: int) -> str:
    """The state letter of /proc/PID/stat (T: stopped)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _outage(cluster: Cluster, topic: str, pick, how: str) -> tuple[Load, dict, float, int]:
    """Under QoS 1 load: take the controllers ``pick(leader, followers)`` down (``how``: kill or stop) for
    DOWN_FOR seconds, bring them back, wait for an agreed leader; (load, replica info before, wall time of the
    fault, acknowledgements while they were down)."""
    before = _full_set(cluster)
    leader = cluster.leader()
    followers = [c for c in cluster.procs("controller") if c is not leader]
    targets = pick(leader, followers)
    load = Load(cluster.procs("proxy")[0]["ports"]["mqtt"], topic)
    try:
        wait_until(lambda: len(load.acked) >= 50, 30, what="50 acknowledged publishes before the fault")
        t0_wall, t0 = time.time(), time.monotonic()
        _down(cluster, targets, how)
        down_at = time.monotonic()
        wait_until(lambda: time.monotonic() - t0 >= DOWN_FOR, DOWN_FOR + 1, what="the outage")
        during = sum(1 for at in list(load.acked.values()) if down_at < at <= time.monotonic())
        _back(cluster, targets, how)
        cluster.leader(timeout=30)
        wait_until(lambda: load.acked_after(time.monotonic() - 0.5) > 0, 15, what="acknowledgements after the heal")
    except BaseException:
        load.close()
        raise
    return load, before, t0_wall, during


def _check_no_election(cluster: Cluster, load: Load, before: dict, since: float, what: str) -> None:
    """Same master at the same epoch, no master_elected, broker_dead or eviction logged since the fault, every
    acknowledged message delivered."""
    info = _full_set(cluster)
    assert (info["master"], info["master_epoch"]) == (before["master"], before["master_epoch"]), (before, info)
    load.stop()
    _check_all_delivered(load, what)
    assert _controller_logs_since(cluster, "master_elected", since) == [], what
    assert _controller_logs_since(cluster, "broker_dead", since) == [], \
        f"{what}: a live broker declared dead\n" + _controller_story(cluster, since)
    assert _controller_logs_since(cluster, "reason=evicted", since) == [], f"{what}: a live member evicted"
    print(f"{what}: acked {len(load.acked)}, delivered {load.deliveries} "
          f"({load.deliveries - len(load.received)} duplicates), publisher reconnects {load.reconnects}, "
          f"pauses noticed by {_controller_logs_since(cluster, 'controller_paused', since) or 'none'}")


@pytest.mark.parametrize("how,which", [("kill", "follower"), ("stop", "follower"), ("stop", "leader")])
def test_a_minority_of_controllers_down_stops_nothing(cluster, how, which):
    """One controller of three SIGKILLed or SIGSTOPped (a follower, or the leader) for 4 s under QoS 1 load: the
    master keeps acknowledging, no master is elected, every acknowledged message is delivered."""
    pick = (lambda leader, followers: [leader]) if which == "leader" else (lambda leader, followers: followers[:1])
    load, before, since, during = _outage(cluster, f"min-{how}-{which}", pick, how)
    try:
        assert during >= ACKS_DURING, during
        _check_no_election(cluster, load, before, since, f"controller {which} {how}")
    finally:
        load.close()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_majority_of_controllers_down_the_master_keeps_serving(cluster, how):
    """Two controllers of three, the leader among them, SIGSTOPped or SIGKILLed for 4 s under QoS 1 load: the
    master keeps acknowledging (its SyncStateSet does not change); once they are back the master is the same at
    the same epoch, no master was elected, no live broker declared dead, no member evicted; nothing acknowledged
    is lost."""
    load, before, since, during = _outage(cluster, f"maj-{how}", lambda leader, followers: [leader, followers[0]],
                                          how)
    try:
        assert during >= ACKS_DURING, during
        # A lease and more after the heal: a resumed leader that misread its clock would have acted by now.
        settled = time.monotonic()
        wait_until(lambda: time.monotonic() - settled >= 3.5, 5, what="a lease after the heal")
        _check_no_election(cluster, load, before, since, f"controller majority {how}")
    finally:
        load.close()
