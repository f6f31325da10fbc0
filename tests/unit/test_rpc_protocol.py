"""The RPC adapters on a task.Clock and in-memory transports: calls, timeouts, heartbeats, health, call_any."""

from __future__ import annotations

from twisted.internet import defer, task
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.testing import MemoryReactorClock
from twisted.test import iosim

from cluster.rpc.dispatch import Dispatcher
from cluster.rpc.frames import Hello
from cluster.rpc.peer import REDIAL_JITTER, REDIAL_MAX_DELAY, PeerClient, Peers
from cluster.rpc.protocol import CallTimeout, NotConnected, RemoteError, RpcProtocol, RpcSettings
from cluster.rpc.server import RpcServerFactory
from store import api

SETTINGS = RpcSettings(call_timeout=5.0, heartbeat_interval=1.0, max_frame=4096)
SECRET = "cluster-secret-a"


class Broker:
    """A server factory with a dispatch table of a few request types, on a clock."""

    def __init__(self, clock, node_id="b1", healthy=True, settings=SETTINGS) -> None:
        self.clock = clock
        self.healthy = healthy
        self.dispatcher = Dispatcher(clock)
        self.dispatcher.register("echo", lambda p, body: body)
        self.dispatcher.register("never", lambda p, body: defer.Deferred())
        self.dispatcher.register("refuse", self._refuse)
        self.factory = RpcServerFactory(Hello("twistmq", node_id, "broker", 1), settings, clock, self.dispatcher,
                                        health=lambda: self.healthy)

    @staticmethod
    def _refuse(p, body):
        raise api.NotFound("nothing named " + body.decode())

    def connect(self, client: RpcProtocol):
        server = self.factory.buildProtocol(None)
        pump = iosim.connect(server, iosim.makeFakeServer(server), client, iosim.makeFakeClient(client))
        return server, pump


def client(clock, cluster="twistmq", settings=SETTINGS) -> RpcProtocol:
    return RpcProtocol(Hello(cluster, "p1", "proxy", 1), True, settings, clock)


def outcome(d: defer.Deferred):
    out = []
    d.addBoth(out.append)
    assert out, "the Deferred has not fired"
    return out[0]


def test_a_call_is_answered_and_counted():
    """A call reaches its handler and the answer comes back; the server counts it by request type."""
    clock = task.Clock()
    broker = Broker(clock)
    c = client(clock)
    _server, pump = broker.connect(c)
    assert c.is_open and c.peer.node_id == "b1"
    d = c.call("echo", b"hello")
    pump.flush()
    assert outcome(d) == b"hello"
    assert broker.dispatcher.metrics.calls["echo"] == 1 and broker.dispatcher.metrics.connections == 1


def test_the_clients_boot_reaches_the_servers_open_listener():
    """A client protocol made with a process's ``boot`` says it in its HELLO: the server's ``on_opened`` listener
    (a broker's session keeper) sees it as the peer's."""
    clock = task.Clock()
    broker = Broker(clock)
    opened = []
    broker.factory.on_opened(lambda p: opened.append(p.peer))
    c = RpcProtocol(Hello("twistmq", "p1", "proxy", 1, boot="life-2"), True, SETTINGS, clock)
    broker.connect(c)
    assert c.is_open and [(p.node_id, p.boot) for p in opened] == [("p1", "life-2")]


def test_errors_and_unknown_request_types_are_answered_and_the_connection_stays():
    """A handler's StoreError keeps its code; an unknown request type gets an error frame; calls go on."""
    clock = task.Clock()
    c = client(clock)
    broker = Broker(clock)
    _server, pump = broker.connect(c)
    refused, unknown = c.call("refuse", b"x"), c.call("no.such.type", b"")
    pump.flush()
    err = outcome(refused).value
    assert isinstance(err, RemoteError) and err.code == "not_found" and "nothing named x" in str(err)
    err = outcome(unknown).value
    assert isinstance(err, RemoteError) and err.code == "unknown_request"
    d = c.call("echo", b"still")
    pump.flush()
    assert outcome(d) == b"still" and broker.dispatcher.metrics.refused["unknown_request"] == 1


def test_a_call_without_an_answer_times_out_and_a_late_answer_is_dropped():
    """No answer within the call timeout fails the call with CallTimeout (an Unavailable)."""
    clock = task.Clock()
    c = client(clock)
    _server, pump = Broker(clock).connect(c)
    d = c.call("never", b"")
    pump.flush()
    clock.advance(4.9)
    assert not d.called
    clock.advance(0.2)
    err = outcome(d).value
    assert isinstance(err, CallTimeout) and isinstance(err, api.Unavailable)


def test_calls_fail_fast_when_not_connected_and_waiting_calls_fail_when_the_connection_goes():
    """Before the handshake a call fails at once; calls in flight fail with NotConnected when it drops."""
    clock = task.Clock()
    c = client(clock)
    assert isinstance(outcome(c.call("echo", b"")).value, NotConnected)
    server, pump = Broker(clock).connect(c)
    d = c.call("never", b"")
    pump.flush()
    server.stop()
    pump.flush()
    assert isinstance(outcome(d).value, NotConnected) and not c.is_open


def test_wrong_cluster_is_refused_and_counted():
    """A client of another cluster is refused with the reason, and the refusal is counted by kind."""
    clock = task.Clock()
    c = client(clock, cluster="elsewhere")
    broker = Broker(clock)
    broker.connect(c)
    assert outcome(c.opened) is None
    assert "wrong cluster id 'elsewhere'" in c.close_reason
    assert broker.dispatcher.metrics.refused["wrong_cluster"] == 1 and broker.dispatcher.metrics.connections == 0


def test_same_secret_opens_and_a_wrong_secret_is_refused_counted_and_logged_on_both_sides(caplog):
    """With [cluster] secret on both ends the handshake opens; a client with another secret is refused: both
    ends log the refusal (naming the key, never a value), the server counts it, and no call is served."""
    clock = task.Clock()
    with_secret = RpcSettings(5.0, 1.0, 4096, SECRET)
    c = client(clock, settings=with_secret)
    broker = Broker(clock, settings=with_secret)
    _server, pump = broker.connect(c)
    assert c.is_open and outcome(c.opened).node_id == "b1"
    caplog.set_level("WARNING", logger="twistmq.rpc")
    for wrong in (RpcSettings(5.0, 1.0, 4096, "cluster-secret-b"), SETTINGS):  # another secret, and none
        caplog.clear()
        c = client(clock, settings=wrong)
        broker.connect(c)
        assert outcome(c.opened) is None and not c.is_open
        assert "did not prove the cluster secret" in c.close_reason
        lines = [r.getMessage() for r in caplog.records]
        assert any(line.startswith("rpc_refused") and "[cluster] secret differs" in line for line in lines)
        assert any(line.startswith("rpc_closed_by_peer") and "[cluster] secret differs" in line for line in lines)
        assert not any("cluster-secret" in line for line in lines)
    assert broker.dispatcher.metrics.refused["wrong_secret"] == 2 and broker.dispatcher.metrics.connections == 1
    assert "cluster-secret" not in repr(with_secret)


def test_a_refused_handshake_is_redialled_with_back_off_and_its_reason_kept():
    """A peer whose handshake keeps being refused (another secret) is redialled with growing delays, as if the
    connection had failed, instead of several times a second; PeerClient keeps the reason."""
    reactor = MemoryReactorClock()
    broker = Broker(reactor, settings=RpcSettings(5.0, 1.0, 4096, SECRET))
    reactor.listenTCP(7800, broker.factory, interface="127.0.0.1")
    pc = PeerClient("b1", TCP4ClientEndpoint(reactor, "127.0.0.1", 7800), Hello("twistmq", "p1", "proxy", 1),
                    SETTINGS, reactor)
    pc.startService()
    completer = iosim.ConnectionCompleter(reactor)
    waited = []
    for _ in range(7):
        completer.succeedOnce().flush()  # dialled, refused, closed
        assert not pc.connected and "did not prove the cluster secret" in pc.last_refusal
        elapsed = 0.0
        while not reactor.tcpClients and elapsed < 30:
            reactor.advance(0.05)
            elapsed += 0.05
        waited.append(elapsed)
    assert waited[-1] >= 5.0 and waited[-2] >= 5.0, waited  # the back-off's ceiling (plus jitter)
    pc.stopService()


def test_a_peer_that_is_down_is_redialled_at_most_about_a_second_apart():
    """A peer down for a while (every dial fails) is redialled at most REDIAL_MAX_DELAY plus jitter apart, so it is
    reached within about a second of its restart: well inside the one-lease grace a new leader gives members."""
    reactor = MemoryReactorClock()
    pc = PeerClient("c1", TCP4ClientEndpoint(reactor, "127.0.0.1", 7801), Hello("twistmq", "p1", "proxy", 1),
                    SETTINGS, reactor)
    pc.startService()
    completer = iosim.ConnectionCompleter(reactor)
    waited = []
    for _ in range(10):
        completer.failOnce()
        elapsed = 0.0
        while not reactor.tcpClients and elapsed < 30:
            reactor.advance(0.05)
            elapsed += 0.05
        waited.append(elapsed)
    assert waited[0] < 0.5 and max(waited) <= REDIAL_MAX_DELAY + REDIAL_JITTER + 0.05, waited
    pc.stopService()


def test_heartbeats_carry_the_health_flag():
    """Each side's heartbeat tells the other whether it is healthy (Turms' isHealthy)."""
    clock = task.Clock()
    c = client(clock)
    broker = Broker(clock)
    _server, pump = broker.connect(c)
    assert c.peer_healthy
    broker.healthy = False
    clock.advance(1.0)
    pump.flush()
    assert not c.peer_healthy and c.is_open


def test_a_silent_peer_is_dropped():
    """A peer that sends nothing for three heartbeat intervals is disconnected."""
    clock = task.Clock()
    c = client(clock)
    _server, pump = Broker(clock).connect(c)
    d = c.call("never", b"")
    for _ in range(4):
        clock.advance(1.0)  # nothing pumped: the broker's heartbeats never arrive
    pump.flush()
    assert "no heartbeat" in c.close_reason and not c.is_open
    assert isinstance(outcome(d).value, NotConnected)


def test_a_connection_without_a_handshake_is_closed_after_the_call_timeout():
    """A client that connects and says nothing is dropped by the server after the call timeout."""
    clock = task.Clock()
    broker = Broker(clock)
    server = broker.factory.buildProtocol(None)
    transport = iosim.makeFakeServer(server)
    server.makeConnection(transport)
    clock.advance(5.1)
    assert transport.disconnecting and broker.dispatcher.metrics.refused["no_handshake"] == 1


def _connected_peer(clock, peers: Peers, peer_id: str, broker: Broker):
    pc = PeerClient(peer_id, None, Hello("twistmq", "p1", "proxy", 1), SETTINGS, clock)
    peers.add(pc)
    p = RpcProtocol(pc.local, True, SETTINGS, clock)
    _server, pump = broker.connect(p)
    pc._up(p)  # what the ClientService's factory does once the handshake is done
    return pc, pump


def test_call_any_avoids_unhealthy_and_disconnected_nodes():
    """call_any goes to a connected healthy candidate only; with none, it fails with Unavailable."""
    clock = task.Clock()
    peers = Peers()
    sick = Broker(clock, "b-sick", healthy=False)
    well = Broker(clock, "b-well")
    _pc1, pump1 = _connected_peer(clock, peers, "b-sick", sick)
    _pc2, pump2 = _connected_peer(clock, peers, "b-well", well)
    for _ in range(3):
        d = peers.call_any(["b-sick", "b-well", "b-unknown"], "echo", b"x")
        pump1.flush()
        pump2.flush()
        assert outcome(d) == b"x"
    assert well.dispatcher.metrics.calls["echo"] == 3 and sick.dispatcher.metrics.calls["echo"] == 0
    err = outcome(peers.call_any(["b-sick"], "echo", b"x")).value
    assert isinstance(err, api.Unavailable) and "no node can take it" in str(err)


def test_call_any_retries_on_another_node_when_one_is_unavailable():
    """A call that fails as Unavailable on one node (its connection dropped) is sent to the next."""
    clock = task.Clock()
    peers = Peers()
    first, second = Broker(clock, "b1"), Broker(clock, "b2")
    pc1, pump1 = _connected_peer(clock, peers, "b1", first)
    _pc2, pump2 = _connected_peer(clock, peers, "b2", second)
    peers._turn = len(peers.clients) - 1  # the next call starts at b1
    d = peers.call_any(["b1", "b2"], "never", b"")
    pump1.flush()
    assert not d.called  # b1 got it and never answers
    pc1.protocol.transport.loseConnection()  # b1 goes away with the call in flight
    pump1.flush()
    second.dispatcher._handlers["never"] = lambda p, body: b"served by b2"
    pump2.flush()
    assert outcome(d) == b"served by b2"


class _Endpoint:
    """A client endpoint that connects to one Broker in memory (iosim), counting attempts."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.pumps = []

    def connect(self, factory):
        p = factory.buildProtocol(None)
        self.pumps.append(self.broker.connect(p)[1])
        return defer.succeed(p)

    def flush(self) -> None:
        for pump in self.pumps:
            pump.flush()


def test_retarget_closes_the_old_connection_and_calls_go_to_the_new_address():
    """A peer that moved: retarget dials the new endpoint, the old connection is closed, connection listeners
    hear of it as of a reconnect (so what was registered is taken again), and calls reach the new address."""
    clock = task.Clock()
    old, new = Broker(clock), Broker(clock)
    old.dispatcher.register("who", lambda p, body: b"old")
    new.dispatcher.register("who", lambda p, body: b"new")
    at_old, at_new = _Endpoint(old), _Endpoint(new)
    pc = PeerClient("b1", at_old, Hello("twistmq", "p1", "proxy", 1), SETTINGS, clock)
    ups = []
    pc.on_connected(lambda: ups.append(1))
    pc.startService()
    at_old.flush()
    d = pc.call("who", b"")
    at_old.flush()
    assert outcome(d) == b"old" and ups == [1]
    old_protocol = pc.protocol
    pc.retarget(at_new)
    at_old.flush()
    at_new.flush()
    assert not old_protocol.is_open and len(at_new.pumps) == 1 and ups == [1, 1]
    d = pc.call("who", b"")
    at_new.flush()
    assert outcome(d) == b"new"
    pc.stopService()
    at_new.flush()


def test_a_new_connection_re_registers_before_the_calls_that_waited_for_it():
    """On a (re)connect the on_connected listeners (interest and watches taken again) send before the calls that
    waited for the connection: a broker must see a proxy's filters again before its appends, in order."""
    clock = task.Clock()
    order: list[str] = []
    pc = PeerClient("b1", None, Hello("twistmq", "p1", "proxy", 1), SETTINGS, clock)
    pc.when_connected().addCallback(lambda _: order.append("waiting call"))
    pc.on_connected(lambda: order.append("re-register"))
    p = RpcProtocol(pc.local, True, SETTINGS, clock)
    _server, _pump = Broker(clock).connect(p)
    pc._up(p)
    assert order == ["re-register", "waiting call"]


def test_calls_in_flight_share_one_timeout_sweep_and_each_keeps_its_own_timeout():
    """A hundred calls in flight put one timer on the clock, not one each; a shorter timeout still fails first."""
    clock = task.Clock()
    c = client(clock)
    _server, pump = Broker(clock).connect(c)
    before = len(clock.getDelayedCalls())
    calls = [c.call("never", b"") for _ in range(100)]
    short = c.call("never", b"", timeout=0.5)
    pump.flush()
    assert len(clock.getDelayedCalls()) == before + 1
    clock.advance(0.3)
    assert not short.called
    clock.advance(0.3)
    assert isinstance(outcome(short).value, CallTimeout) and not any(d.called for d in calls)
    clock.advance(4.5)
    assert all(isinstance(outcome(d).value, CallTimeout) for d in calls)
    assert len(clock.getDelayedCalls()) == before  # nothing pending: no sweep left behind


def test_a_full_write_buffer_is_told_and_a_paused_connection_still_closes():
    """The protocol is its transport's streaming producer: write_paused follows the transport's pause and resume,
    and stop() unregisters it first, so a connection closed while paused closes (Twisted waits for a paused one)."""
    from twisted.internet.testing import StringTransport
    c = client(task.Clock())
    transport = StringTransport()
    c.makeConnection(transport)
    assert transport.producer is c and transport.streaming
    c.pauseProducing()
    assert c.write_paused
    c.resumeProducing()
    assert not c.write_paused
    c.pauseProducing()
    c.stop()
    assert transport.producer is None and transport.disconnecting
