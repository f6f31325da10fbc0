"""Chaos benchmark: faults injected into a local cluster under QoS 1 load, with an audit of every acknowledgement.

    ./dev python -m bench.chaos                       # 22 injections (2 of each type), seed 1
    ./dev python -m bench.chaos --no-faults --duration 20
    ./dev python -m bench.chaos --types slave-stop,ctl-minority-stop --injections 4 --rate 200

It starts a cluster with the launcher (3 controllers, one group of 3 brokers, 2 proxies), each broker's
links to the controllers and its ``ha`` listener behind a ``bench.relay.Relay`` of their own (the
launcher's ``dial``), publishes QoS 1 at ``--rate`` messages/s through the proxies and holds a persistent
subscriber (clean session false) per publisher on another proxy (``bench.chaos_load``). From ``--seed``
it then injects, one at a time, the fault types of ``FAULTS``: SIGKILL or SIGSTOP/SIGCONT of the master,
of a slave, of a minority and of a majority of the controllers; every link between a slave and the
controllers cut, or between the master and the controllers (the controllers elect a new master while
the old one still runs, cut off from them: with ``min_in_sync_replicas`` 2 it acknowledges nothing once
its slaves follow the new master, so nothing it acknowledged is missing from the new one); the master's
``ha`` link cut (master <-> slaves). Each injection is verified (the
process gone or stopped, the relay refusing), lasts ``--fault-window`` seconds, is healed (SIGCONT, the
killed relaunched from its argv, the relays restored) and followed by a wait for the SyncStateSet to be
full again and acknowledgements to flow (bounded by ``--recover-timeout``).

Then it pauses the publishers, reconnects every subscriber and audits: an acknowledged message no
subscriber session received is lost. Per injection (JSON lines on stdout, one per injection then a
summary; a table per fault type on stderr):

- ``rto_s``: the longest pause between two consecutive PUBACKs (of all publishers) from the last one
  before the fault to the next fault (``outage_from_s``: when it began; null: under ``OUTAGE_MIN``,
  no outage); the stages, seconds after the fault, from the logs:
  ``detect_s`` (a controller's ``broker_dead``), ``elect_s`` (``master_elected``), ``role_s`` (a
  broker's ``ha_role role=master``), ``route_s`` (a proxy's ``group_moved``), ``first_ack_s`` (the
  first PUBACK after that pause, or after the fault when there was none); null where the log says nothing;
- ``lost`` / ``duplicates``: among the messages acknowledged between this fault and the next
  (``lost_sample``: up to five, as ``PUBLISHER:SEQ@`` seconds from the fault to their PUBACK);
- ``sss_full_s``: seconds from the fault until the SyncStateSet is full again (0: it never shrank);
- ``elections``: ``master_elected`` lines in that time; ``master_before`` / ``master_after``: the group's
  master before the fault and once it recovered.

It exits 1 when a message was lost (and, with ``--no-faults``, when there was an election, a
duplicate or a pause of ``NO_FAULT_GAP`` between acknowledgements after the warm-up), 2 when the
cluster could not be started or an injection could not be verified.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import itertools
import json
import os
import random
import re
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

from bench.chaos_load import Publisher, Subscriber, audit
from bench.relay import Relay
from cluster.tools import launcher

FAULTS = ("master-kill", "master-stop", "slave-kill", "slave-stop", "ctl-minority-kill", "ctl-minority-stop",
          "ctl-majority-kill", "ctl-majority-stop", "partition-broker-controllers", "partition-master-controllers",
          "partition-master-slaves")
GROUP = "g1"
STAGES = {"detect_s": (r"broker_dead group=", "controller"), "elect_s": (r"master_elected group=", "controller"),
          "role_s": (r"ha_role role=master", "broker"), "route_s": (r"group_moved group=", "proxy")}
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
VERIFY_TIMEOUT = 5.0
OUTAGE_MIN = 0.2
"""A pause between acknowledgements shorter than this is not an outage (at 1,000/s they come every ms)."""
NO_FAULT_GAP = 1.0
"""With --no-faults, a pause between acknowledgements this long fails the run (the service stopped by itself)."""


class ChaosError(Exception):
    """The run cannot go on (the cluster did not start, an injection could not be verified)."""


# -- the cluster ----------------------------------------------------------------------------------------------

class Cluster:
    """The launcher's cluster under ``root``, a relay per broker link, and which processes are stopped."""

    def __init__(self, root: str, replicas: int, proxies: int, base_config: str) -> None:
        self.root, self.replicas, self.proxies, self.base_config = root, replicas, proxies, base_config
        self.relays: dict[str, Relay] = {}
        self.stopped: set[int] = set()

    def dial(self, link: str, port: int) -> str:
        relay = Relay(("127.0.0.1", port))
        self.relays[link] = relay
        return relay.address

    def up(self) -> None:
        launcher.up(self.root, groups=1, proxies=self.proxies, replicas=self.replicas, controllers=3,
                    base_config=self.base_config, admin=False, dial=self.dial)

    def down(self) -> None:
        for pid in list(self.stopped):
            _signal(pid, signal.SIGCONT)
        try:
            launcher.down(self.root)
        except launcher.LaunchError:
            pass
        for relay in self.relays.values():
            relay.close()

    def procs(self, role: str | None = None) -> list[dict]:
        with open(os.path.join(self.root, "cluster.json"), encoding="utf-8") as f:
            procs = json.load(f)["processes"]
        return [p for p in procs if role is None or p["role"] == role]

    def proc(self, member: str) -> dict:
        return next(p for p in self.procs() if p["id"] == member)

    def replica_info(self) -> dict | None:
        """The controllers' replica info of the group (GetSyncStateData), from the first that answers."""
        for c in self.procs("controller"):
            if c["pid"] in self.stopped or not launcher.alive(c["pid"]):
                continue
            url = f"http://127.0.0.1:{c['ports']['http']}/api/v1/cluster/groups/{GROUP}/sync-state-set"
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    return json.loads(r.read())
            except (OSError, ValueError):
                continue
        return None

    def _metrics(self, broker: dict) -> dict:
        if broker["pid"] in self.stopped or not launcher.alive(broker["pid"]):
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{broker['ports']['http']}/metrics", timeout=1) as r:
                text = r.read().decode()
        except OSError:
            return {}
        return {k: float(v) for k, v in re.findall(r"^(twistmq_ha_\w+) (\S+)$", text, re.MULTILINE)}

    def master(self) -> str | None:
        """The group's master: as the controllers name it, else the broker whose metrics say it serves as one."""
        info = self.replica_info()
        if info and info.get("master"):
            return info["master"]
        masters = []
        for b in self.procs("broker"):
            m = self._metrics(b)
            if m and m.get("twistmq_ha_slave") == 0 and "twistmq_ha_sync_state_set" in m:
                masters.append((m.get("twistmq_ha_epoch", 0), b["id"]))
        return max(masters)[1] if masters else None

    def sync_state_set(self) -> int | None:
        """How many brokers the SyncStateSet holds (the controllers' view, else the master's metrics)."""
        info = self.replica_info()
        if info and isinstance(info.get("sync_state_set"), list):
            return len(info["sync_state_set"])
        master = self.master()
        if master is None:
            return None
        size = self._metrics(self.proc(master)).get("twistmq_ha_sync_state_set")
        return None if size is None else int(size)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _state(pid: int) -> str:
    """The process state letter of /proc/PID/stat (T: stopped; "": gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _wait(check, timeout: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(every)
    return bool(check())


def _refuses(relay: Relay) -> bool:
    """A connection to the relay is closed at once (a cut relay accepts and closes)."""
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=1) as s:
            s.settimeout(1)
            return s.recv(1) == b""
    except OSError:
        return True


# -- injections -----------------------------------------------------------------------------------------------

class Injector:
    """Injects one fault, verifies it, heals it."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng

    def targets(self, kind: str) -> list[str]:
        c = self.cluster
        controllers = [p["id"] for p in c.procs("controller")]
        brokers = [p["id"] for p in c.procs("broker")]
        master = c.master()
        if kind.startswith(("master-", "partition-master")):
            if master is None:
                raise ChaosError("no master to inject into")
            return [master]
        if kind.startswith("slave-"):
            return [self.rng.choice(sorted(b for b in brokers if b != master))]
        if kind.startswith("ctl-minority"):
            return self.rng.sample(controllers, (len(controllers) - 1) // 2)
        if kind.startswith("ctl-majority"):
            return self.rng.sample(controllers, len(controllers) // 2 + 1)
        return [self.rng.choice(sorted(b for b in brokers if b != master))]  # partition-broker-controllers: a slave

    def links(self, kind: str, targets: list[str]) -> list[Relay]:
        relays = self.cluster.relays
        if kind == "partition-master-slaves":
            return [relays[f"{targets[0]}:ha"]]
        return [relay for link, relay in relays.items() if link.startswith(targets[0] + ">")]

    def inject(self, kind: str, targets: list[str]) -> None:
        c = self.cluster
        if kind.startswith("partition-"):
            relays = self.links(kind, targets)
            for relay in relays:
                relay.cut()
            if not all(relay.is_cut and _refuses(relay) for relay in relays):
                raise ChaosError(f"{kind} {targets}: a relay still forwards")
            return
        pids = [c.proc(t)["pid"] for t in targets]
        if kind.endswith("-kill"):
            for pid in pids:
                _signal(pid, signal.SIGKILL)
            if not _wait(lambda: not any(launcher.alive(pid) for pid in pids), VERIFY_TIMEOUT):
                raise ChaosError(f"{kind} {targets}: still alive after SIGKILL")
            return
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
            c.stopped.add(pid)
        if not _wait(lambda: all(_state(pid) == "T" for pid in pids), VERIFY_TIMEOUT):
            raise ChaosError(f"{kind} {targets}: not stopped after SIGSTOP")

    def heal(self, kind: str, targets: list[str]) -> None:
        c = self.cluster
        if kind.startswith("partition-"):
            for relay in self.links(kind, targets):
                relay.restore()
            return
        if kind.endswith("-stop"):
            for t in targets:
                pid = c.proc(t)["pid"]
                _signal(pid, signal.SIGCONT)
                c.stopped.discard(pid)
            return
        for t in targets:
            launcher.relaunch(c.root, t)


# -- what the logs and the audit say ----------------------------------------------------------------------------

def log_events(root: str, since: float) -> list[tuple[float, str, str]]:
    """(time, role, line) of the stage lines (``STAGES``) and elections in every process's log after ``since``."""
    out = []
    wanted = re.compile("|".join(pattern for pattern, _ in STAGES.values()))
    for path in glob.glob(os.path.join(root, "*.log")):
        role = os.path.basename(path).split("-", 1)[0]
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not wanted.search(line):
                    continue
                m = LOG_TIME.match(line)
                if not m:
                    continue
                at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if at >= since:
                    out.append((at, role, line.strip()))
    return sorted(out)


def measure(record: dict, end: float, acks: list[float], events: list, samples: list, replicas: int) -> None:
    """Fill ``record`` (one injection at ``record["t0"]``) with its RTO, stages and SyncStateSet recovery."""
    t0 = record["t0"]
    window = [t for t in acks if t <= end]
    before = [t for t in window if t < t0]
    points = ([before[-1]] if before else [t0]) + [t for t in window if t >= t0]
    gaps = [(b - a, a, b) for a, b in itertools.pairwise(points)]
    rto, start, first = max(gaps) if gaps else (end - t0, t0, None)
    record["rto_s"] = round(rto, 3)
    if rto < OUTAGE_MIN:  # no pause worth the name: the first acknowledgement after the fault
        start, first = None, next((t for t in window if t >= t0), None)
    record["outage_from_s"] = None if start is None else round(start - t0, 3)
    record["first_ack_s"] = None if first is None else round(first - t0, 3)
    for stage, (pattern, role) in STAGES.items():
        hit = next((at for at, r, line in events if r == role and t0 <= at <= end and re.search(pattern, line)), None)
        record[stage] = None if hit is None else round(hit - t0, 3)
    record["elections"] = sum(1 for at, r, line in events if t0 <= at <= end and "master_elected" in line)
    span = [(at, size) for at, size in samples if t0 <= at <= end]
    short = [at for at, size in span if size is None or size < replicas]
    if not short:
        record["sss_full_s"] = 0.0
    else:
        full = next((at for at, size in span if at > short[-1] and size is not None and size >= replicas), None)
        record["sss_full_s"] = None if full is None else round(full - t0, 3)


def attribute(records: list[dict], pubs: list[Publisher], subs: list[Subscriber]) -> None:
    """Each injection's lost and duplicated messages: those acknowledged from its fault to the next."""
    starts = [r["t0"] for r in records]
    for r in records:
        r["lost"] = r["duplicates"] = 0
        r["lost_sample"] = []
    for pub, sub in zip(pubs, subs):
        for at, seq in pub.acks:
            i = _index(starts, at)
            if i < 0:
                continue
            got = sub.counts.get(seq, 0)
            if got == 0:
                records[i]["lost"] += 1
                if len(records[i]["lost_sample"]) < 5:  # publisher:seq, acknowledged that long after the fault
                    records[i]["lost_sample"].append(f"{pub.index}:{seq}@{at - records[i]['t0']:+.3f}s")
            elif got > 1:
                records[i]["duplicates"] += got - 1


def _index(starts: list[float], at: float) -> int:
    i = -1
    for n, t in enumerate(starts):
        if at >= t:
            i = n
    return i


# -- the run --------------------------------------------------------------------------------------------------

def schedule(types: list[str], count: int, rng: random.Random) -> list[str]:
    """``count`` injections: each type in turn as often as it fits (at least twice when count allows), shuffled."""
    plan = [types[i % len(types)] for i in range(count)]
    rng.shuffle(plan)
    return plan


class Sampler(threading.Thread):
    """The SyncStateSet's size every ``every`` seconds: (wall time, size or None)."""

    def __init__(self, cluster: Cluster, stop: threading.Event, every: float = 0.25) -> None:
        super().__init__(name="chaos-sss", daemon=True)
        self.cluster, self.stop, self.every = cluster, stop, every
        self.samples: list[tuple[float, int | None]] = []

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                size = self.cluster.sync_state_set()
            except Exception:  # noqa: BLE001 - cluster.json rewritten under us, a member mid-restart
                size = None
            self.samples.append((time.time(), size))


def run(args) -> int:
    rng = random.Random(args.seed)
    root = os.path.abspath(args.dir or tempfile.mkdtemp(prefix="twistmq-chaos-"))
    base = os.path.join(root, "base.toml")
    os.makedirs(root, exist_ok=True)
    with open(base, "w", encoding="utf-8") as f:
        f.write("[mqtt]\nallow_anonymous = true\n")
    cluster = Cluster(os.path.join(root, "cluster"), args.replicas, args.proxies, base)
    stop = threading.Event()
    pubs: list[Publisher] = []
    subs: list[Subscriber] = []
    records: list[dict] = []
    try:
        try:
            cluster.up()
        except launcher.LaunchError as exc:
            raise ChaosError(f"cluster not started: {exc}") from None
        proxies = cluster.procs("proxy")
        for i, proxy in enumerate(proxies):
            other = proxies[(i + 1) % len(proxies)]
            sub = Subscriber(f"chaos-sub-{i}", other["ports"]["mqtt"], f"chaos/{i}", stop)
            sub.start()
            subs.append(sub)
        if not all(s.subscribed.wait(10) for s in subs):
            raise ChaosError("a subscriber could not subscribe within 10 s")
        time.sleep(0.5)  # the subscriptions reach the broker before the first publish
        started = time.time()
        for i, proxy in enumerate(proxies):
            pub = Publisher(i, proxy["ports"]["mqtt"], args.rate / len(proxies), stop, args.window)
            pub.start()
            pubs.append(pub)
        sampler = Sampler(cluster, stop)
        sampler.start()
        time.sleep(args.warmup)
        if args.no_faults:
            time.sleep(args.duration)
        else:
            injector = Injector(cluster, rng)
            types = args.types.split(",") if args.types else list(FAULTS)
            for n, kind in enumerate(schedule(types, args.injections, rng), 1):
                targets = injector.targets(kind)
                record = {"n": n, "type": kind, "targets": targets, "master_before": cluster.master(),
                          "t0": time.time()}
                injector.inject(kind, targets)
                record["verified_s"] = round(time.time() - record["t0"], 3)
                time.sleep(args.fault_window)
                injector.heal(kind, targets)
                record["healed_s"] = round(time.time() - record["t0"], 3)
                ok = _wait(lambda: cluster.sync_state_set() == args.replicas
                           and any(at > time.time() - 0.5 for pub in pubs for at, _ in pub.acks[-1:]),
                           args.recover_timeout, every=0.2)
                record["recovered"] = ok
                record["master_after"] = cluster.master()
                records.append(record)
                print(f"chaos: {n:2} {kind:30} {','.join(targets):26} recovered={ok} "
                      f"after {time.time() - record['t0']:.1f} s, master {record['master_before']} -> "
                      f"{record['master_after']}", file=sys.stderr, flush=True)
                time.sleep(args.gap)
        ended = time.time()
        summary = drain(pubs, subs, args)
        summary["run_s"] = round(ended - started, 1)
        stop.set()
        acks = sorted(at for pub in pubs for at, _ in pub.acks)
        events = log_events(cluster.root, started)
        ends = [r["t0"] for r in records[1:]] + [ended]
        for record, end in zip(records, ends):
            measure(record, end, acks, events, sampler.samples, args.replicas)
        attribute(records, pubs, subs)
        summary["elections"] = sum(1 for _, _, line in events if "master_elected" in line)
        # from the first publish to the end of the load: acknowledgements that stop for good are a gap too
        span = [started + args.warmup, *(at for at in acks if started + args.warmup < at < ended), ended]
        summary["max_ack_gap_s"] = round(max(b - a for a, b in itertools.pairwise(span)), 3)
        for record in records:
            record["t0"] = round(record["t0"], 3)
            print(json.dumps(record), flush=True)
        summary.update(type="summary", seed=args.seed, rate=args.rate, injections=len(records),
                       no_faults=args.no_faults, dir=root)
        failed = summary["lost"] > 0 or (args.no_faults and (summary["elections"] or summary["duplicates"]
                                                             or summary["max_ack_gap_s"] >= NO_FAULT_GAP))
        summary["ok"] = not failed
        print(json.dumps(summary), flush=True)
        print(table(records, summary), file=sys.stderr, flush=True)
        return 1 if failed else 0
    finally:
        stop.set()
        for t in (*pubs, *subs):
            t.join(timeout=2)
        cluster.down()


def drain(pubs: list[Publisher], subs: list[Subscriber], args) -> dict:
    """Stop publishing, reconnect the subscribers, wait until they have every acknowledged message or are quiet."""
    for pub in pubs:
        pub.paused.set()
    _wait(lambda: False, 1.0)  # the last acknowledgements
    deadline = time.monotonic() + args.drain_timeout
    connects = [s.connects for s in subs]
    for sub in subs:
        sub.bounce()
    if not _wait(lambda: all(s.connects > n for s, n in zip(subs, connects)), args.drain_timeout, every=0.1):
        print("chaos: a subscriber did not reconnect for the audit", file=sys.stderr)

    def complete() -> bool:
        if all(not audit(p, s)["lost"] for p, s in zip(pubs, subs)):
            return True
        quiet = min(time.monotonic() - (s.last_receipt or 0) for s in subs)
        return quiet > args.drain_quiet or time.monotonic() > deadline
    _wait(complete, args.drain_timeout + 1, every=0.2)
    audits = [audit(p, s) for p, s in zip(pubs, subs)]
    return {"sent": sum(p.sent for p in pubs), "acked": sum(a["acked"] for a in audits),
            "received": sum(a["received"] for a in audits), "lost": sum(len(a["lost"]) for a in audits),
            "lost_sample": [f"{p.index}:{seq}" for p, a in zip(pubs, audits) for seq in a["lost"][:5]],
            "duplicates": sum(a["duplicates"] for a in audits), "unacked": sum(p.unacked for p in pubs),
            "publisher_reconnects": sum(p.reconnects for p in pubs),
            "subscriber_reconnects": sum(s.reconnects for s in subs),
            "sessions_lost": sum(s.sessions_lost for s in subs)}


def _fmt(values: list) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    if len(known) == 1:
        return f"{known[0]:.2f}"
    return f"{statistics.median(known):.2f}/{max(known):.2f}"


def table(records: list[dict], summary: dict) -> str:
    """Per fault type: count, then median/max of each figure; elections, masters moved (injections after which
    another broker masters), lost and duplicates summed."""
    cols = ("rto_s", "detect_s", "elect_s", "role_s", "route_s", "first_ack_s", "sss_full_s")
    head = (f"{'fault':30} {'n':>2} " + " ".join(f"{c[:-2]:>11}" for c in cols)
            + f" {'elect':>5} {'moved':>5} {'lost':>5} {'dup':>5}")
    lines = ["seconds after the fault, median/max", head, "-" * len(head)]
    for kind in sorted({r["type"] for r in records}):
        rs = [r for r in records if r["type"] == kind]
        lines.append(f"{kind:30} {len(rs):>2} " + " ".join(f"{_fmt([r[c] for r in rs]):>11}" for c in cols)
                     + f" {sum(r['elections'] for r in rs):>5}"
                     + f" {sum(1 for r in rs if r.get('master_after') != r.get('master_before')):>5}"
                     + f" {sum(r['lost'] for r in rs):>5}"
                     + f" {sum(r['duplicates'] for r in rs):>5}")
    lines.append(f"total: sent {summary['sent']} acked {summary['acked']} lost {summary['lost']} "
                 f"duplicates {summary['duplicates']} elections {summary['elections']} "
                 f"max ack gap {summary['max_ack_gap_s']} s in {summary['run_s']} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.chaos", description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--injections", type=int, default=None,
                   help="faults injected, one at a time (default: two of each type, at least 20 for all types)")
    p.add_argument("--types", default="", help=f"comma-separated fault types (default all: {','.join(FAULTS)})")
    p.add_argument("--no-faults", action="store_true", help="load only: expect no election, loss or duplicate")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of load with --no-faults")
    p.add_argument("--rate", type=float, default=1000.0, help="QoS 1 messages per second, over all publishers")
    p.add_argument("--window", type=int, default=500, help="unacknowledged messages per publisher at most")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--proxies", type=int, default=2)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--fault-window", type=float, default=4.0, help="seconds a fault lasts before it is healed")
    p.add_argument("--recover-timeout", type=float, default=30.0)
    p.add_argument("--gap", type=float, default=2.0, help="seconds between a recovery and the next fault")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--drain-quiet", type=float, default=5.0)
    p.add_argument("--dir", help="where the cluster lives (default: a new temporary directory)")
    args = p.parse_args(argv)
    unknown = [t for t in args.types.split(",") if t and t not in FAULTS]
    if unknown:
        p.error(f"unknown fault types {unknown}: pick from {', '.join(FAULTS)}")
    if args.injections is None:
        types = [t for t in args.types.split(",") if t] or FAULTS
        args.injections = max(2 * len(types), 0 if args.types else 20)
    if args.proxies < 2:
        p.error("--proxies must be at least 2 (subscribers sit on another proxy than their publisher)")
    try:
        return run(args)
    except ChaosError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
