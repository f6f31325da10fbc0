"""Unit tests of per-connection request order (mqtt_proxy/native/ordering.py): callbacks, no reactor."""

from mqtt_proxy.native.codec import Request
from mqtt_proxy.native.ordering import RequestOrder
from store import native_types


def _req(queue=None, action=native_types.CONSUME):
    return Request(action, {}, queue=queue)


class Server:
    """Records which requests started; answers them when the test says."""

    def __init__(self):
        self.started = []
        self.pending = {}
        self.results = []

    def start(self, name):
        def start(done):
            self.started.append(name)
            self.pending[name] = done
        return start

    def answer(self, name):
        self.pending.pop(name)(f"reply {name}")


def test_same_queue_waits_other_queues_run_side_by_side():
    """A request starts only after the earlier one on its queue is answered; another queue does not wait."""
    order, s = RequestOrder(), Server()
    order.run(_req("a"), s.start("a1"), s.results.append)
    order.run(_req("a"), s.start("a2"), s.results.append)
    order.run(_req("b"), s.start("b1"), s.results.append)
    assert s.started == ["a1", "b1"] and order.held == 1
    s.answer("a1")
    assert s.started == ["a1", "b1", "a2"] and order.held == 0
    s.answer("b1")
    s.answer("a2")
    assert s.results == ["reply a1", "reply b1", "reply a2"]


def test_request_answered_at_once_lets_the_next_start_at_once():
    """A start that calls done before returning (a reply with nothing to wait for) unblocks the next in turn."""
    order, results = RequestOrder(), []
    order.run(_req("q"), lambda done: done("first"), results.append)
    order.run(_req("q"), lambda done: done("second"), results.append)
    assert results == ["first", "second"]


def test_queue_list_waits_for_everything_and_everything_waits_for_it():
    """A request without a queue is a barrier in both directions."""
    order, s = RequestOrder(), Server()
    order.run(_req("a"), s.start("a"), s.results.append)
    order.run(_req(None, native_types.QUEUE_LIST), s.start("list"), s.results.append)
    order.run(_req("b"), s.start("b"), s.results.append)
    assert s.started == ["a"]
    s.answer("a")
    assert s.started == ["a", "list"]
    s.answer("list")
    assert s.started == ["a", "list", "b"]


def test_cancel_stops_requests_not_started_yet():
    """After the connection is gone, a held request never starts (a consume would lose its message)."""
    order, s = RequestOrder(), Server()
    order.run(_req("a"), s.start("a1"), s.results.append)
    order.run(_req("a"), s.start("a2"), s.results.append)
    order.cancel()
    s.answer("a1")
    assert s.started == ["a1"]


def test_barrier_started_with_nothing_unfinished_still_holds_later_requests():
    """A queue list started while nothing else is unfinished still makes every later request wait for it."""
    order, s = RequestOrder(), Server()
    order.run(_req(None, native_types.QUEUE_LIST), s.start("list"), s.results.append)
    order.run(_req("a"), s.start("a"), s.results.append)
    assert s.started == ["list"]
    s.answer("list")
    assert s.started == ["list", "a"]


def test_many_queues_on_one_connection_keep_their_order():
    """Past the per-connection cache of queue keys, requests on each queue still wait for the earlier one."""
    order, s = RequestOrder(), Server()
    for i in range(1100):
        order.run(_req(f"q{i}"), s.start(f"q{i}-1"), s.results.append)
    order.run(_req("q5"), s.start("q5-2"), s.results.append)
    assert "q5-2" not in s.started and len(s.started) == 1100
    s.answer("q5-1")
    assert s.started[-1] == "q5-2"
