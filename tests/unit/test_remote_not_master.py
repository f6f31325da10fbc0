"""A proxy call that reaches a slave on a stale route is made again once the proxy moved the group's store to
its master: the caller sees the master's answer, never the slave's (pure: a stand-in peer, ``task.Clock``)."""

from __future__ import annotations

from twisted.internet import defer, task

from cluster.remote import codec as store_codec
from cluster.remote.store import RemoteStore
from store import api
from store.record import Message

SLAVE = api.AppendResult(api.AppendStatus.SERVICE_NOT_AVAILABLE,
                         reason="this broker is a slave of tcp:127.0.0.1:7850: writes go to the group's master")


class _Peer:
    """One group's connection: answers from the slave until ``retarget``, then from the master."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.peer_id = "broker-g1"
        self.connected = True
        self.at_master = False
        self.calls = []

    def on_event(self, listener):
        pass

    def on_connected(self, listener):
        pass

    def call(self, request_type, body, timeout=None):
        self.calls.append(("master" if self.at_master else "slave", request_type))
        answer = api.AppendResult(api.AppendStatus.PUT_OK, offset=100) if self.at_master else SLAVE
        return defer.succeed(store_codec.pack_result("append", answer))


def _message() -> Message:
    return Message(topic="t/1", body=b"x", qos=1)


def test_a_slaves_not_master_answer_is_retried_at_the_master_after_the_move():
    """The append waits for the move, then goes to the master; its answer is what the caller gets."""
    clock = task.Clock()
    peer = _Peer(clock)
    remote = RemoteStore(peer, wait_connected=5.0)
    got = []
    remote.append(_message()).addCallback(got.append)
    assert got == [] and remote.redirects == 1
    peer.at_master = True
    remote.moved()
    assert got[0].ok and got[0].offset == 100
    assert [who for who, _ in peer.calls] == ["slave", "master"]


def test_without_a_move_it_asks_again_after_the_wait_and_only_once():
    """No new route within the wait: asked once more where it is; a second refusal is the caller's answer."""
    clock = task.Clock()
    peer = _Peer(clock)
    remote = RemoteStore(peer, wait_connected=2.0)
    got = []
    remote.append(_message()).addCallback(got.append)
    clock.advance(2.0)
    assert got == [SLAVE] and len(peer.calls) == 2
