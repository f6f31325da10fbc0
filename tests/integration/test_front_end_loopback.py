"""The MQTT front end over a LoopbackStore: every store call and event through the RPC codec, a tick late.

A child process (``loopback_front.py``) runs one broker group behind a
``LocalStore`` and front ends over ``LoopbackStore``s of it, on real sockets;
real paho clients drive the key flows. A front end that still relied on a
store answer arriving at once, or on reaching broker internals, fails here.
Two front ends (holders ``proxy-1`` and ``proxy-2``) share the group, so a
client id moving between them exercises the session claim and fencing
(MQTT-3.1.4-3) the way two proxy processes will.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

from tests.integration.node import NodeProcess

paho = pytest.importorskip("paho.mqtt.client")
from paho.mqtt.packettypes import PacketTypes  # noqa: E402
from paho.mqtt.properties import Properties  # noqa: E402

from tests.integration.interop_clients import Paho  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loopback_front.py")
TAKEN_OVER = 0x8E
_ids = itertools.count()


class LoopbackFront(NodeProcess):
    """The loopback front-end process, started and stopped like a node."""

    def __init__(self, data_dir: str, proxies: int = 2, events: bool = True) -> None:
        super().__init__(data_dir)
        self.proxies, self.events = proxies, events

    def args(self) -> list[str]:
        return [sys.executable, SCRIPT, self.data_dir, str(self.proxies), "yes" if self.events else "no"]


@pytest.fixture(scope="module")
def front(tmp_path_factory):
    """One process, two front ends over loopback stores, takeover events carried between them."""
    p = LoopbackFront(str(tmp_path_factory.mktemp("loopback") / "data")).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def fenced_front(tmp_path_factory):
    """The same, but the old holder hears of a takeover only through Fenced refusals."""
    p = LoopbackFront(str(tmp_path_factory.mktemp("fenced") / "data"), events=False).start()
    yield p
    p.stop()


@pytest.fixture
def clients():
    made: list[Paho] = []
    yield made
    for c in made:
        c.close()


def uid(what: str) -> str:
    return f"lb-{next(_ids)}-{what}"


def connect(front, clients, client_id, proxy=0, **kw) -> Paho:
    c = Paho(front.ports["mqtt"][proxy], 5, client_id, **kw)
    clients.append(c)
    return c


def test_qos1_and_qos2_in_and_out(front, clients):
    """QoS 1 and 2 publishes are acknowledged after storing and reach a subscriber at their QoS, each QoS in order.

    (paho hands a QoS 2 message over at PUBREL, so across QoS levels the arrival order is the client's.)
    """
    topic = f"lb/{uid('q')}/t"
    sub = connect(front, clients, uid("sub"))
    sub.subscribe(topic, qos=2)
    pub = connect(front, clients, uid("pub"))
    for i in range(20):
        pub.publish(topic, b"%d" % i, qos=1 + i % 2)
    got = sub.expect(20)
    for qos in (1, 2):
        assert [m.payload for m in got if m.qos == qos] == [b"%d" % i for i in range(20) if 1 + i % 2 == qos]


def test_persistent_session_resumes_with_what_was_published_offline(front, clients):
    """A persistent v5 session gets, on return, the QoS 1 messages published while it was away."""
    topic, cid = f"lb/{uid('p')}/t", uid("persist")
    sub = connect(front, clients, cid, clean=False, session_expiry=300)
    sub.subscribe(topic, qos=1)
    sub.close()
    pub = connect(front, clients, uid("pub"))
    for i in range(30):
        pub.publish(topic, b"off-%d" % i, qos=1)
    back = connect(front, clients, cid, clean=False, session_expiry=300)
    assert back.connack[1].session_present
    assert [m.payload for m in back.expect(30)] == [b"off-%d" % i for i in range(30)]


def test_retained_message_reaches_a_later_subscriber_and_is_cleared(front, clients):
    """A retained publish is sent to a later subscriber flagged RETAIN; an empty retained publish clears it."""
    topic = f"lb/{uid('r')}/t"
    pub = connect(front, clients, uid("pub"))
    pub.publish(topic, b"kept", qos=1, retain=True)
    first = connect(front, clients, uid("late"))
    first.subscribe(topic, qos=1)
    (m,) = first.expect(1)
    assert (m.payload, m.retain) == (b"kept", True)
    pub.publish(topic, b"", qos=1, retain=True)
    first.expect(1)  # the clearing publish is delivered live
    second = connect(front, clients, uid("later"))
    second.subscribe(topic, qos=1)
    assert second.drain() == []


def test_shared_subscription_splits_the_messages(front, clients):
    """Two members of $share/g/... get every message exactly once between them."""
    topic = f"lb/{uid('s')}/t"
    members = [connect(front, clients, uid(f"m{i}")) for i in range(2)]
    for m in members:
        m.subscribe(f"$share/g/{topic}", qos=1)
    pub = connect(front, clients, uid("pub"))
    for i in range(40):
        pub.publish(topic, b"%d" % i, qos=1)
    got = [m.payload for m in members[0].drain()] + [m.payload for m in members[1].drain()]
    assert sorted(got) == sorted(b"%d" % i for i in range(40))


def test_will_is_published_when_the_link_drops(front, clients):
    """A client that vanishes without DISCONNECT has its will published to subscribers."""
    topic = f"lb/{uid('w')}/will"
    watcher = connect(front, clients, uid("watch"))
    watcher.subscribe(topic, qos=1)
    doomed = connect(front, clients, uid("doomed"), will=(topic, b"gone", 1, False))
    doomed.drop()
    (m,) = watcher.expect(1)
    assert m.payload == b"gone"


def test_session_moves_to_the_other_front_end(front, clients):
    """MQTT-3.1.4-3 across front ends: the old link gets DISCONNECT 0x8E and the session resumes on the new one."""
    topic, cid = f"lb/{uid('t')}/t", uid("mover")
    old = connect(front, clients, cid, proxy=0, clean=False, session_expiry=300)
    old.subscribe(topic, qos=1)
    new = connect(front, clients, cid, proxy=1, clean=False, session_expiry=300)
    assert new.connack[1].session_present
    assert int(old.disconnects.get(timeout=5).value) == TAKEN_OVER
    pub = connect(front, clients, uid("pub"))
    pub.publish(topic, b"after", qos=1)
    assert [m.payload for m in new.expect(1)] == [b"after"]


def test_old_holder_is_fenced_without_an_event(fenced_front, clients):
    """Without the takeover event, the old holder's next session write is refused and its client disconnected."""
    topic, cid = f"lb/{uid('f')}/t", uid("fenced")
    old = connect(fenced_front, clients, cid, proxy=0, clean=False, session_expiry=300)
    old.subscribe(topic, qos=1)
    new = connect(fenced_front, clients, cid, proxy=1, clean=False, session_expiry=300)
    assert new.connack[1].session_present
    props = Properties(PacketTypes.SUBSCRIBE)
    old.c.subscribe(f"{topic}/more", 1, properties=props)  # a write with the old epoch: Fenced
    assert int(old.disconnects.get(timeout=5).value) == TAKEN_OVER
    pub = connect(fenced_front, clients, uid("pub"))
    pub.publish(topic, b"still-here", qos=1)
    assert [m.payload for m in new.expect(1)] == [b"still-here"]
