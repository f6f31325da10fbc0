"""When a broker group publishes the wills and ends the sessions it took over: deadline bookkeeping, sans I/O.

A group takes a session over when the proxy that held it is lost (``cluster.local.session_keeper``).
From then on two deadlines may run for it, both counted from the loss and both stored (the will's due
time with the will, the loss as the session's ``disconnected_at``), so a restart re-arms them:

- its will is due after its Will Delay Interval, or when the session ends if that comes first
  (MQTT 5 3.1.3.2.2); a session that was not persistent ends at the loss, so its will is due at once;
- the session expires ``expiry`` seconds after its client left (never for 0xFFFFFFFF).

``SessionDeadlines`` keeps them and answers, for a time, what is due, in deadline order with a will
before its session's end. It reads no clock: times (ms) come in.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

NEVER_EXPIRES = 0xFFFFFFFF
GROUP_HOLDER_PREFIX = "group:"


def group_holder(group: str) -> str:
    """The holder name under which broker group ``group`` holds the sessions it took over (``claim_session``):
    a proxy that closed the sessions of a group it lost hands them over by claiming them in this name."""
    return GROUP_HOLDER_PREFIX + group


@dataclass(frozen=True, slots=True)
class PublishWill:
    """Publish the stored will of ``client_id`` now (and forget it)."""

    client_id: str


@dataclass(frozen=True, slots=True)
class ExpireSession:
    """End the session of ``client_id`` now: delete what is stored of it and release its claim."""

    client_id: str


def expiry_due(expiry_s: int | None, disconnected_at_ms: int | None, lost_ms: int) -> int | None:
    """When a session taken over at ``lost_ms`` ends: ``expiry_s`` after its client left (the loss, if it was
    connected then); None when it never expires. ``expiry_s`` None: no session stored (it ends at the loss)."""
    if expiry_s is None:
        return lost_ms
    if expiry_s == NEVER_EXPIRES:
        return None
    since = lost_ms if disconnected_at_ms is None else disconnected_at_ms
    return since + expiry_s * 1000


def will_due(delay_s: int, stored_due_ms: int | None, lost_ms: int, session_end_ms: int | None) -> int:
    """When a will goes out: the due time stored at the takeover, else the delay from the loss, and never after
    the session ends."""
    due = stored_due_ms if stored_due_ms is not None else lost_ms + delay_s * 1000
    return due if session_end_ms is None else min(due, session_end_ms)


class SessionDeadlines:
    """The due times of the wills and session ends a group holds, per client id."""

    def __init__(self) -> None:
        self._wills: dict[str, int] = {}
        self._ends: dict[str, int] = {}
        self._heap: list[tuple[int, int, str]] = []  # (due ms, 0 will / 1 end, client id); stale entries skipped

    def __len__(self) -> int:
        return len(set(self._wills) | set(self._ends))

    def __contains__(self, client_id: str) -> bool:
        return client_id in self._wills or client_id in self._ends

    def hold(self, client_id: str, will_due_ms: int | None, end_due_ms: int | None) -> None:
        """Hold ``client_id``'s deadlines (replacing any): None for a will not stored or a session never ending."""
        self.forget(client_id)
        if will_due_ms is not None:
            self._wills[client_id] = will_due_ms
            heapq.heappush(self._heap, (will_due_ms, 0, client_id))
        if end_due_ms is not None:
            self._ends[client_id] = end_due_ms
            heapq.heappush(self._heap, (end_due_ms, 1, client_id))

    def forget(self, client_id: str) -> bool:
        """Drop ``client_id``'s deadlines (its client is back elsewhere); True if it had any."""
        had = client_id in self
        self._wills.pop(client_id, None)
        self._ends.pop(client_id, None)
        return had

    def _live(self, entry: tuple[int, int, str]) -> bool:
        due, kind, client_id = entry
        return (self._wills if kind == 0 else self._ends).get(client_id) == due

    def next_due(self) -> int | None:
        """The earliest deadline held (ms), or None."""
        while self._heap and not self._live(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def due(self, now_ms: int, limit: int | None = None) -> list[PublishWill | ExpireSession]:
        """What is due at ``now_ms``, in deadline order, each once; a session's end also publishes its will
        first (the session ends before the delay ran out). At most ``limit`` session ends (a few KV scans each;
        wills are cheap): the rest stay due for the next call (a lost proxy's sessions often end together)."""
        out: list[PublishWill | ExpireSession] = []
        ends = 0
        while self._heap and self._heap[0][0] <= now_ms:
            if limit is not None and ends >= limit and self._heap[0][1] == 1:
                break
            entry = heapq.heappop(self._heap)
            if not self._live(entry):
                continue
            _due, kind, client_id = entry
            if kind == 0:
                del self._wills[client_id]
                out.append(PublishWill(client_id))
            else:
                del self._ends[client_id]
                if self._wills.pop(client_id, None) is not None:
                    out.append(PublishWill(client_id))
                out.append(ExpireSession(client_id))
                ends += 1
        return out
