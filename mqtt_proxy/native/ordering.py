"""Per-connection request order: a pipelined request takes effect after the earlier ones it depends on.

queue_server serves one connection's requests one after the other, so a
pipelined ``produce q`` then ``consume q`` hands back the message just
produced. The engine answers each request once its effect is durable, and some
effects land a tick later (a produce is appended on the store's next tick), so
starting every request at once would let the consume read the queue before the
produce is in it. ``RequestOrder`` starts a request only once every earlier
request of the same connection that touches the same queue has been answered.

What a request touches (its keys):

- ``queue``: that queue, plus the real queues of a virtual queue (a produce to
  it lands in each);
- ``topic``: the topic consume queue of its first level (``dev/1`` and ``dev``
  read and feed the same one);
- neither (queue lists, node monitor): everything, so it waits for every
  earlier request and every later one waits for it.

Requests on different queues still run side by side. Replies keep request
order regardless: that is the protocol adapter's slot list.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Mapping

from twisted.internet import defer

from lightqueue.topic import first_level
from mqtt_proxy.native.codec import Request

EVERYTHING = None  # the keys of a request that touches every queue


def request_keys(req: Request, virtual_queues: Mapping[str, Iterable[str]]) -> frozenset | None:
    """The queues ``req`` reads or changes, or ``EVERYTHING``."""
    if req.queue is not None:
        return frozenset([("queue", req.queue), *(("queue", t) for t in virtual_queues.get(req.queue, ()))])
    if req.topic is not None:
        return frozenset([("topic", first_level(req.topic))])
    return EVERYTHING


class _Step:
    """One request: how many earlier steps it still waits for, and who waits for it."""

    __slots__ = ("keys", "start", "result", "waiting", "followers", "finished")

    def __init__(self, keys, start: Callable[[], defer.Deferred]) -> None:
        self.keys = keys
        self.start = start
        self.result: defer.Deferred | None = None  # made only for a step that has to wait
        self.waiting = 0
        self.followers: list[_Step] = []
        self.finished = False


class RequestOrder:
    """Runs one connection's requests so that requests on the same queue take effect in arrival order."""

    def __init__(self, virtual_queues: Mapping[str, Iterable[str]] | None = None) -> None:
        self._virtual = virtual_queues or {}
        self._last: dict = {}  # key -> the latest unfinished step touching it
        self._barrier: _Step | None = None  # the latest unfinished step touching everything
        self._runnable: collections.deque[_Step] = collections.deque()
        self._draining = False
        self._cancelled = False
        self.held = 0  # requests waiting for an earlier one (for tests and metrics)

    def run(self, req: Request, start: Callable[[], defer.Deferred]) -> defer.Deferred:
        """Call ``start()`` (which serves ``req``) once the requests it depends on are answered.

        Fires with ``start()``'s result. Never calls ``start`` after ``cancel()``.
        """
        keys = request_keys(req, self._virtual)
        step = _Step(keys, start)
        if keys is EVERYTHING:
            before = set(self._last.values())
            if self._barrier is not None:
                before.add(self._barrier)
            self._last.clear()  # everything after waits for this step, which waits for them
            self._barrier = step
        else:
            before = {self._last[k] for k in keys if k in self._last}
            if self._barrier is not None:
                before.add(self._barrier)
            for k in keys:
                self._last[k] = step
        for earlier in before:
            earlier.followers.append(step)
        step.waiting = len(before)
        if not step.waiting and not self._draining and not self._cancelled:
            # Nothing to wait for (one request in flight, the common case): no Deferred of our own.
            return start().addBoth(self._finished, step)
        step.result = defer.Deferred()
        if step.waiting:
            self.held += 1
        else:
            self._ready(step)
        return step.result

    def cancel(self) -> None:
        """The connection is gone: requests not started yet never start (a consume would lose its message)."""
        self._cancelled = True
        self._runnable.clear()

    def _ready(self, step: _Step) -> None:
        # A queue instead of recursion: a long chain of requests that finish at once
        # (errors, monitors) must not grow the stack.
        if self._cancelled:
            return
        self._runnable.append(step)
        if self._draining:
            return
        self._draining = True
        try:
            while self._runnable and not self._cancelled:
                s = self._runnable.popleft()
                s.start().addBoth(self._finished, s)
        finally:
            self._draining = False

    def _finished(self, result, step: _Step):
        step.finished = True
        if step.keys is EVERYTHING:
            if self._barrier is step:
                self._barrier = None
        else:
            for k in step.keys:
                if self._last.get(k) is step:
                    del self._last[k]
        followers, step.followers = step.followers, []
        for f in followers:
            f.waiting -= 1
            if f.waiting == 0:
                self.held -= 1
                self._ready(f)
        if step.result is None:
            return result  # started directly: the result goes on down start()'s own chain
        step.result.callback(result)
        return None
