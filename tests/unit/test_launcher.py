"""The local-cluster launcher's plan: ports, argv and the membership config it writes (no processes)."""

from __future__ import annotations

import tomllib

import pytest

from cluster.tools import launcher


def test_plan_gives_every_process_fixed_ports_and_brokers_come_first(tmp_path):
    """Brokers precede proxies; every listener has its own fixed port, and argv names each one."""
    procs = launcher.plan(str(tmp_path), groups=2, proxies=2, shared_port=False, cluster_id="c")
    assert [p["role"] for p in procs] == ["broker", "broker", "proxy", "proxy"]
    ports = [port for p in procs for port in p["ports"].values()]
    assert len(ports) == len(set(ports)) and all(port > 0 for port in ports)
    for p in procs:
        for port in p["ports"].values():
            assert any(f"tcp:{port}:interface=127.0.0.1" in a for a in p["argv"])


def test_shared_port_puts_every_proxy_on_one_mqtt_port(tmp_path):
    """--shared-port: proxies list the same MQTT and native ports, bound with reuseport=yes."""
    procs = [p for p in launcher.plan(str(tmp_path), 1, 3, True, "c") if p["role"] == "proxy"]
    assert len({p["ports"]["mqtt"] for p in procs}) == 1 and len({p["ports"]["http"] for p in procs}) == 3
    assert all(any("reuseport=yes" in a for a in p["argv"]) for p in procs)


def test_membership_config_lists_groups_and_their_rpc_addresses(tmp_path):
    """cluster.toml parses as TOML and names each broker's group and RPC address."""
    procs = launcher.plan(str(tmp_path), 2, 1, False, "c")
    doc = tomllib.loads(launcher.membership_toml("c", procs, "[mqtt]\nallow_anonymous = true\n"))
    assert doc["cluster"]["cluster_id"] == "c" and doc["mqtt"]["allow_anonymous"] is True
    brokers = [m for m in doc["cluster"]["members"] if m["role"] == "broker"]
    assert [(m["group"], m["rpc"]) for m in brokers] == [
        (p["group"], f"tcp:127.0.0.1:{p['ports']['rpc']}") for p in procs if p["role"] == "broker"]
    with pytest.raises(launcher.LaunchError, match=r"\[cluster\]"):
        launcher.membership_toml("c", procs, "[cluster]\ncluster_id = 'x'\n")


def test_controllers_come_first_each_with_rpc_http_and_raft_ports(tmp_path):
    """With 3 controllers: they start first, each names the other two as peers (member id = Raft address, so
    cluster/members lists them by their cluster.json ids), and the membership config lists their RPC addresses
    as [cluster] controllers."""
    procs = launcher.plan(str(tmp_path), 1, 1, False, "c", controllers=3)
    controllers = [p for p in procs if p["role"] == "controller"]
    assert [p["role"] for p in procs[:3]] == ["controller"] * 3
    assert all(set(p["ports"]) == {"rpc", "http", "raft"} for p in controllers)
    for p in controllers:
        peers = [p2["argv"][i + 1] for p2 in [p] for i, a in enumerate(p2["argv"]) if a == "--peer"]
        assert sorted(peers) == sorted(f"{o['id']}=127.0.0.1:{o['ports']['raft']}" for o in controllers if o is not p)
    ports = [port for p in procs for port in p["ports"].values()]
    assert len(ports) == len(set(ports))
    doc = tomllib.loads(launcher.membership_toml("c", procs))
    assert doc["cluster"]["controllers"] == [f"tcp:127.0.0.1:{p['ports']['rpc']}" for p in controllers]
    assert [m["role"] for m in doc["cluster"]["members"]] == ["broker", "proxy"]



def test_with_controllers_one_admin_process_starts_last_and_proxies_get_an_rpc_port(tmp_path):
    """The admin process (role admin, an http port) comes after the proxies, only with controllers; each proxy
    has an rpc port (where the admin asks for its clients) named in its argv."""
    procs = launcher.plan(str(tmp_path), 2, 2, False, "c", controllers=3)
    assert procs[-1]["role"] == "admin" and set(procs[-1]["ports"]) == {"http"}
    assert [p["role"] for p in procs].count("admin") == 1
    for p in (p for p in procs if p["role"] == "proxy"):
        assert f"tcp:{p['ports']['rpc']}:interface=127.0.0.1" in p["argv"][p["argv"].index("--rpc") + 1]
    assert "admin" not in [p["role"] for p in launcher.plan(str(tmp_path), 1, 1, False, "c", controllers=0)]
    assert "admin" not in [p["role"] for p in launcher.plan(str(tmp_path), 1, 1, False, "c", 3, admin=False)]
    doc = tomllib.loads(launcher.membership_toml("c", procs))
    assert "admin" not in [m["role"] for m in doc["cluster"]["members"]]


def test_bad_counts_are_refused_with_a_reason(tmp_path):
    """No replicas, or a negative controller count, is refused by name; nothing starts."""
    with pytest.raises(launcher.LaunchError, match="controllers"):
        launcher.up(str(tmp_path / "c"), controllers=-1)
    with pytest.raises(launcher.LaunchError, match="replicas"):
        launcher.up(str(tmp_path / "c"), replicas=0)
    assert launcher.main(["up", str(tmp_path / "c"), "--replicas", "0"]) == 2


def test_a_directory_a_cluster_was_brought_down_in_is_refused(tmp_path):
    """A new cluster is not started on an old one's data (its controllers would name the old masters); nothing
    starts and the message says what to do."""
    root = tmp_path / "c"
    root.mkdir()
    (root / "cluster.json.down").write_text("{}")
    with pytest.raises(launcher.LaunchError, match="remove the directory or pick another DIR"):
        launcher.up(str(root))
    assert sorted(p.name for p in root.iterdir()) == ["cluster.json.down"]


def test_replicas_make_a_master_and_its_slaves_per_group_each_with_an_ha_port(tmp_path):
    """--replicas 3: each group has three brokers with rpc, http and ha ports; the first is the master, the
    others replicate from its ha port, and the membership lists the master first."""
    procs = launcher.plan(str(tmp_path), 2, 1, False, "c", replicas=3)
    brokers = [p for p in procs if p["role"] == "broker"]
    assert [p["id"] for p in brokers] == [f"broker-g{g}-{r}" for g in (1, 2) for r in (1, 2, 3)]
    assert all(set(p["ports"]) == {"rpc", "http", "ha"} for p in brokers)
    for g in ("g1", "g2"):
        master, *slaves = [p for p in brokers if p["group"] == g]
        assert "--ha-master" not in master["argv"] and master.get("master")
        for s in slaves:
            assert s["argv"][s["argv"].index("--ha-master") + 1] == f"tcp:127.0.0.1:{master['ports']['ha']}"
    ports = [port for p in procs for port in p["ports"].values()]
    assert len(ports) == len(set(ports))
    doc = tomllib.loads(launcher.membership_toml("c", procs))
    assert [m["id"] for m in doc["cluster"]["members"] if m.get("group") == "g1"] == [
        "broker-g1-1", "broker-g1-2", "broker-g1-3"]


def test_dial_gives_each_broker_a_config_of_its_own_dialling_and_advertising_the_links_it_names(tmp_path):
    """up(dial=): a broker's own config dials each controller where dial says and advertises its ha there; its
    slaves dial that ha address; proxies and controllers keep the shared config."""
    procs = launcher.plan(str(tmp_path), 1, 1, False, "c", controllers=3, replicas=2)
    asked = []

    def dial(link, port):
        asked.append(link)
        return f"tcp:127.0.0.1:{port + 1}"
    (tmp_path / "cluster.toml").write_text(launcher.membership_toml("c", procs))
    launcher._dial_through(str(tmp_path), procs, dial)
    by_id = {p["id"]: p for p in procs}
    master, slave = by_id["broker-g1-1"], by_id["broker-g1-2"]
    for broker in (master, slave):
        path = broker["argv"][broker["argv"].index("--config") + 1]
        assert path == str(tmp_path / f"{broker['id']}.toml")
        with open(path, "rb") as f:
            cluster = tomllib.load(f)["cluster"]
        assert cluster["controllers"] == [f"tcp:127.0.0.1:{by_id[f'controller-{n}']['ports']['rpc'] + 1}"
                                          for n in (1, 2, 3)]
        assert cluster["advertise"] == {"ha": f"tcp:127.0.0.1:{broker['ports']['ha'] + 1}"}
        assert cluster["cluster_id"] == "c" and len(cluster["members"]) == 3
    assert slave["argv"][slave["argv"].index("--ha-master") + 1] == f"tcp:127.0.0.1:{master['ports']['ha'] + 1}"
    assert "broker-g1-1>controller-2" in asked and "broker-g1-2:ha" in asked
    assert all(p["argv"][p["argv"].index("--config") + 1] == str(tmp_path / "cluster.toml")
               for p in procs if p["role"] != "broker")
