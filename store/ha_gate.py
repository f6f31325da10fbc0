"""What a master's replication holds back in its store: reads and notifies past the confirm offset, and acks.

On a master whose SyncStateSet has slaves, a record past the confirm offset
may still be truncated by a failover (the new master may not hold it), so
nobody is shown it: ``MessageStore`` reads stop at ``read_limit`` as they stop
at the flush policy's visible offset, and the notify of a batch that ends past
it is held here until the confirm offset passes that end. The acknowledgement
of a put waits on ``ack_wait`` (the acknowledgement policy: confirm offset or
``min_in_sync_replicas`` copies) after the flush policy.

A store without a gate (a node, a slave, a broker that never served as master)
has ``read_limit`` None and no ``ack_wait``: nothing changes for it.
"""

from __future__ import annotations

from typing import Callable

from twisted.internet import defer

AckWait = Callable[[int], "defer.Deferred | None"]
"""``ack_wait(log_end)``: None to acknowledge now, else a Deferred that fires once it may be (errback: it may not)."""


class ReplicationGate:
    """The read limit, the notifies it holds back, and the acknowledgement wait."""

    def __init__(self) -> None:
        self.read_limit: int | None = None
        """Commit-log offset below which readers may see records (the confirm offset); None: no limit."""
        self.ack_wait: AckWait | None = None
        self._held: list[tuple[int, set[str]]] = []  # (batch end, queues it touched), in log order

    def shows(self, log_end: int) -> bool:
        """Whether a batch ending at ``log_end`` may be shown (its notify sent) now."""
        return self.read_limit is None or log_end <= self.read_limit

    def hold(self, log_end: int, queues: set[str]) -> None:
        """Keep a batch's notify until the confirm offset passes its end."""
        self._held.append((log_end, queues))

    def advance(self, confirm_offset: int) -> set[str]:
        """The confirm offset moved: the queues whose held notifies it released."""
        if self.read_limit is not None and confirm_offset <= self.read_limit:
            return set()
        self.read_limit = confirm_offset
        released: set[str] = set()
        held = self._held
        i = 0
        while i < len(held) and held[i][0] <= confirm_offset:
            released |= held[i][1]
            i += 1
        if i:
            del held[:i]
        return released

    def open(self) -> set[str]:
        """No limit any more (this broker stopped being a master): the queues of every held notify."""
        released: set[str] = set()
        for _end, queues in self._held:
            released |= queues
        self._held = []
        self.read_limit = None
        self.ack_wait = None
        return released

    def truncated(self, offset: int) -> None:
        """The log was cut to ``offset``: the batches past it are gone, and so are their notifies."""
        self._held = [(end, q) for end, q in self._held if end <= offset]
        if self.read_limit is not None:
            self.read_limit = min(self.read_limit, offset)

    @property
    def held(self) -> int:
        """Notifies held back now."""
        return len(self._held)
