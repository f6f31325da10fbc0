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
import functools
from typing import Any, Callable, Iterable, Mapping

from lightqueue.topic import first_level
from mqtt_proxy.native.codec import Request

EVERYTHING = None  # the keys of a request that touches every queue
MAX_CACHED_QUEUES = 1024  # per connection
Start = Callable[[Callable[[Any], None]], None]  # start(done): serve a request, call done(result) once


def request_keys(req: Request, virtual_queues: Mapping[str, Iterable[str]]) -> frozenset | None:
    """The queues ``req`` reads or changes, or ``EVERYTHING``."""
    if req.queue is not None:
        return frozenset([("queue", req.queue), *(("queue", t) for t in virtual_queues.get(req.queue, ()))])
    if req.topic is not None:
        return frozenset([("topic", first_level(req.topic))])
    return EVERYTHING


class _Step:
    """One request: how many earlier steps it still waits for, and who waits for it."""

    __slots__ = ("keys", "start", "on_result", "waiting", "followers")

    def __init__(self, keys, start: Start, on_result: Callable[[Any], None]) -> None:
        self.keys = keys
        self.start = start
        self.on_result = on_result
        self.waiting = 0
        self.followers: list[_Step] = []


class RequestOrder:
    """Runs one connection's requests so that requests on the same queue take effect in arrival order.

    Callbacks, not Deferreds: ``start(done)`` begins serving a request and
    ``done(result)`` ends it (at once or later); a Deferred and its callback
    chain per request were a measurable share of a request's time.
    """

    def __init__(self, virtual_queues: Mapping[str, Iterable[str]] | None = None) -> None:
        self._virtual = virtual_queues or {}
        self._queue_keys: dict[str, frozenset] = {}  # queue name -> its keys (built once, not per request)
        self._last: dict = {}  # key -> the latest unfinished step touching it
        self._barrier: _Step | None = None  # the latest unfinished step touching everything
        self._runnable: collections.deque[_Step] = collections.deque()
        self._draining = False
        self._cancelled = False
        self.held = 0  # requests waiting for an earlier one (for tests and metrics)

    def run(self, req: Request, start: Start, on_result: Callable[[Any], None]) -> None:
        """Call ``start(done)`` (which serves ``req``) once the requests it depends on are answered.

        ``on_result`` gets what ``start`` passed to ``done``. Never calls ``start`` after ``cancel()``.
        """
        keys = self._keys(req)
        step = _Step(keys, start, on_result)
        if not self._last and self._barrier is None:  # nothing unfinished: the one-in-flight case
            if keys is EVERYTHING:
                self._barrier = step
            else:
                for k in keys:
                    self._last[k] = step
            self._ready(step)
            return
        if keys is EVERYTHING:
            before = set(self._last.values())
            if self._barrier is not None:
                before.add(self._barrier)
            self._last.clear()  # everything after waits for this step, which waits for them
            self._barrier = step
        else:
            last = self._last
            before = {last[k] for k in keys if k in last}
            if self._barrier is not None:
                before.add(self._barrier)
            for k in keys:
                last[k] = step
        for earlier in before:
            earlier.followers.append(step)
        step.waiting = len(before)
        if step.waiting:
            self.held += 1
        else:
            self._ready(step)

    def _keys(self, req: Request) -> frozenset | None:
        queue = req.queue
        if queue is None:
            return request_keys(req, self._virtual)
        keys = self._queue_keys.get(queue)
        if keys is None:
            if len(self._queue_keys) >= MAX_CACHED_QUEUES:
                self._queue_keys.clear()
            keys = self._queue_keys[queue] = request_keys(req, self._virtual)
        return keys

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
                s.start(functools.partial(self._finished, s))
        finally:
            self._draining = False

    def _finished(self, step: _Step, result) -> None:
        if step.keys is EVERYTHING:
            if self._barrier is step:
                self._barrier = None
        else:
            last = self._last
            for k in step.keys:
                if last.get(k) is step:
                    del last[k]
        followers, step.followers = step.followers, []
        for f in followers:
            f.waiting -= 1
            if f.waiting == 0:
                self.held -= 1
                self._ready(f)
        step.on_result(result)
