"""The RPC connection's state machine, sans-IO: handshake, refusals, calls and answers (cluster/rpc/connection.py)."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.rpc import frames
from cluster.rpc.connection import Closed, Connection, LocalProtocolError, Opened, State
from cluster.rpc.frames import Call, Challenge, Error, Event, Goodbye, Heartbeat, Hello, HelloOk, Proof, Result

CLIENT = Hello("twistmq", "proxy-1", "proxy", 1)
SERVER = Hello("twistmq", "broker-1", "broker", 1)
SECRET = b"s3cret-of-the-cluster"


def nonces(byte: int):
    """A nonce source giving ``byte`` repeated: deterministic handshakes."""
    return lambda n: bytes([byte]) * n


def client_conn(local=CLIENT, secret=SECRET, max_frame=1024) -> Connection:
    return Connection(local, True, max_frame, secret, nonce=nonces(0xC1))


def server_conn(local=SERVER, secret=SECRET, max_frame=1024) -> Connection:
    return Connection(local, False, max_frame, secret, nonce=nonces(0x5E))


def handshake(client: Connection, server: Connection) -> tuple[list, list]:
    """Run the four handshake frames between two connections: (client's events, server's events)."""
    c_events, s_events = [], []
    for _ in range(4):  # HELLO, CHALLENGE, PROOF, HELLO_OK at most
        s_events += server.receive(client.data_to_send())
        c_events += client.receive(server.data_to_send())
    return c_events, s_events


def pair(secret=SECRET):
    """A client and a server connection with the handshake done."""
    client, server = client_conn(secret=secret), server_conn(secret=secret)
    (c_opened,), (s_opened,) = handshake(client, server)
    assert s_opened == Opened(Hello("twistmq", "proxy-1", "proxy", 1, True, b"\xc1" * frames.NONCE_SIZE))
    assert c_opened.peer.node_id == "broker-1"
    return client, server


def test_handshake_opens_both_sides():
    """HELLO, CHALLENGE, PROOF, HELLO_OK: both sides are open and know each other."""
    client, server = pair()
    assert client.state is server.state is State.OPEN
    assert (client.peer.node_id, server.peer.node_id) == ("broker-1", "proxy-1")


def test_the_handshake_frames_carry_nonces_and_hmacs_of_the_secret():
    """Each side's nonce is on the wire and each mac is HMAC-SHA256(secret) over both nonces and identities,
    the server's given before the client proves anything."""
    client, server = client_conn(), server_conn()
    (hello,) = frames.FrameDecoder(1024).feed(client.data_to_send())
    assert hello.nonce == b"\xc1" * 16
    server.receive(frames.encode(hello))
    (challenge,) = frames.FrameDecoder(1024).feed(server.data_to_send())
    assert isinstance(challenge, Challenge) and challenge.nonce == b"\x5e" * 16
    assert challenge.mac == frames.handshake_mac(SECRET, "server", hello, challenge)
    assert client.receive(frames.encode(challenge)) == [] and client.state is State.AWAIT_HELLO_OK
    (proof,) = frames.FrameDecoder(1024).feed(client.data_to_send())
    assert proof == Proof(frames.handshake_mac(SECRET, "client", hello, challenge))
    assert proof.mac != challenge.mac  # labelled by side: one side's proof is no use as the other's
    (opened,) = server.receive(frames.encode(proof))
    assert isinstance(opened, Opened) and frames.FrameDecoder(1024).feed(server.data_to_send()) == [HelloOk()]


def test_a_client_with_another_secret_is_refused_by_the_server():
    """The server proves first; the client (wrong secret) refuses that proof, names the server and not the secret,
    and the server hears why."""
    client, server = client_conn(secret=b"another"), server_conn()
    c_events, s_events = handshake(client, server)
    (refused,) = c_events
    assert not refused.by_peer and "broker 'broker-1' did not prove the cluster secret" in refused.reason
    (heard,) = s_events
    assert heard.by_peer and "[cluster] secret differs" in heard.reason
    for reason in (refused.reason, heard.reason):
        assert "another" not in reason and SECRET.decode() not in reason
    assert client.state is server.state is State.CLOSED


def test_a_fake_client_that_replays_a_proof_is_refused():
    """A client without the secret cannot answer the server's fresh nonce: a proof made for another nonce (replayed
    from an earlier handshake) is refused, named, and the connection closes without opening."""
    client, server = client_conn(), server_conn()
    handshake(client, server)
    old_proof = frames.handshake_mac(SECRET, "client", client.local, server.local)
    fresh = Connection(SERVER, False, 1024, SECRET, nonce=nonces(0x77))  # another nonce this time
    fresh.receive(frames.encode(client.local))
    (closed,) = fresh.receive(frames.encode(Proof(old_proof)))
    assert not closed.by_peer and "proxy 'proxy-1' did not prove the cluster secret" in closed.reason
    assert fresh.state is State.CLOSED and fresh.peer is None
    assert frames.FrameDecoder(1024).feed(fresh.data_to_send())[-1] == Goodbye(closed.reason)


def test_a_fake_server_gets_no_proof_from_the_client():
    """A server that does not know the secret (its mac is garbage) is refused: the client sends no PROOF."""
    client = client_conn()
    client.data_to_send()
    bogus = Challenge("twistmq", "broker-x", "broker", 1, True, b"\x01" * 16, b"\x00" * 32)
    (closed,) = client.receive(frames.encode(bogus))
    assert "broker 'broker-x' did not prove the cluster secret" in closed.reason
    assert frames.FrameDecoder(1024).feed(client.data_to_send()) == [Goodbye(closed.reason)]


def test_empty_secret_on_both_ends_still_handshakes_but_not_against_a_secret():
    """No secret on either end (loopback clusters) opens; a node with a secret refuses a peer without one, both
    ways round."""
    pair(secret=b"")
    for client, server in ((client_conn(secret=b""), server_conn()), (client_conn(), server_conn(secret=b""))):
        c_events, s_events = handshake(client, server)
        assert not any(isinstance(e, Opened) for e in c_events + s_events)
        assert client.state is server.state is State.CLOSED


def test_a_hello_without_a_full_nonce_is_refused():
    """A HELLO whose nonce is not 16 bytes is refused before any challenge."""
    server = server_conn()
    (closed,) = server.receive(frames.encode(Hello("twistmq", "p", "proxy", 1, True, b"short")))
    assert "nonce of 5 bytes" in closed.reason


def test_wrong_cluster_id_is_refused_with_a_reason():
    """A HELLO of another cluster gets a GOODBYE naming both ids, and the connection closes."""
    client = client_conn(Hello("other", "p", "proxy", 1))
    server = server_conn()
    (closed,) = server.receive(client.data_to_send())
    assert isinstance(closed, Closed) and not closed.by_peer and "wrong cluster id 'other'" in closed.reason
    (heard,) = client.receive(server.data_to_send())
    assert heard.by_peer and "wrong cluster id" in heard.reason and client.state is State.CLOSED


def test_wrong_version_is_refused():
    """A peer speaking another RPC version is refused (the store codec has no type tags to cope)."""
    client = client_conn(Hello("twistmq", "p", "proxy", 2))
    (closed,) = server_conn().receive(client.data_to_send())
    assert "version 2" in closed.reason


def test_a_version_2_hello_without_a_nonce_is_refused_for_its_version():
    """An old node's HELLO (seven fields, no nonce) is refused naming the version, not as a malformed frame."""
    old = msgpack.packb([0, 0, "twistmq", "p-old", "proxy", 2, True])
    (closed,) = server_conn().receive(frames.encode_varint(len(old)) + old)
    assert "RPC version 2 not spoken (this node speaks 1)" in closed.reason


def test_a_version_8_hello_without_a_boot_is_refused_for_its_version():
    """A HELLO of version 8 (eight fields: a nonce, no boot) is refused naming the version, not as malformed."""
    old = msgpack.packb([0, 0, "twistmq", "p-old", "proxy", 8, True, b"\x01" * frames.NONCE_SIZE], use_bin_type=True)
    (closed,) = server_conn().receive(frames.encode_varint(len(old)) + old)
    assert "RPC version 8 not spoken (this node speaks 1)" in closed.reason


def test_the_clients_boot_reaches_the_server_and_is_covered_by_its_proof():
    """The client's process life (``boot``) is the server's view of its peer once open; a HELLO whose boot was
    changed on the way fails the client's proof."""
    client, server = client_conn(Hello("twistmq", "proxy-1", "proxy", 1, boot="life-2")), server_conn()
    _, (opened,) = handshake(client, server)
    assert opened.peer.boot == "life-2" and server.peer.boot == "life-2"
    client, server = client_conn(Hello("twistmq", "proxy-1", "proxy", 1, boot="life-2")), server_conn()
    client.data_to_send()
    server.receive(frames.encode(dataclasses.replace(client.local, boot="life-1")))  # changed on the way
    client.receive(server.data_to_send())
    (closed,) = server.receive(client.data_to_send())
    assert "did not prove the cluster secret" in closed.reason


def test_a_call_before_the_handshake_is_refused():
    """The first frame must be HELLO: anything else closes the connection."""
    server = server_conn()
    (closed,) = server.receive(frames.encode(Call(1, "store.append", b"")))
    assert "unexpected Call" in closed.reason and server.state is State.CLOSED
    assert frames.FrameDecoder(1024).feed(server.data_to_send()) == [frames.Goodbye(closed.reason)]


def test_garbage_and_oversized_frames_are_refused():
    """Bytes that are no frame, or a frame over the cap, close the connection with the decoder's reason."""
    (closed,) = server_conn().receive(b"GET / HTTP/1.1\r\n\r\n")
    assert isinstance(closed, Closed) and not closed.by_peer
    (closed,) = server_conn().receive(frames.encode_varint(5000))
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
        client_conn().call("store.append", b"")


def test_a_second_hello_is_refused():
    """HELLO is only the first frame."""
    client, server = pair()
    (closed,) = server.receive(frames.encode(client.local))
    assert "unexpected Hello" in closed.reason


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=24), st.sampled_from([frames.encode(client_conn().local),
                                                                    frames.encode(Proof(b"x" * 32)),
                                                                    frames.encode(Call(1, "x", b""))])),
                max_size=6))
def test_fuzz_a_server_connection_never_raises(chunks):
    """Whatever a peer sends, the server connection answers with events (a Closed at worst), never an exception,
    and nothing after its Closed."""
    server = server_conn(max_frame=64)
    closed = False
    for chunk in chunks:
        events = server.receive(chunk)
        assert not (closed and events)
        closed = closed or any(isinstance(e, Closed) for e in events)
        server.data_to_send()
