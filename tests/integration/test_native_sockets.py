"""The native protocol over real TCP and UDP sockets, in-process, on the real reactor and a real store.

Covers every action, at-most/at-least-once, delay/ttl/retry timing (in whole
seconds, so a few tests take a couple of seconds), POP with two consumers,
virtual queues, pipelining, and bad input on both transports.
"""

from __future__ import annotations

import json
import shutil
import tempfile

from twisted.internet import defer, protocol, reactor, task
from twisted.trial import unittest

import lightqueue
from cluster.local.native_service import NativeService
from mqtt_proxy.native import protocol as proto_mod
from mqtt_proxy.native.client import connect
from store.config import NativeConfig, StoreConfig
from store.executor import SynchronousExecutor
from store.message_store import MessageStore
from store.record import Message
from store.timer_service import TimerService


def sleep(seconds: float) -> defer.Deferred:
    return task.deferLater(reactor, seconds, lambda: None)


class UDPClient(protocol.DatagramProtocol):
    """Sends datagrams to one server and queues the replies."""

    def __init__(self, addr):
        self.addr = addr
        self.replies = defer.DeferredQueue()

    def datagramReceived(self, data, addr):  # noqa: N802 - Twisted interface
        self.replies.put(json.loads(data))

    def request(self, obj_or_bytes) -> defer.Deferred:
        data = obj_or_bytes if isinstance(obj_or_bytes, bytes) else json.dumps(obj_or_bytes).encode()
        self.transport.write(data, self.addr)
        return self.replies.get()


class NativeSocketsTest(unittest.TestCase):
    """A store + timer + native service listening on 127.0.0.1 ephemeral ports."""

    config = NativeConfig(virtual_queues={"fan": ["fa", "fb"]}, max_queue_size=50, max_request_bytes=4096,
                          max_datagram_bytes=512)

    def setUp(self):
        path = self.path = tempfile.mkdtemp(prefix="native-sockets-")
        self.store = MessageStore(path, StoreConfig(segment_size=1 << 22), reactor, SynchronousExecutor())
        lightqueue.attach(self.store)
        self.timers = TimerService(self.store, path + "/timer", reactor, 100, slot_count=3000)
        self.native = NativeService(self.store, path, self.config, reactor, self.timers)
        self.store.open()  # after the native service: its state log replays as a dispatcher
        self.timers.start()
        self.native.open()
        self.tcp_port = reactor.listenTCP(0, self.native.tcp_factory(), interface="127.0.0.1")
        self.udp_port = reactor.listenUDP(0, self.native.udp_protocol(), interface="127.0.0.1")
        self.clients = []

    @defer.inlineCallbacks
    def tearDown(self):
        for c in self.clients:
            c.transport.loseConnection()
            yield c.closed
        yield self.tcp_port.stopListening()
        yield self.udp_port.stopListening()
        if getattr(self, "udp_client_port", None) is not None:
            yield self.udp_client_port.stopListening()
        yield self.timers.stop()
        yield self.native.stop()
        yield self.store.close()
        shutil.rmtree(self.path, ignore_errors=True)

    @defer.inlineCallbacks
    def tcp(self):
        c = yield connect(reactor, "127.0.0.1", self.tcp_port.getHost().port)
        self.clients.append(c)
        return c

    def udp(self) -> UDPClient:
        client = UDPClient(("127.0.0.1", self.udp_port.getHost().port))
        self.udp_client_port = reactor.listenUDP(0, client, interface="127.0.0.1")
        return client

    # -- every action ------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_every_action_over_tcp(self):
        """produce, consume, confirm, monitor, queue lists, node monitor, pop, ack, change_invisible_time."""
        c = yield self.tcp()
        p = yield c.request({"action": 1, "queue": "jobs", "data": "one", "retry": 30, "seq": 1})
        self.assertEqual((p["code"], p["action"], p["queue"], p["seq"]), (0, 1, "jobs", 1))
        m = yield c.request({"action": 2, "queue": "jobs", "seq": 2})
        self.assertEqual((m["msg_id"], m["data"], m["seq"]), (p["msg_id"], "one", 2))
        mon = yield c.request({"action": 4, "queue": "jobs"})
        self.assertEqual((mon["size"], mon["inflight"], mon["max_size"]), (1, 1, 50))
        ok = yield c.request({"action": 3, "queue": "jobs", "msg_id": m["msg_id"]})
        self.assertEqual(ok["code"], 0)
        for action in (7, 107):
            lst = yield c.request({"action": action})
            self.assertEqual([q["queue"] for q in lst["queues"]], ["jobs"])
            self.assertEqual(lst["virtual_queues"], {"fan": ["fa", "fb"]})
        node = yield c.request({"action": 104})
        self.assertEqual((node["code"], node["node_id"], node["queue_count"]), (0, 1, 1))
        yield c.request({"action": 1, "queue": "jobs", "data": "two"})
        popped = yield c.request({"action": 11, "queue": "jobs", "group": "g", "invisible_time": 60})
        self.assertEqual(popped["data"], "one")  # group g has its own cursor, from the start
        ch = yield c.request({"action": 13, "queue": "jobs", "group": "g", "msg_id": popped["msg_id"],
                              "invisible_time": 5})
        self.assertEqual(ch["code"], 0)
        ack = yield c.request({"action": 12, "queue": "jobs", "group": "g", "msg_id": popped["msg_id"]})
        self.assertEqual(ack["code"], 0)
        again = yield c.request({"action": 12, "queue": "jobs", "group": "g", "msg_id": popped["msg_id"]})
        self.assertEqual(again["code"], -1)

    @defer.inlineCallbacks
    def test_every_action_over_udp(self):
        """The same actions work one datagram at a time, echoing seq; list actions are TCP only."""
        u = self.udp()
        p = yield u.request({"action": 1, "queue": "u", "data": "hi", "seq": "a"})
        self.assertEqual((p["code"], p["seq"]), (0, "a"))
        m = yield u.request({"action": 2, "queue": "u", "seq": "b"})
        self.assertEqual((m["data"], m["msg_id"], m["seq"]), ("hi", p["msg_id"], "b"))
        for req in ({"action": 4, "queue": "u"}, {"action": 104}):
            r = yield u.request(req)
            self.assertEqual(r["code"], 0, r)
        for req in ({"action": 7}, {"action": 107}):
            r = yield u.request(req)
            self.assertEqual(r["code"], -1, r)
        yield u.request({"action": 1, "queue": "u", "data": "x", "retry": 10})
        m = yield u.request({"action": 2, "queue": "u"})
        r = yield u.request({"action": 3, "queue": "u", "msg_id": m["msg_id"]})
        self.assertEqual(r["code"], 0)

    # -- semantics -------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_at_most_once_and_at_least_once(self):
        """retry=0 is gone once consumed; retry=1 comes back after 1 s unless confirmed."""
        c = yield self.tcp()
        yield c.request({"action": 1, "queue": "amo", "data": "once"})
        yield c.request({"action": 1, "queue": "alo", "data": "again", "retry": 1})
        first = yield c.request({"action": 2, "queue": "amo"})
        self.assertEqual(first["data"], "once")
        got = yield c.request({"action": 2, "queue": "alo"})
        self.assertEqual(got["data"], "again")
        yield sleep(1.2)
        gone = yield c.request({"action": 2, "queue": "amo"})
        self.assertNotIn("data", gone)
        back = yield c.request({"action": 2, "queue": "alo"})
        self.assertEqual((back["msg_id"], back["attempts"]), (got["msg_id"], 2))
        yield c.request({"action": 3, "queue": "alo", "msg_id": back["msg_id"]})
        yield sleep(1.2)
        done = yield c.request({"action": 2, "queue": "alo"})
        self.assertNotIn("data", done)

    @defer.inlineCallbacks
    def test_delay_and_ttl_timing(self):
        """delay=1 holds a message back about a second; ttl=1 makes an unconsumed one vanish."""
        c = yield self.tcp()
        start = reactor.seconds()
        yield c.request({"action": 1, "queue": "d", "data": "later", "delay": 1})
        yield c.request({"action": 1, "queue": "t", "data": "short", "ttl": 1})
        early = yield c.request({"action": 2, "queue": "d"})
        self.assertNotIn("data", early)
        while True:
            r = yield c.request({"action": 2, "queue": "d"})
            if "data" in r:
                break
            yield sleep(0.05)
        waited = reactor.seconds() - start
        self.assertTrue(0.95 <= waited < 1.6, waited)
        yield sleep(max(0.0, 1.1 - (reactor.seconds() - start)))
        expired = yield c.request({"action": 2, "queue": "t"})
        self.assertNotIn("data", expired)

    @defer.inlineCallbacks
    def test_pop_with_two_consumers(self):
        """Two POP consumers on two connections share a group one message at a time; unacked ones return."""
        a = yield self.tcp()
        b = yield self.tcp()
        for i in range(6):
            yield a.request({"action": 1, "queue": "work", "data": str(i)})
        seen = {"a": [], "b": []}
        for _ in range(3):
            ra = yield a.request({"action": "pop", "queue": "work", "group": "w", "invisible_time": 1})
            rb = yield b.request({"action": "pop", "queue": "work", "group": "w", "invisible_time": 1})
            seen["a"].append(ra)
            seen["b"].append(rb)
        self.assertEqual([m["data"] for m in seen["a"]], ["0", "2", "4"])
        self.assertEqual([m["data"] for m in seen["b"]], ["1", "3", "5"])
        for m in seen["a"]:
            yield a.request({"action": "ack", "queue": "work", "group": "w", "msg_id": m["msg_id"]})
        none = yield a.request({"action": "pop", "queue": "work", "group": "w"})
        self.assertNotIn("data", none)
        yield sleep(1.2)
        back = []
        for _ in range(3):
            r = yield a.request({"action": "pop", "queue": "work", "group": "w"})
            back.append(r["data"])
        self.assertEqual(back, ["1", "3", "5"])

    @defer.inlineCallbacks
    def test_virtual_queue(self):
        """A produce to a virtual queue reaches each real queue; reading the virtual queue is refused."""
        c = yield self.tcp()
        p = yield c.request({"action": 1, "queue": "fan", "data": "v"})
        ra = yield c.request({"action": 2, "queue": "fa"})
        rb = yield c.request({"action": 2, "queue": "fb"})
        self.assertEqual((ra["msg_id"], rb["msg_id"], ra["data"]), (p["msg_id"], p["msg_id"], "v"))
        bad = yield c.request({"action": 2, "queue": "fan"})
        self.assertEqual(bad["code"], -1)

    @defer.inlineCallbacks
    def test_full_queue(self):
        """The 51st message of a queue with max_queue_size 50 is refused."""
        c = yield self.tcp()
        r = yield c.request({"action": 1, "queue": "full", "batch": ["x"] * 50})
        self.assertEqual(r["count"], 50)
        r = yield c.request({"action": 1, "queue": "full", "data": "y"})
        self.assertEqual(r["code"], -1)
        self.assertIn("full", r["reason"])

    @defer.inlineCallbacks
    def test_pipelined_replies_in_order(self):
        """Forty produces then forty consumes, each batch in one write, come back in request order."""
        c = yield self.tcp()
        replies = []
        ds = [c.request({"action": 1, "queue": "pipe", "data": str(i), "seq": i}).addCallback(replies.append)
              for i in range(40)]
        yield defer.gatherResults(ds)
        ds = [c.request({"action": 2, "queue": "pipe", "seq": 40 + i}).addCallback(replies.append)
              for i in range(40)]
        yield defer.gatherResults(ds)
        self.assertEqual([r["seq"] for r in replies], list(range(80)))
        self.assertEqual([r.get("data", r) for r in replies[40:]], [str(i) for i in range(40)])

    @defer.inlineCallbacks
    def test_client_call_without_deferreds(self):
        """The client's call(): replies reach their callbacks in request order; a lost connection answers code -1."""
        c = yield self.tcp()
        got = []
        done = defer.Deferred()

        def on_reply(reply):
            got.append(reply)
            if len(got) == 3:
                done.callback(None)

        c.call({"action": 1, "queue": "calls", "data": "é", "seq": 1}, on_reply)
        c.call({"action": 2, "queue": "calls", "seq": 2}, on_reply)
        c.call({"action": 2, "queue": "calls", "seq": 3}, on_reply)
        yield done
        self.assertEqual([r["seq"] for r in got], [1, 2, 3])
        self.assertEqual((got[1]["data"], got[1]["msg_id"]), ("é", got[0]["msg_id"]))
        self.assertNotIn("data", got[2])
        lost = []
        c._waiting.append(lost.append)  # a request whose reply never comes before the connection goes
        c.transport.loseConnection()
        yield c.closed
        self.assertEqual(lost, [{"code": -1, "reason": "connection lost"}])

    @defer.inlineCallbacks
    def test_topic_round_trip(self):
        """produce with topic stores an MQTT publish; consume with topic reads device publishes per group."""
        c = yield self.tcp()
        r = yield c.request({"action": 1, "topic": "dev/9/cmd", "data": "reboot", "qos": 0})
        self.assertEqual(r["code"], 0)
        yield self.store.put(Message("dev/9/telemetry", b'{"t":21}', qos=1, client_id="dev9"))
        got = []
        for _ in range(2):
            got.append((yield c.request({"action": 2, "topic": "dev", "group": "backend"})))
        self.assertEqual([(g["msg_topic"], g["data"]) for g in got],
                         [("dev/9/cmd", "reboot"), ("dev/9/telemetry", '{"t":21}')])
        self.assertEqual(got[1]["client_id"], "dev9")

    # -- bad input --------------------------------------------------------------------------------

    @defer.inlineCallbacks
    def test_bad_input_over_tcp_keeps_connection(self):
        """Malformed JSON, unknown actions, bad fields, huge values and long lines get code -1; the link stays."""
        c = yield self.tcp()
        bad = [b"{nope\n", b"[]\n", b'{"action":42,"seq":1}\n', b'{"action":1,"queue":"q"}\n',
               b'{"action":1,"queue":"q","data":"x","delay":"soon"}\n',
               b'{"action":1,"queue":"q","data":"x","ttl":99999999999999999999}\n',
               b'{"action":2,"queue":' + b'"' + b"q" * 300 + b'"}\n',
               b'{"action":1,"queue":"q","data":"' + b"x" * 5000 + b'"}\n',
               b"\xff\xfe\n"]
        replies = []
        for raw in bad:
            replies.append((yield c.send_raw(raw)))
        for raw, r in zip(bad, replies):
            self.assertEqual(r["code"], -1, raw[:60])
            self.assertTrue(r["reason"])
        self.assertEqual(replies[2]["seq"], 1)
        self.assertIn("max_request_bytes", replies[7]["reason"])
        ok = yield c.request({"action": 1, "queue": "q", "data": "still here"})
        self.assertEqual(ok["code"], 0)

    @defer.inlineCallbacks
    def test_bad_input_over_udp(self):
        """Bad datagrams and oversized datagrams get code -1; the server keeps serving."""
        u = self.udp()
        r = yield u.request(b"{garbage")
        self.assertEqual(r["code"], -1)
        r = yield u.request({"action": "nope", "seq": 3})
        self.assertEqual((r["code"], r["seq"]), (-1, 3))
        r = yield u.request({"action": 1, "queue": "q", "data": "x" * 1000})
        self.assertEqual(r["code"], -1)
        self.assertIn("max_datagram_bytes", r["reason"])
        r = yield u.request({"action": 1, "queue": "q", "data": "fine"})
        self.assertEqual(r["code"], 0)

    @defer.inlineCallbacks
    def test_udp_consume_leaves_big_message_for_tcp(self):
        """A message too big for a UDP reply is refused over UDP and still there for TCP."""
        c = yield self.tcp()
        big = "y" * 3000
        yield c.request({"action": 1, "queue": "big", "data": big})
        u = self.udp()
        self.patch(proto_mod, "UDP_DATA_BUDGET", 1000)
        r = yield u.request({"action": 2, "queue": "big"})
        self.assertEqual(r["code"], -1)
        r = yield c.request({"action": 2, "queue": "big"})
        self.assertEqual(r["data"], big)
