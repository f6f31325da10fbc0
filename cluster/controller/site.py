"""A controller's HTTP listener: ``/health``, ``/metrics`` (Raft, leases, RPC) and the admin API it is given."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from twisted.web import resource, server

from cluster.runtime.http import Metrics


class _Health(resource.Resource):
    """200 while Raft runs: ``{"status": "ok", "leader": ADDRESS or null, "is_leader": bool, "term": n}``."""

    isLeaf = True

    def __init__(self, raft) -> None:
        super().__init__()
        self.raft = raft

    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"status": "ok", "leader": self.raft.leader, "is_leader": self.raft.is_leader,
                           "term": self.raft.term}).encode()


class _ControllerCollector:
    def __init__(self, raft, controller) -> None:
        self.raft, self.controller = raft, controller

    def collect(self):
        status = self.raft.status()
        for name, doc, value in (
                ("twistmq_raft_leader", "1 while this controller is the Raft leader", status.get("is_leader")),
                ("twistmq_raft_term", "the Raft term this controller is in", status.get("term", 0)),
                ("twistmq_raft_has_quorum", "1 while a majority of controllers is reachable", status.get("has_quorum")),
                ("twistmq_raft_commit_index", "the last Raft log index known committed", status.get("commit_index", 0)),
                ("twistmq_raft_peers_connected", "other controllers connected",
                 len(status.get("peers_connected", ()))),
                ("twistmq_metadata_version", "the metadata version applied here",
                 self.raft.read(lambda m: m.version))):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], float(value or 0))
            yield g
        table = self.controller.table
        g = GaugeMetricFamily("twistmq_members", "members listed, by joined (leader only)", labels=["joined"])
        if table is not None:
            members = table.members()
            g.add_metric(["true"], sum(1 for m in members if m.joined))
            g.add_metric(["false"], sum(1 for m in members if not m.joined))
        yield g
        for name, doc, value in (
                ("twistmq_leases_evicted", "member leases ended without a heartbeat (this leadership)",
                 table.evicted if table is not None else 0),
                ("twistmq_leases_refused", "registers and heartbeats refused (this leadership)",
                 table.refused if table is not None else 0),
                ("twistmq_raft_state_changes", "Raft state changes of this controller", self.raft.leader_changes),
                ("twistmq_metadata_pushes", "metadata events pushed to members", self.controller.pushes),
                ("twistmq_master_elections", "broker masters elected after their heartbeats stopped (this "
                 "controller's leaderships)", self.controller.elections)):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            yield c


def controller_site(raft, controller, collectors=(), api=None) -> server.Site:
    """/health, /metrics (Raft and lease figures, the process, ``collectors``) and ``/api`` when given."""
    registry = CollectorRegistry()
    registry.register(_ControllerCollector(raft, controller))
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)
    root = resource.Resource()
    root.putChild(b"health", _Health(raft))
    root.putChild(b"metrics", Metrics(registry))
    if api is not None:
        root.putChild(b"api", api)
    site = server.Site(root)
    site.noisy = False
    return site
