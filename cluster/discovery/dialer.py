"""RPC connections to the members the controllers list, kept at the addresses they advertise.

``MemberPeers.apply(metadata)`` (a ``MemberAgent.on_metadata`` listener) holds one
``cluster.rpc.peer.PeerClient`` per member of the wanted node types that advertises an RPC address
another host can dial: a new member is dialled, one whose address changed is re-dialled there
(``retarget``), one the metadata no longer lists is hung up. The admin role gathers from proxies and
brokers this way.
"""

from __future__ import annotations

import logging

from twisted.internet import defer, endpoints

from cluster.discovery.members import dialable
from cluster.rpc.frames import Hello
from cluster.rpc.peer import PeerClient
from cluster.rpc.protocol import NotConnected, RpcSettings

log = logging.getLogger("twistmq.discovery")


class MemberPeers:
    """``MemberPeers(reactor, hello, settings, node_types)``; ``apply(metadata)``, ``call(...)``, ``stop()``."""

    def __init__(self, reactor, hello: Hello, settings: RpcSettings, node_types: tuple[str, ...]) -> None:
        self.reactor = reactor
        self.hello = hello
        self.settings = settings
        self.node_types = node_types
        self.peers: dict[str, tuple[str, PeerClient]] = {}  # node id -> (address, its client)

    def apply(self, metadata: dict) -> None:
        wanted = {r["node_id"]: r["rpc_address"] for r in metadata.get("members") or ()
                  if isinstance(r, dict) and r.get("node_type") in self.node_types and dialable(r.get("rpc_address"))}
        for node_id in [n for n in self.peers if n not in wanted]:
            _, peer = self.peers.pop(node_id)
            peer.stopService()
            log.info("member_peer_dropped node_id=%s", node_id)
        for node_id, address in sorted(wanted.items()):
            have = self.peers.get(node_id)
            if have is not None and have[0] == address:
                continue
            try:
                endpoint = endpoints.clientFromString(self.reactor, address)
            except ValueError as exc:
                log.warning("member_peer_address_refused node_id=%s address=%r reason=%s", node_id, address, exc)
                continue
            if have is None:
                peer = PeerClient(node_id, endpoint, self.hello, self.settings, self.reactor)
                peer.startService()
                log.info("member_peer_added node_id=%s address=%s", node_id, address)
            else:
                peer = have[1]
                peer.retarget(endpoint)
                log.info("member_peer_moved node_id=%s from=%s to=%s", node_id, have[0], address)
            self.peers[node_id] = (address, peer)

    def call(self, node_id: str, request_type: str, body: bytes, wait: float = 0.0) -> defer.Deferred:
        """Call a member; with ``wait`` > 0 a member not connected yet (just listed) is waited for that long."""
        have = self.peers.get(node_id)
        if have is None:
            return defer.fail(NotConnected(f"no RPC address known for {node_id!r}"))
        peer = have[1]
        if peer.connected or wait <= 0:
            return peer.call(request_type, body)
        d = peer.when_connected()
        d.addTimeout(wait, self.reactor)
        return d.addCallback(lambda _: peer.call(request_type, body))

    def stop(self) -> defer.Deferred:
        peers, self.peers = self.peers, {}
        return defer.DeferredList([peer.stopService() for _, peer in peers.values()])
