"""What LoopbackStore adds to the contract: nothing synchronous, everything through the codec, typed errors."""

from __future__ import annotations

from twisted.internet import defer

from store import api
from store.record import Message
from tests.contract.loopback_store import LoopbackStore


def fired_now(d: defer.Deferred) -> list:
    """What a caller that expects an in-process answer would see at once."""
    out: list = []

    def peek(result):
        out.append(result)
        return result

    d.addBoth(peek)
    return out


def test_results_never_fire_in_the_calling_tick(local):
    """A read the local store answers at once answers a tick later through the loopback, with the same value."""
    loop = LoopbackStore(local.store, local.clock)
    assert fired_now(local.store.end_positions("%LMQ%a")) != []
    later = loop.end_positions("%LMQ%a")
    assert fired_now(later) == []
    assert local.wait(later) == local.wait(local.store.end_positions("%LMQ%a"))
    assert loop.calls == 1


def test_calls_reach_the_store_a_tick_later_in_order(local):
    """add_filter is not in effect when the call returns, and calls made in one tick are applied in order."""
    loop = LoopbackStore(local.store, local.clock)
    added = loop.add_filter("o/#")
    removed = loop.remove_filter("o/#")
    assert local.error(local.store.remove_filter("o/#")).__class__ is api.NotFound  # nothing added yet
    local.wait(added)
    local.wait(removed)  # applied after the add, so it found the interest


def test_errors_cross_as_typed_errors(local):
    """A StoreError keeps its type and message; any other exception arrives as InternalError naming it."""
    loop = LoopbackStore(local.store, local.clock)
    err = local.error(loop.remove_filter("never/added"))
    assert type(err) is api.NotFound and "never/added" in str(err)

    class Broken:
        def end_positions(self, queue):
            raise RuntimeError("disk on fire")

    err = local.error(LoopbackStore(Broken(), local.clock).end_positions("q"))
    assert type(err) is api.InternalError and str(err) == "RuntimeError: disk on fire"


def test_a_result_off_the_interface_is_an_internal_error(local):
    """An implementation answering a value of the wrong type is caught by the codec and reported, not passed on."""
    class Sloppy:
        def end_positions(self, queue):
            return defer.succeed([7])  # positions must be QueuePositions

    err = local.error(LoopbackStore(Sloppy(), local.clock).end_positions("q"))
    assert type(err) is api.InternalError and "end_positions: result" in str(err)


def test_arguments_off_the_interface_are_refused_a_tick_later(local):
    """An argument the codec cannot carry fails the call with InvalidArgument, never synchronously."""
    loop = LoopbackStore(local.store, local.clock)
    d = loop.read_queue(("%LMQ%a", 0), 10)
    assert fired_now(d) == []
    assert isinstance(local.error(d), api.InvalidArgument)
    assert isinstance(local.error(loop.append(Message("t", b"x", qos=True))), api.InvalidArgument)
    assert loop.calls == 0  # refused before anything reached the store


def test_notify_events_cross_the_codec_after_the_store(local):
    """A watcher through the loopback hears each event once, after a watcher on the store registered later."""
    loop = LoopbackStore(local.store, local.clock)
    queue = local.wait(loop.add_filter("ev/#"))
    heard: list[str] = []
    local.wait(loop.watch_queue(queue, lambda q: heard.append("loopback " + q)))
    local.wait(local.store.watch_queue(queue, lambda q: heard.append("store " + q)))
    local.wait(local.store.append(Message("ev/1", b"x")))
    for _ in range(3):
        local.clock.advance(0)
    assert heard == ["store " + queue, "loopback " + queue] and loop.events == 1
