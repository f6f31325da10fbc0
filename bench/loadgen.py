"""The load generator: runs one benchmark scenario against a broker on 127.0.0.1.

``bench/compare.py`` starts it as its own process, pinned with ``taskset`` to
the core the broker does not use::

    python -m bench.loadgen --port 1883 --scenario 1 [--scale 0.1] [--cap 20]
                            [--broker-pid PID] [--params '{"messages": 300}']

and reads one JSON object from its stdout: the scenario's figures, the counts
behind them (sent, expected, delivered, duplicates), whether the run was
``partial`` (hit the time cap before finishing), and the CPU shares of the
generator and the broker during the measured phase (a generator close to 1.0
would mean the generator, not the broker, was the limit).

    python -m bench.loadgen --jitter 2     # only the host's timer wake-up lateness

Payloads are 16 bytes: publisher index, sequence number (both u32) and a send
timestamp (i64 ns, latency scenario only), so the subscriber side counts
unique deliveries, duplicates and loss exactly. All clients send the username
``bench`` (no password): amqtt keeps offline messages only for sessions that
are not anonymous.
"""

import argparse
import json
import os
import resource
import select
import struct
import sys
import time

from bench.netloop import Conn, Loop, pre_encode, stream_refill
from mqtt_proxy.codec import (
    MQTT_3_1_1, Connect, Subscribe, Subscription, SubscriptionOptions, encode, encode_publish,
)

USER = "bench"
KEEPALIVE = 300
SETUP_TIMEOUT = 60.0
_TICKS = os.sysconf("SC_CLK_TCK")

# Defaults per scenario; ``--scale`` multiplies the keys in SCALED (with a floor).
SCENARIOS = {
    1: {"messages": 200_000, "publishers": 4, "qos": 0, "window": 0},
    2: {"messages": 200_000, "publishers": 4, "qos": 1, "window": 100, "batch_ms": 0.3},
    3: {"messages": 2_000, "subscribers": 500, "batch_ms": 20},
    4: {"rate": 1_000, "seconds": 5.0, "window": 100},
    5: {"connections": 10_000, "window": 100},
    6: {"messages": 100_000, "publishers": 4, "window": 100, "batch_ms": 0.3},
    7: {"messages": 100_000, "publishers": 4, "filters": 10_000, "filters_per_conn": 100},
    8: {"sessions": 10_000, "messages": 1_000, "payload": 200, "window": 100, "sample": 20,
        "rss_cap_mb": 2_000},
}
# ``batch_ms``: the generator polls its sockets at most once per that many ms while receiving (see
# ``Loop.batch``): each read and write then carries many packets, which keeps one Python process ahead of
# Mosquitto (with 0, it used 90-97% of its core on scenarios 2, 3 and 6's drain). 0.3 ms delays a QoS 1
# acknowledgement by at most that, far inside every broker's in-flight window of 100.
SCALED = {"messages": 40, "connections": 10, "filters": 100, "seconds": 0.2, "sessions": 10}


def params_for(scenario, scale=1.0, overrides=None):
    """The parameters of ``scenario`` after ``scale`` and explicit ``overrides``."""
    params = dict(SCENARIOS[scenario])
    for key, floor in SCALED.items():
        if key in params and scale != 1.0:
            value = max(floor, params[key] * scale)
            params[key] = value if key == "seconds" else int(value)
    params.update(overrides or {})
    return params


def rss_bytes(pid):
    """Resident set size of ``pid`` from /proc/PID/status (VmRSS), in bytes; None if unknown."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def connect_packet(client_id, clean=True):
    """The CONNECT every benchmark client sends (MQTT 3.1.1, username ``bench``, keep-alive 300 s)."""
    return encode(Connect(client_id=client_id, clean_start=clean, keep_alive=KEEPALIVE, username=USER),
                  MQTT_3_1_1)


def subscribe_packet(packet_id, filters):
    """SUBSCRIBE for ``filters``, a list of (filter, qos) pairs."""
    subs = tuple(Subscription(f, SubscriptionOptions(qos=q)) for f, q in filters)
    return encode(Subscribe(packet_id=packet_id, subscriptions=subs), MQTT_3_1_1)


def _client(name, client_id, subscriptions=(), clean=True, per_packet=100):
    conn = Conn(name)
    conn.connect_packet = connect_packet(client_id, clean)
    subs = list(subscriptions)
    conn.sub_packets = [subscribe_packet(k // per_packet + 1, subs[k:k + per_packet])
                        for k in range(0, len(subs), per_packet)]
    return conn


def _publisher(index, count, qos, window, prefix, topic=None, payload=16):
    conn = _client(f"pub{index}", f"{prefix}-pub{index}")
    conn.stream, conn.plen = pre_encode(topic or f"dev/p{index}/temp", index, count, qos, payload=payload)
    conn.limit, conn.window = count, window
    return conn


def _setup(loop, conns):
    if not loop.open_many(conns, time.monotonic() + SETUP_TIMEOUT):
        raise SystemExit(_fail(loop, f"setup: {loop.ready_count} of {len(conns)} clients ready"))


def _fail(loop, why):
    print(json.dumps({"error": why, "errors": loop.errors[:5]}))
    return 2


def _unsent(conn):
    return -(-len(conn.out) // conn.plen) if conn.plen else 0


def _all_sent(conn):
    return (conn.sent >= conn.limit and not conn.out
            and (not conn.window or conn.acks >= conn.sent))


def cpu_seconds(pid):
    """User + system CPU time of ``pid`` (all its threads) from /proc/PID/stat; None if unknown."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def machine_busy_seconds():
    """CPU seconds all CPUs spent busy (user, nice, system, irq, softirq, steal), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICKS


class _CpuClock:
    """Wall time, and this process's and the broker's CPU time, from ``start`` on.

    A share near 1.0 means that process was busy all the time: for the broker,
    that it set the pace; for the generator, that the figure may be the
    generator's limit rather than the broker's.
    """

    def __init__(self, broker_pid=None):
        self.broker_pid = broker_pid

    def start(self):
        self.t0, self.c0 = time.monotonic(), time.process_time()
        self.b0 = cpu_seconds(self.broker_pid)
        self.m0 = machine_busy_seconds()
        return self

    def shares(self):
        """``{"gen_cpu", "broker_cpu", "other_cpu"}`` in cores since ``start`` (None if unknown).

        ``other_cpu`` is what every other process on the machine used meanwhile.
        """
        wall = time.monotonic() - self.t0
        if wall <= 0:
            return {"gen_cpu": 0.0, "broker_cpu": None, "other_cpu": None}
        gen = (time.process_time() - self.c0) / wall
        b1 = cpu_seconds(self.broker_pid)
        broker = (b1 - self.b0) / wall if b1 is not None and self.b0 is not None else None
        m1 = machine_busy_seconds()
        other = None
        if m1 is not None and self.m0 is not None and broker is not None:
            other = max(0.0, (m1 - self.m0) / wall - gen - broker)
        return {"gen_cpu": round(gen, 3), "broker_cpu": None if broker is None else round(broker, 3),
                "other_cpu": None if other is None else round(other, 3)}


def _max_shares(a, b):
    """The larger CPU share of two phases, per process."""
    return {k: max((v for v in (a.get(k), b.get(k)) if v is not None), default=None)
            for k in ("gen_cpu", "broker_cpu", "other_cpu")}


class _Stall:
    """Decides when a broker has stopped delivering for good, so a run can end before its cap.

    Stalled means: no new delivery for ``idle`` seconds, and then, over another
    ``idle`` seconds, still none while the broker process used less than a
    tenth of a core (a broker that is busy is slow, not stalled). What is
    missing after a stall is loss; what is missing at the cap is not.
    """

    def __init__(self, loop, idle):
        self.loop, self.idle = loop, idle
        self.count = -1
        self.at = time.monotonic()
        self.cpu_at = None        # (time, broker CPU seconds) when the quiet period began

    def __call__(self, count):
        now = time.monotonic()
        if count != self.count:
            self.count, self.at, self.cpu_at = count, now, None
            return False
        if now - self.at <= self.idle:
            return False
        busy = cpu_seconds(self.loop.broker_pid)
        if self.cpu_at is None:
            self.cpu_at = (now, busy)
            return False
        t0, c0 = self.cpu_at
        if now - t0 <= self.idle:
            return False
        if busy is not None and c0 is not None and busy - c0 > 0.1 * (now - t0):
            self.at, self.cpu_at = now, None  # still working: keep waiting (up to the cap)
            return False
        return True


def _flow(loop, pubs, fanout, cap, idle=1.5, abort=None):
    """Stream every publisher's packets, then wait for delivery; bounded by ``cap`` seconds.

    Returns the counts and whether the run is partial: not everything sent
    within the cap, or deliveries still arriving when the cap was reached, or
    ``abort()`` (polled while sending) returned a reason to stop. A
    broker that stops delivering after the last send (see ``_Stall``) ends the
    run early: what is missing is then loss, not slowness.
    """
    cpu = _CpuClock(loop.broker_pid).start()
    start = time.monotonic()
    loop.send_deadline = start + cap
    loop.last_rx = loop.last_ack = start
    base = loop.delivered
    for p in pubs:
        p.refill = stream_refill
        loop.flush(p)
    stall = _Stall(loop, idle)
    marks = {"stalled": False, "aborted": None}

    def done():
        if abort is not None:
            marks["aborted"] = abort()
            if marks["aborted"]:
                loop.send_deadline = time.monotonic()  # stop sending: the publishers' refill checks it
                return True
        all_sent = all(_all_sent(p) for p in pubs)
        delivered = loop.delivered - base
        if all_sent and delivered >= sum(p.sent for p in pubs) * fanout:
            return True
        if loop.errors:
            return True
        if all_sent or time.monotonic() >= loop.send_deadline:
            if stall(delivered):
                marks["stalled"] = True
                return True
        return False

    loop.poll_until(done, start + cap)
    shares = cpu.shares()
    sent = sum(p.sent - _unsent(p) for p in pubs)
    delivered = loop.delivered - base
    acked = sum(p.acks for p in pubs)
    elapsed = (loop.last_rx - start) if delivered else (time.monotonic() - start)
    all_sent = all(_all_sent(p) for p in pubs)
    complete = all_sent and delivered >= sent * fanout
    partial = not complete and not marks["stalled"] and not loop.errors or bool(marks["aborted"])
    ack_elapsed = loop.last_ack - start
    return {
        "sent": sent, "expected": sent * fanout, "delivered": delivered,
        "acked": acked, "elapsed_s": round(elapsed, 4),
        "rate": delivered / elapsed if elapsed > 0 else 0.0,
        "accept_rate": acked / ack_elapsed if acked and ack_elapsed > 0 else None,
        "loss_pct": None if partial else 100.0 * (sent * fanout - delivered) / max(1, sent * fanout),
        "partial": partial, "aborted": marks["aborted"], **shares,
    }


def _subscriber_stats(subs):
    return {"duplicates": sum(s.dups for s in subs), "malformed": sum(s.bad for s in subs)}


def fan_in(loop, p, cap, prefix):
    """Scenarios 1 and 2: publishers -> one subscriber on dev/+/temp."""
    npub, qos = p["publishers"], p["qos"]
    per = max(1, p["messages"] // npub)
    # ``sub_clean: false`` puts the subscriber on a persistent session: its offsets and in-flight
    # QoS 1 state then go to the durable KV (what stall_bench measures with kv_sync on).
    sub = _client("sub", f"{prefix}-sub", [("dev/+/temp", qos)], clean=p.get("sub_clean", True))
    sub.expect(npub, per)
    pubs = [_publisher(i, per, qos, p["window"], prefix) for i in range(npub)]
    _setup(loop, [sub] + pubs)
    loop.batch = p.get("batch_ms", 0) / 1000.0
    r = _flow(loop, pubs, 1, cap)
    loop.batch = 0.0
    r.update(_subscriber_stats([sub]))
    r["figures"] = {"rate": r["rate"], "accept_rate": r["accept_rate"], "loss": r["loss_pct"]}
    return r


def fan_out(loop, p, cap, prefix):
    """Scenario 3: one QoS 0 publisher -> N subscribers on dev/#."""
    n = p["messages"]
    subs = []
    for i in range(p["subscribers"]):
        s = _client(f"sub{i}", f"{prefix}-sub{i}", [("dev/#", 0)])
        s.expect(1, n)
        subs.append(s)
    pub = _publisher(0, n, 0, 0, prefix)
    _setup(loop, subs + [pub])
    loop.batch = p["batch_ms"] / 1000.0
    r = _flow(loop, [pub], len(subs), cap)
    loop.batch = 0.0
    r.update(_subscriber_stats(subs))
    r["figures"] = {"rate": r["rate"], "loss": r["loss_pct"]}
    return r


def latency(loop, p, cap, prefix):
    """Scenario 4: QoS 1 at a fixed rate; send-to-delivery latency at the subscriber."""
    rate, count = p["rate"], max(1, int(p["rate"] * p["seconds"]))
    sub = _client("sub", f"{prefix}-sub", [("dev/+/temp", 1)])
    sub.expect(1, count)
    sub.lat = []
    pub = _client("pub0", f"{prefix}-pub0")
    _setup(loop, [sub, pub])
    head = encode_publish("dev/p0/temp", bytes(16), 1, packet_id=1)[:-18]
    pack = struct.Struct(">HIIq").pack
    cpu = _CpuClock(loop.broker_pid).start()
    start = time.monotonic()
    deadline = start + cap
    sent = 0
    for i in range(count):
        target = start + i / rate
        loop.poll_until(lambda: time.monotonic() >= target and pub.acks > sent - p["window"],
                        deadline, every=0.0005)
        if time.monotonic() >= deadline or loop.errors:
            break
        loop.write(pub, head + pack(i % 65535 + 1, 0, i, time.monotonic_ns()))
        sent += 1
    loop.poll_until(lambda: sub.uniq >= sent or loop.errors, min(deadline, time.monotonic() + 5.0))
    lat = sorted(sub.lat)
    def pick(q):
        return lat[min(len(lat) - 1, int(q * (len(lat) - 1) + 0.5))] / 1e6 if lat else None
    partial = sent < count or (sub.uniq < sent and not loop.errors and time.monotonic() >= deadline)
    r = {"sent": sent, "expected": sent, "delivered": sub.uniq, "acked": pub.acks,
         "partial": partial, **cpu.shares(), **_subscriber_stats([sub])}
    loss = None if partial else 100.0 * (sent - sub.uniq) / max(1, sent)
    r["figures"] = {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": pick(1.0), "loss": loss}
    return r


def idle_connections(loop, p, cap, prefix, broker_pid):
    """Scenario 5: open N idle connections; connect rate and broker RSS per connection."""
    n = p["connections"]
    conns = [_client(f"idle{i}", f"{prefix}-idle{i}") for i in range(n)]
    rss0 = rss_bytes(broker_pid)
    cpu = _CpuClock(loop.broker_pid).start()
    start = time.monotonic()
    loop.open_many(conns, start + cap, window=p["window"])
    elapsed = time.monotonic() - start
    shares = cpu.shares()
    ready = loop.ready_count
    loop.poll_until(lambda: False, time.monotonic() + 1.0)  # let the broker settle
    rss1 = rss_bytes(broker_pid)
    per_conn = (rss1 - rss0) / ready if ready and rss0 is not None and rss1 is not None else None
    return {"sent": n, "expected": n, "delivered": ready, "partial": ready < n,
            "rss_before": rss0, "rss_after": rss1, **shares,
            "figures": {"rss_per_conn": per_conn, "connect_rate": ready / elapsed if elapsed > 0 else 0.0}}


def offline_session(loop, p, cap, prefix, broker_pid):
    """Scenario 6: QoS 1 messages pile up for an offline persistent subscriber, which then drains them."""
    npub = p["publishers"]
    per = max(1, p["messages"] // npub)
    client_id = f"{prefix}-offline"
    sub = _client("offline-sub", client_id, [("dev/+/temp", 1)], clean=False)
    _setup(loop, [sub])
    loop.close(sub, graceful=True)
    loop.poll_until(lambda: False, time.monotonic() + 0.5)
    rss0 = rss_bytes(broker_pid)
    pubs = [_publisher(i, per, 1, p["window"], prefix) for i in range(npub)]
    _setup(loop, pubs)
    r = _flow(loop, pubs, 0, cap)
    loop.poll_until(lambda: False, time.monotonic() + 1.0)
    rss1 = rss_bytes(broker_pid)
    for pub in pubs:
        loop.close(pub, graceful=True)
    back = _client("offline-sub-back", client_id, clean=False)
    back.expect(npub, per)
    acked = r["acked"]
    cpu = _CpuClock(loop.broker_pid).start()
    start = time.monotonic()
    loop.last_rx = start
    loop.open(back)
    loop.batch = p.get("batch_ms", 0) / 1000.0
    stall = _Stall(loop, p.get("idle", 1.5))
    marks = {"stalled": False}

    def drained():
        if back.uniq >= acked or loop.errors:
            return True
        marks["stalled"] = stall(back.uniq)
        return marks["stalled"]

    loop.poll_until(drained, start + cap)
    loop.batch = 0.0
    drain_s = (loop.last_rx - start) if back.uniq else None
    # Still delivering when the cap struck: slow, not lossy. Stalled: what is missing is lost.
    drain_capped = back.uniq < acked and not loop.errors and not marks["stalled"]
    partial = r["partial"] or drain_capped
    growth = (rss1 - rss0) if rss0 is not None and rss1 is not None else None
    return {"sent": r["sent"], "expected": acked, "delivered": back.uniq, "acked": acked,
            "session_present": back.session_present, "publish_rate": r["accept_rate"],
            "rss_before": rss0, "rss_offline": rss1, "partial": partial, "drain_partial": drain_capped,
            **_max_shares(r, cpu.shares()), **_subscriber_stats([back]),
            "figures": {"drain_s": drain_s, "rss_growth": growth, "accept_rate": r["accept_rate"],
                        "loss": None if drain_capped else 100.0 * (acked - back.uniq) / max(1, acked)}}


def wildcard_filters(loop, p, cap, prefix):
    """Scenario 7: fan-in to dev/+/temp while N other distinct filters under dev/ match nothing."""
    nf, chunk = p["filters"], p["filters_per_conn"]
    filters = [(f"dev/n{i}/+" if i % 2 == 0 else f"dev/+/t{i}", 0) for i in range(nf)]
    holders = [_client(f"filters{k}", f"{prefix}-filters{k}", filters[k:k + chunk])
               for k in range(0, nf, chunk)]
    start = time.monotonic()
    _setup(loop, holders)
    subscribe_s = time.monotonic() - start
    r = fan_in(loop, {**p, "qos": 0, "window": 0}, cap, prefix)
    r["filters"] = nf
    r["subscribe_s"] = round(subscribe_s, 3)
    return r


def disk_bytes(path):
    """Bytes allocated on disk under ``path`` (st_blocks, so sparse or preallocated files count as written)."""
    if not path:
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def offline_fan_out(loop, p, cap, prefix, broker_pid, workdir=None):
    """Scenario 8: N offline persistent sessions on one filter; one publisher sends QoS 1 messages to them.

    Every session subscribes to ``fleet/+/cmd`` at QoS 1 with clean session off and
    disconnects; then one publisher sends ``messages`` QoS 1 PUBLISHes of ``payload``
    bytes to ``fleet/all/cmd``, each one owed to every session. Figures: PUBLISHes
    accepted (PUBACKed) per second, the broker's RSS growth and the bytes its working
    directory gained on disk, from before the publishing to 1 s after the last PUBACK.
    Then ``sample`` sessions come back and count what they receive (loss against
    the PUBACKed messages). The send stops early if the broker's RSS grows by more
    than ``rss_cap_mb`` (a broker that queues a copy per session can exhaust the machine).
    """
    n, count = p["sessions"], p["messages"]
    sessions = [_client(f"sess{i}", f"{prefix}-sess{i}", [("fleet/+/cmd", 1)], clean=False) for i in range(n)]
    start = time.monotonic()
    if not loop.open_many(sessions, start + max(cap, SETUP_TIMEOUT), window=p["window"]) \
            and (loop.errors or not loop.ready_count):
        raise SystemExit(_fail(loop, f"setup: {loop.ready_count} of {n} sessions subscribed"))
    setup_s = time.monotonic() - start
    # A broker too slow to subscribe every session in time runs with those it did (marked partial).
    ready = [conn for conn in sessions if conn.ready]
    for conn in sessions:
        if conn.sock is not None:  # the rest were never opened
            loop.close(conn, graceful=True)
    loop.poll_until(lambda: False, time.monotonic() + 1.0)  # let the broker see every DISCONNECT
    rss0, disk0 = rss_bytes(broker_pid), disk_bytes(workdir)
    cap_bytes = p["rss_cap_mb"] * 1_000_000
    checked = {"at": 0.0}

    def too_big():
        now = time.monotonic()
        if now - checked["at"] < 0.2 or rss0 is None:
            return None
        checked["at"] = now
        rss = rss_bytes(broker_pid)
        if rss is not None and rss - rss0 > cap_bytes:
            return f"broker RSS grew by more than {p['rss_cap_mb']:,} MB: sending stopped"
        return None

    pub = _publisher(0, count, 1, p["window"], prefix, topic="fleet/all/cmd", payload=p["payload"])
    _setup(loop, [pub])
    r = _flow(loop, [pub], 0, cap, abort=too_big)
    loop.poll_until(lambda: False, time.monotonic() + 1.0)
    rss1, disk1 = rss_bytes(broker_pid), disk_bytes(workdir)
    loop.close(pub, graceful=True)
    acked = r["acked"]
    back = []
    for i in range(min(p["sample"], len(ready))):
        conn = _client(f"back{i}", f"{prefix}-{ready[i].name}", clean=False)
        conn.expect(1, count)
        back.append(conn)
    loop.batch = 0.0003
    loop.open_many(back, time.monotonic() + cap, window=p["window"])
    stall = _Stall(loop, 1.5)
    loop.poll_until(lambda: all(b.uniq >= acked for b in back) or loop.errors or stall(loop.delivered),
                    time.monotonic() + cap)
    loop.batch = 0.0
    got = sum(min(b.uniq, acked) for b in back)
    want = acked * len(back)
    growth = (rss1 - rss0) if rss0 is not None and rss1 is not None else None
    disk = (disk1 - disk0) if disk0 is not None and disk1 is not None else None
    return {"sent": r["sent"], "expected": want, "delivered": got, "acked": acked, "sessions": len(ready),
            "setup_s": round(setup_s, 3), "rss_before": rss0, "rss_after": rss1, "disk_before": disk0,
            "disk_after": disk1, "partial": r["partial"] or len(ready) < n, "aborted": r["aborted"],
            "gen_cpu": r["gen_cpu"], "broker_cpu": r["broker_cpu"], "other_cpu": r["other_cpu"],
            **_subscriber_stats(back),
            "figures": {"accept_rate": r["accept_rate"], "rss_growth": growth, "disk_growth": disk,
                        "loss": None if r["partial"] else 100.0 * (want - got) / max(1, want)}}


def run(scenario, port, params, cap, broker_pid=None, workdir=None):
    """Run ``scenario`` against the broker on ``port``; return its result dict."""
    prefix = f"b{scenario}-{int(time.time() * 1000) % 100000}"
    loop = Loop(port)
    loop.broker_pid = broker_pid
    try:
        if scenario in (1, 2):
            result = fan_in(loop, params, cap, prefix)
        elif scenario == 3:
            result = fan_out(loop, params, cap, prefix)
        elif scenario == 4:
            result = latency(loop, params, cap, prefix)
        elif scenario == 5:
            result = idle_connections(loop, params, cap, prefix, broker_pid)
        elif scenario == 6:
            result = offline_session(loop, params, cap, prefix, broker_pid)
        elif scenario == 7:
            result = wildcard_filters(loop, params, cap, prefix)
        elif scenario == 8:
            result = offline_fan_out(loop, params, cap, prefix, broker_pid, workdir)
        else:
            raise ValueError(f"no scenario {scenario}")
    finally:
        errors = loop.errors[:5]
        loop.close_all()
    result["errors"] = errors
    result["scenario"] = scenario
    result["params"] = params
    return result


def raise_nofile():
    """Raise RLIMIT_NOFILE to the hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def timer_jitter(seconds=2.0, period=0.001):
    """How late 1 ms epoll timeouts wake this process: the floor under any latency figure here.

    Returns lateness percentiles in ms (wake-up time minus the requested
    ``period``); a loaded or virtualised host shows it in p99 and max.
    """
    ep = select.epoll()
    late = []
    end = time.monotonic() + seconds
    prev = time.monotonic_ns()
    for _ in range(int(seconds / period) + 1):
        if time.monotonic() >= end:
            break
        ep.poll(period)
        now = time.monotonic_ns()
        late.append(max(0, now - prev - int(period * 1e9)))
        prev = now
    ep.close()
    late.sort()
    n = len(late)
    return {"samples": n, "p50_ms": late[n // 2] / 1e6, "p99_ms": late[int(0.99 * (n - 1))] / 1e6,
            "max_ms": late[-1] / 1e6}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jitter", type=float, default=0.0,
                        help="only measure timer wake-up lateness for this many seconds, print it and exit")
    parser.add_argument("--port", type=int)
    parser.add_argument("--scenario", type=int, choices=sorted(SCENARIOS))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--cap", type=float, default=20.0, help="seconds of sending per phase")
    parser.add_argument("--broker-pid", type=int, default=0)
    parser.add_argument("--params", default="{}", help="JSON overrides of the scenario parameters")
    parser.add_argument("--workdir", default=None, help="the broker's working directory (disk use, scenario 8)")
    args = parser.parse_args(argv)
    if args.jitter:
        print(json.dumps(timer_jitter(min(args.jitter, 10.0))))
        return 0
    if args.port is None or args.scenario is None:
        parser.error("--port and --scenario are required")
    raise_nofile()
    params = params_for(args.scenario, args.scale, json.loads(args.params))
    result = run(args.scenario, args.port, params, args.cap, args.broker_pid, args.workdir)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
