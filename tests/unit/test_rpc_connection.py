"""The RPC connection's state machine, sans-IO: handshake, refusals, calls and answers (cluster/rpc/connection.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.rpc import frames
from cluster.rpc.connection import Closed, Connection, LocalProtocolError, Opened, State
from cluster.rpc.frames import Call, Error, Event, Heartbeat, Hello, Result

CLIENT = Hello("twistmq", "proxy-1", "proxy", 1)
SERVER = Hello("twistmq", "broker-1", "broker", 1)


def pair():
    """A client and a server connection with the handshake done."""
    client, server = Connection(CLIENT, True, 1024), Connection(SERVER, False, 1024)
    (opened,) = server.receive(client.data_to_send())
    assert opened == Opened(CLIENT)
    (opened,) = client.receive(server.data_to_send())
    assert opened.peer.node_id == "broker-1"
    return client, server


def test_handshake_opens_both_sides():
    """HELLO then HELLO_OK: both sides are open and know each other."""
    client, server = pair()
    assert client.state is server.state is State.OPEN
    assert (client.peer.node_id, server.peer.node_id) == ("broker-1", "proxy-1")


def test_wrong_cluster_id_is_refused_with_a_reason():
    """A HELLO of another cluster gets a GOODBYE naming both ids, and the connection closes."""
    client = Connection(Hello("other", "p", "proxy", 1), True, 1024)
    server = Connection(SERVER, False, 1024)
    (closed,) = server.receive(client.data_to_send())
    assert isinstance(closed, Closed) and not closed.by_peer and "wrong cluster id 'other'" in closed.reason
    (heard,) = client.receive(server.data_to_send())
    assert heard.by_peer and "wrong cluster id" in heard.reason and client.state is State.CLOSED


def test_wrong_version_is_refused():
    """A peer speaking another RPC version is refused (the store codec has no type tags to cope)."""
    client = Connection(Hello("twistmq", "p", "proxy", 2), True, 1024)
    (closed,) = Connection(SERVER, False, 1024).receive(client.data_to_send())
    assert "version 2" in closed.reason


def test_a_call_before_the_handshake_is_refused():
    """The first frame must be HELLO: anything else closes the connection."""
    server = Connection(SERVER, False, 1024)
    (closed,) = server.receive(frames.encode(Call(1, "store.append", b"")))
    assert "unexpected Call" in closed.reason and server.state is State.CLOSED
    assert frames.FrameDecoder(1024).feed(server.data_to_send()) == [frames.Goodbye(closed.reason)]


def test_garbage_and_oversized_frames_are_refused():
    """Bytes that are no frame, or a frame over the cap, close the connection with the decoder's reason."""
    (closed,) = Connection(SERVER, False, 1024).receive(b"GET / HTTP/1.1\r\n\r\n")
    assert isinstance(closed, Closed) and not closed.by_peer
    (closed,) = Connection(SERVER, False, 1024).receive(frames.encode_varint(5000))
    assert "over the limit of 1024" in closed.reason


def test_calls_are_answered_by_id():
    """A call's id comes back on its result or error; answers to forgotten ids are dropped."""
    client, server = pair()
    first = client.call("store.append", b"a")
    second = client.call("store.read_queue", b"b")
    calls = server.receive(client.data_to_send())
    assert calls == [Call(first, "store.append", b"a"), Call(second, "store.read_queue", b"b")]
    server.answer(first, b"ok")
    server.fail(second, "not_found", "no\nsuch   thing")
    assert client.receive(server.data_to_send()) == [Result(first, b"ok"), Error(second, "not_found",
                                                                                  "no such thing")]
    third = client.call("store.append", b"c")
    client.forget(third)
    server.receive(client.data_to_send())
    server.answer(third, b"late")
    assert client.receive(server.data_to_send()) == [] and client.waiting == 0


def test_events_heartbeats_and_goodbye():
    """Events and heartbeats pass through once open; a goodbye closes cleanly."""
    client, server = pair()
    server.event("queue", b"q")
    server.heartbeat(False)
    assert client.receive(server.data_to_send()) == [Event("queue", b"q"), Heartbeat(False)]
    closed = client.goodbye()
    assert closed.clean and client.state is State.CLOSED
    (heard,) = server.receive(client.data_to_send())
    assert heard == Closed("stopping", by_peer=True, clean=True)


def test_calling_before_open_is_our_mistake():
    """Using the connection before its handshake raises LocalProtocolError (not a peer error)."""
    with pytest.raises(LocalProtocolError):
        Connection(CLIENT, True, 1024).call("store.append", b"")


def test_a_second_hello_is_refused():
    """HELLO is only the first frame."""
    client, server = pair()
    (closed,) = server.receive(frames.encode(CLIENT))
    assert "unexpected Hello" in closed.reason


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=24), st.sampled_from([frames.encode(CLIENT),
                                                                    frames.encode(Call(1, "x", b""))])),
                max_size=6))
def test_fuzz_a_server_connection_never_raises(chunks):
    """Whatever a peer sends, the server connection answers with events (a Closed at worst), never an exception,
    and nothing after its Closed."""
    server = Connection(SERVER, False, 64)
    closed = False
    for chunk in chunks:
        events = server.receive(chunk)
        assert not (closed and events)
        closed = closed or any(isinstance(e, Closed) for e in events)
        server.data_to_send()
