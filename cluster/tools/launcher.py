"""``./dev cluster up DIR`` / ``./dev cluster down DIR``: a local cluster of real processes on 127.0.0.1.

``up`` picks free ports, writes ``DIR/cluster.toml`` (the membership every
process reads: broker groups and their RPC addresses, and the controllers'
RPC addresses), starts the controllers (3 unless ``--controllers`` says
otherwise; 0: static membership only), then the brokers, waiting for each
``twistmq ready`` line, then the proxies and the admin process the same way, and writes
``DIR/cluster.json`` (DESIGN's contract: role, id, pid, group, ports,
data_dir, argv per process; a controller's ports are ``http``, ``rpc`` and
``raft``). Brokers and proxies register with the controllers and heartbeat. Every port is fixed in ``argv``, so
relaunching a killed process with its ``argv`` brings it back as the same
member. Each proxy gets its own MQTT and native port unless ``--shared-port``
puts them all on one (``reuseport=yes``: the kernel spreads clients).
``down`` sends SIGTERM to every process (proxies first), then SIGKILL to any
left after 10 s.

With controllers, one ``admin`` process (role ``"admin"``, an ``http`` port; ``--no-admin``: none)
starts last: the admin API and dashboard for the whole cluster, gathering clients from the proxies on
their ``rpc`` ports. Every broker has an ``ha`` port (replication). With ``--replicas N`` each group
has N brokers (``broker-gG-1`` ... ``-N``): the first starts as the group's
master (its config names no master: that decides only its first start, before it
has an epoch file), the others as its slaves (``--ha-master``); the membership
lists the master first, which proxies use. ``up`` returns once every master's
SyncStateSet (``twistmq_ha_sync_state_set`` on its /metrics) holds all N.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

READY = re.compile(r"twistmq ready (.*)")
STOP_GRACE_S = 10.0
READY_TIMEOUT_S = 60.0


class LaunchError(Exception):
    """The cluster could not be started (one line for the operator)."""


def twistd() -> str:
    return os.path.join(os.path.dirname(sys.executable), "twistd")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def endpoint(port: int, shared: bool = False) -> str:
    return f"tcp:{port}:interface=127.0.0.1" + (":reuseport=yes" if shared else "")


def plan(root: str, groups: int, proxies: int, shared_port: bool, cluster_id: str, controllers: int = 0,
         replicas: int = 1, admin: bool = True) -> list[dict]:
    """The processes to start, controllers first, then brokers (each group's master first), proxies and (with
    controllers) the admin process: role, id, group, ports, data_dir and argv of each."""
    procs: list[dict] = []
    ports = iter(free_ports(controllers * 3 + groups * replicas * 3 + proxies * 4 + 3))
    raft = [next(ports) for _ in range(controllers)]
    for c in range(1, controllers + 1):
        member = f"controller-{c}"
        p = {"rpc": next(ports), "http": next(ports), "raft": raft[c - 1]}
        data_dir = os.path.join(root, member)
        peers = [arg for n, other in enumerate(raft, 1) if other != p["raft"]
                 for arg in ("--peer", f"controller-{n}=127.0.0.1:{other}")]
        argv = [twistd(), "-n", "--pidfile=", "twistmq", "controller", "--config", os.path.join(root, "cluster.toml"),
                "--data-dir", data_dir, "--node-id", member, "--raft", f"127.0.0.1:{p['raft']}", *peers,
                "--rpc", endpoint(p["rpc"]), "--http", endpoint(p["http"])]
        procs.append({"role": "controller", "id": member, "ports": p, "data_dir": data_dir, "argv": argv})
    for g in range(1, groups + 1):
        group = f"g{g}"
        master_ha = None
        for r in range(1, replicas + 1):
            member = f"broker-g{g}" if replicas == 1 else f"broker-g{g}-{r}"
            p = {"rpc": next(ports), "http": next(ports), "ha": next(ports)}
            data_dir = os.path.join(root, member)
            argv = [twistd(), "-n", "--pidfile=", "twistmq", "broker", "--config", os.path.join(root, "cluster.toml"),
                    "--data-dir", data_dir, "--node-id", member, "--group", group,
                    "--rpc", endpoint(p["rpc"]), "--http", endpoint(p["http"]), "--ha", endpoint(p["ha"])]
            if master_ha is None:
                master_ha = p["ha"]
            else:
                argv += ["--ha-master", f"tcp:127.0.0.1:{master_ha}"]
            procs.append({"role": "broker", "id": member, "group": group, "ports": p, "data_dir": data_dir,
                          "argv": argv, **({"master": True} if r == 1 else {})})
    shared = {"mqtt": next(ports), "native": next(ports)}
    for n in range(1, proxies + 1):
        member = f"proxy-{n}"
        p = dict(shared) if shared_port else {"mqtt": next(ports), "native": next(ports)}
        p["http"] = next(ports)
        p["rpc"] = next(ports)  # the admin process gathers this proxy's clients there
        data_dir = os.path.join(root, member)
        argv = [twistd(), "-n", "--pidfile=", "twistmq", "proxy", "--config", os.path.join(root, "cluster.toml"),
                "--data-dir", data_dir, "--node-id", member,
                "--mqtt", endpoint(p["mqtt"], shared_port), "--native", endpoint(p["native"], shared_port),
                "--http", endpoint(p["http"]), "--rpc", endpoint(p["rpc"])]
        procs.append({"role": "proxy", "id": member, "ports": p, "data_dir": data_dir, "argv": argv})
    if admin and controllers:
        p = {"http": next(ports)}
        data_dir = os.path.join(root, "admin")
        argv = [twistd(), "-n", "--pidfile=", "twistmq", "admin", "--config", os.path.join(root, "cluster.toml"),
                "--node-id", "admin", "--http", endpoint(p["http"])]
        procs.append({"role": "admin", "id": "admin", "ports": p, "data_dir": data_dir, "argv": argv})
    return procs


def membership_toml(cluster_id: str, procs: list[dict], base: str = "", cluster_settings: dict | None = None) -> str:
    """The config every process reads: ``base`` (an operator's file, if any) plus the ``[cluster]`` section, with
    ``cluster_settings`` (more ``[cluster]`` keys: numbers, booleans, strings) in it."""
    if re.search(r"^\s*\[cluster\]", base, re.M):
        raise LaunchError("the base config has a [cluster] section: the launcher writes that one itself")
    lines = [base.rstrip(), "", "[cluster]", f'cluster_id = "{cluster_id}"', ""] if base.strip() else \
        ["[cluster]", f'cluster_id = "{cluster_id}"', ""]
    lines[-1:-1] = [f"{key} = {json.dumps(value)}" for key, value in (cluster_settings or {}).items()]
    controllers = [f'"tcp:127.0.0.1:{p["ports"]["rpc"]}"' for p in procs if p["role"] == "controller"]
    if controllers:
        lines[-1:-1] = [f"controllers = [{', '.join(controllers)}]"]
    for p in procs:
        if p["role"] in ("controller", "admin"):
            continue
        lines.append("[[cluster.members]]")
        lines.append(f'id = "{p["id"]}"')
        lines.append(f'role = "{p["role"]}"')
        if p["role"] == "broker":
            lines.append(f'group = "{p["group"]}"')
            lines.append(f'rpc = "tcp:127.0.0.1:{p["ports"]["rpc"]}"')
        lines.append("")
    return "\n".join(lines)


def start(proc: dict, timeout: float = READY_TIMEOUT_S) -> None:
    """Start one process detached (its own session), output in its data dir's parent; wait for its ready line."""
    os.makedirs(proc["data_dir"], exist_ok=True)
    out_path = proc["data_dir"] + ".out"
    err_path = proc["data_dir"] + ".log"
    with open(out_path, "ab") as out, open(err_path, "ab") as err:
        start_at = out.tell()
        child = subprocess.Popen(proc["argv"], stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd="/",
                                 start_new_session=True)
    proc["pid"] = child.pid
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(out_path, "rb") as f:
            f.seek(start_at)
            if READY.search(f.read().decode(errors="replace")):
                return
        if child.poll() is not None:
            raise LaunchError(f"{proc['id']} exited with code {child.returncode}: {_tail(err_path)}")
        time.sleep(0.05)
    child.kill()
    raise LaunchError(f"{proc['id']} was not ready after {timeout:.0f} s: {_tail(err_path)}")


def sync_state_set_size(proc: dict) -> int:
    """How many replicas a master's SyncStateSet holds, from its /metrics (0 if it does not say)."""
    url = f"http://127.0.0.1:{proc['ports']['http']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("twistmq_ha_sync_state_set "):
                return int(float(line.split()[1]))
    return 0


def wait_for_sync_state_set(proc: dict, replicas: int, timeout: float = READY_TIMEOUT_S) -> None:
    """Wait until the master ``proc``'s SyncStateSet holds all ``replicas`` of its group."""
    deadline = time.monotonic() + timeout
    size = 0
    while time.monotonic() < deadline:
        size = sync_state_set_size(proc)
        if size >= replicas:
            return
        time.sleep(0.1)
    raise LaunchError(f"{proc['id']}'s SyncStateSet holds {size} of {replicas} replicas after {timeout:.0f} s: "
                      f"{_tail(proc['data_dir'] + '.log')}")


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0): reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _dial_through(root: str, procs: list[dict], dial) -> None:
    """Each broker reads its own copy of ``DIR/cluster.toml`` (``DIR/ID.toml``) dialling each controller at
    ``dial(f"{ID}>{CONTROLLER}", port)`` and advertising its ``ha`` listener at ``dial(f"{ID}:ha", port)``,
    where a slave dials its master's too."""
    with open(os.path.join(root, "cluster.toml"), encoding="utf-8") as f:
        shared = f.read()
    controllers = [p for p in procs if p["role"] == "controller"]
    masters: dict[str, dict] = {}
    for p in procs:
        if p["role"] != "broker":
            continue
        dialled = ", ".join(f'"{dial(p["id"] + ">" + c["id"], c["ports"]["rpc"])}"' for c in controllers)
        text = re.sub(r"^controllers = \[.*\]$", f"controllers = [{dialled}]", shared, count=1, flags=re.MULTILINE)
        ha = dial(p["id"] + ":ha", p["ports"]["ha"])
        text = re.sub(r"^(cluster_id = .*)$", rf'\g<1>\nadvertise = {{ ha = "{ha}" }}', text, count=1,
                      flags=re.MULTILINE)
        path = os.path.join(root, p["id"] + ".toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        p["argv"][p["argv"].index("--config") + 1] = path
        master = masters.setdefault(p["group"], p)
        if "--ha-master" in p["argv"]:
            p["argv"][p["argv"].index("--ha-master") + 1] = dial(master["id"] + ":ha", master["ports"]["ha"])


def up(root: str, groups: int = 1, proxies: int = 2, replicas: int = 1, controllers: int = 3,
       shared_port: bool = False, base_config: str | None = None, admin: bool = True,
       cluster_settings: dict | None = None, dial=None) -> dict:
    """Start the cluster under ``root``; returns what ``cluster.json`` holds (``cluster_settings``: more
    ``[cluster]`` keys for every process, such as ``min_in_sync_replicas``).

    ``dial(link, port) -> "tcp:HOST:PORT"`` (optional): where a broker dials a link instead of
    ``127.0.0.1:port``, for a relay the caller runs in front of it (to cut that link alone): links
    ``"BROKER>CONTROLLER"`` (its RPC to each controller) and ``"BROKER:ha"`` (its ``ha`` listener, as
    its slaves dial it and as it advertises it)."""
    if controllers < 0:
        raise LaunchError("--controllers must be at least 0 (3 or 5 for a majority that survives a loss)")
    if replicas < 1:
        raise LaunchError("--replicas must be at least 1 (brokers per group: a master and its slaves)")
    if groups < 1 or proxies < 0:
        raise LaunchError("--groups must be at least 1 and --proxies at least 0")
    root = os.path.abspath(root)
    if os.path.exists(os.path.join(root, "cluster.json")):
        raise LaunchError(f"{root}/cluster.json exists: run `./dev cluster down {root}` first, or pick another DIR")
    if os.path.exists(os.path.join(root, "cluster.json.down")):
        # a new cluster (its own id, ports and shape) would start on the old one's data: its controllers' Raft
        # state names the old masters, and a broker of another shape waits as a slave of one that is gone
        raise LaunchError(f"{root} holds the data of a cluster brought down there ({root}/cluster.json.down): "
                          f"remove the directory or pick another DIR")
    os.makedirs(root, exist_ok=True)
    cluster_id = "local-" + secrets.token_hex(4)
    procs = plan(root, groups, proxies, shared_port, cluster_id, controllers, replicas, admin)
    base = ""
    if base_config:
        with open(base_config, encoding="utf-8") as f:
            base = f.read()
    with open(os.path.join(root, "cluster.toml"), "w", encoding="utf-8") as f:
        if replicas >= 3:  # DESIGN's default for groups of three: a master cut off from both slaves stops acknowledging
            cluster_settings = {"min_in_sync_replicas": 2, **(cluster_settings or {})}
        f.write(membership_toml(cluster_id, procs, base, cluster_settings))
    if dial is not None:
        _dial_through(root, procs, dial)
    started: list[dict] = []
    try:
        for proc in procs:
            start(proc)
            started.append(proc)
        for proc in procs:
            if proc.get("master"):
                wait_for_sync_state_set(proc, replicas)
    except BaseException:
        stop(started)
        raise
    doc = {"cluster_id": cluster_id, "processes": [
        {k: p[k] for k in ("role", "id", "pid", "group", "ports", "data_dir", "argv") if k in p} for p in procs]}
    _write_doc(root, doc)
    return doc


def stop(procs: list[dict], grace: float = STOP_GRACE_S) -> list[str]:
    """SIGTERM every process (proxies, then brokers, then controllers), SIGKILL those still alive after ``grace``;
    killed ids."""
    rank = {"admin": 0, "proxy": 0, "broker": 1, "controller": 2}
    order = sorted(procs, key=lambda p: rank.get(p["role"], 1))
    for p in order:
        try:
            os.kill(p["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p["pid"]) for p in order):
        time.sleep(0.05)
    killed = []
    for p in order:
        if alive(p["pid"]):
            os.kill(p["pid"], signal.SIGKILL)
            killed.append(p["id"])
    return killed


def _write_doc(root: str, doc: dict) -> None:
    tmp = os.path.join(root, "cluster.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, os.path.join(root, "cluster.json"))


def relaunch(root: str, member: str) -> dict:
    """Start ``member`` again from its argv (same id, same ports) and record its new pid in cluster.json."""
    root = os.path.abspath(root)
    with open(os.path.join(root, "cluster.json"), encoding="utf-8") as f:
        doc = json.load(f)
    procs = {p["id"]: p for p in doc["processes"]}
    if member not in procs:
        raise LaunchError(f"no member {member!r} in {root}/cluster.json")
    proc = procs[member]
    if alive(proc["pid"]):
        raise LaunchError(f"{member} is still running (pid {proc['pid']})")
    start(proc)
    _write_doc(root, doc)
    return proc


def down(root: str) -> list[str]:
    path = os.path.join(os.path.abspath(root), "cluster.json")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise LaunchError(f"no cluster at {root} ({path} not found)") from None
    killed = stop(doc["processes"])
    os.replace(path, path + ".down")
    return killed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev cluster", description="a local twistmq cluster on 127.0.0.1")
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start processes and write DIR/cluster.json")
    p_up.add_argument("dir")
    p_up.add_argument("--controllers", type=int, default=3, help="Raft controllers (default 3; 0: static membership)")
    p_up.add_argument("--groups", type=int, default=1)
    p_up.add_argument("--replicas", type=int, default=1)
    p_up.add_argument("--proxies", type=int, default=2)
    p_up.add_argument("--shared-port", action="store_true", help="all proxies on one MQTT/native port")
    p_up.add_argument("--config", help="a base TOML config every process reads (without [cluster])")
    p_up.add_argument("--no-admin", dest="admin", action="store_false",
                      help="start no admin process (one is started by default when there are controllers)")
    p_down = sub.add_parser("down", help="stop every process of DIR/cluster.json")
    p_down.add_argument("dir")
    p_re = sub.add_parser("relaunch", help="start a stopped member again from its argv (same id and ports)")
    p_re.add_argument("dir")
    p_re.add_argument("member")
    p_port = sub.add_parser("port", help="print one port of a member: ./dev cluster port DIR proxy-1 mqtt")
    p_port.add_argument("dir")
    p_port.add_argument("member")
    p_port.add_argument("kind", help="mqtt, native, http, rpc or raft")
    args = parser.parse_args(argv)
    if args.command == "port":
        try:
            with open(os.path.join(args.dir, "cluster.json"), encoding="utf-8") as f:
                procs = {p["id"]: p for p in json.load(f)["processes"]}
            print(procs[args.member]["ports"][args.kind])
            return 0
        except (OSError, KeyError, ValueError) as exc:
            print(f"twistmq cluster: no {args.kind} port of {args.member} in {args.dir}: {exc}", file=sys.stderr)
            return 2
    try:
        if args.command == "up":
            doc = up(args.dir, args.groups, args.proxies, args.replicas, args.controllers, args.shared_port,
                     args.config, args.admin)
            for p in doc["processes"]:
                ports = " ".join(f"{k}={v}" for k, v in p["ports"].items())
                print(f"{p['role']:10} {p['id']:12} pid={p['pid']} {ports}")
            print(f"cluster up: {os.path.join(os.path.abspath(args.dir), 'cluster.json')}")
        elif args.command == "relaunch":
            proc = relaunch(args.dir, args.member)
            print(f"{proc['role']:7} {proc['id']:12} pid={proc['pid']}")
        else:
            killed = down(args.dir)
            print("cluster down" + (f" (SIGKILL: {', '.join(killed)})" if killed else ""))
    except (LaunchError, OSError) as exc:
        print(f"twistmq cluster: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
