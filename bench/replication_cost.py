"""Replication cost end to end: a broker group of 1 and of 3 behind one proxy, fan-in QoS 1 and PUBACK latency.

Usage::

    ./dev python -m bench.replication_cost [--scale 0.25] [--cap 20] [--probes 500] [--reps 1]

For each group size a fresh cluster (``launcher.up(..., replicas=N, proxies=1,
controllers=0)``; groups of three run with ``min_in_sync_replicas = 2`` and
the default ``all_ack_in_sync_state_set = true``, so a PUBACK waits for both
slaves) is started on the same 2 cores as the load generator, and measured
twice:

- fan-in QoS 1 (``bench/loadgen.py`` scenario 2: 4 publishers, window 100,
  one ``dev/+/temp`` subscriber): delivered msg/s, and the PUBACK rate;
- PUBACK latency: one QoS 1 publisher (MQTT 3.1.1, raw socket), one message
  at a time, ``--probes`` messages: p50/p99 of publish-to-PUBACK in ms (the
  proxy hop, the master's write and, for 3, both slaves' acks).

The machine is shared and the three brokers of a group of 3 share its two
cores with the proxy and the generator: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import tempfile
import time
from pathlib import Path

from bench.cluster_bench import BASE_CONFIG, cpu_seconds, run_scenario
from cluster.tools import launcher


def _remaining(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the proxy closed the connection")
        out += chunk
    return out


def _packet(sock: socket.socket) -> tuple[int, bytes]:
    first = _remaining(sock, 1)[0]
    length, shift = 0, 0
    while True:
        b = _remaining(sock, 1)[0]
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return first, _remaining(sock, length)


def _with_length(first: int, body: bytes) -> bytes:
    n, out = len(body), bytearray([first])
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out) + body


def puback_latency(port: int, probes: int) -> tuple[float, float]:
    """p50 and p99 (ms) of publish-to-PUBACK, one QoS 1 message at a time."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client = b"repl-cost-probe"
    sock.sendall(_with_length(0x10, b"\x00\x04MQTT\x04\x02\x00\x3c" + struct.pack(">H", len(client)) + client))
    kind, _ = _packet(sock)
    assert kind == 0x20, f"no CONNACK: {kind:#x}"
    topic = b"probe/latency"
    samples = []
    for i in range(probes):
        pid = i % 65535 + 1
        packet = _with_length(0x32, struct.pack(">H", len(topic)) + topic + struct.pack(">H", pid) + b"x" * 16)
        t0 = time.perf_counter()
        sock.sendall(packet)
        while True:
            kind, body = _packet(sock)
            if kind == 0x40 and struct.unpack(">H", body[:2])[0] == pid:
                break
        samples.append((time.perf_counter() - t0) * 1000)
    sock.close()
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def measure(replicas: int, scale: float, cap: float, probes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="repl-cost-") as tmp:
        work = Path(tmp)
        (work / "base.toml").write_text(BASE_CONFIG)
        settings = {"min_in_sync_replicas": 2} if replicas >= 3 else {}
        doc = launcher.up(str(work / "c"), groups=1, proxies=1, replicas=replicas, controllers=0,
                          base_config=str(work / "base.toml"), cluster_settings=settings)
        try:
            proxy = next(p for p in doc["processes"] if p["role"] == "proxy")
            pids = [p["pid"] for p in doc["processes"] if p["role"] in ("broker", "proxy")]
            port = proxy["ports"]["mqtt"]
            cpu0 = cpu_seconds(pids)
            fan_in = run_scenario(2, port, scale, cap)
            cpu = cpu_seconds(pids) - cpu0
            p50, p99 = puback_latency(port, probes)
        finally:
            launcher.down(str(work / "c"))
    delivered = fan_in.get("delivered") or 0
    return {"replicas": replicas, "rate": (fan_in.get("figures") or {}).get("rate"),
            "accept_rate": fan_in.get("accept_rate"), "loss": fan_in.get("loss_pct"),
            "partial": fan_in.get("partial"), "error": fan_in.get("error"),
            "cpu_us": cpu / delivered * 1e6 if delivered else None, "p50_ms": p50, "p99_ms": p99}


def _fmt(value, digits=0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.25, help="loadgen --scale for the fan-in (default 0.25)")
    ap.add_argument("--cap", type=float, default=20.0, help="seconds a fan-in run may take")
    ap.add_argument("--probes", type=int, default=500, help="messages of the PUBACK latency probe")
    ap.add_argument("--reps", type=int, default=1, help="runs of each group size (medians shown)")
    args = ap.parse_args(argv)
    rows = []
    for replicas in (1, 3):
        runs = [measure(replicas, args.scale, args.cap, args.probes) for _ in range(args.reps)]
        med = {k: statistics.median([r[k] for r in runs if r[k] is not None] or [None]) if k not in ("error",)
               else runs[-1][k] for k in runs[0] if k not in ("partial",)}
        med["partial"] = any(r["partial"] for r in runs)
        rows.append(med)
    print("| group | fan-in QoS 1 msg/s | PUBACKs/s | loss % | CPU µs/msg (brokers+proxy) | PUBACK p50 ms | "
          "PUBACK p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {int(r['replicas'])} | {_fmt(r['rate'])}{' (partial)' if r['partial'] else ''} | "
              f"{_fmt(r['accept_rate'])} | {_fmt(r['loss'], 2)} | {_fmt(r['cpu_us'], 1)} | {_fmt(r['p50_ms'], 2)} | "
              f"{_fmt(r['p99_ms'], 2)} |" + (f" error: {r['error']}" if r['error'] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
