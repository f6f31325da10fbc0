"""How long a login attempt waits: failures counted per username and per peer address, separately.

Two keys, because each alone fails:

- **Per username** (the account under attack): each failure for a username
  doubles the delay before that username's next attempt is checked
  (``base_delay``, ``2*base_delay``, ... capped at ``max_delay``), from any
  address. Only a success *for that username* clears it: logging in to one
  account never buys guesses against another.
- **Per address** (one host guessing many usernames): failures fill a leaky
  bucket that drains ``address_limit`` failures per ``window`` seconds. Below
  the limit nothing waits, so the mistakes of one device (themselves slowed by
  its username's delay) never lock out the other clients behind the same
  address (a NAT, a factory gateway); above it, every attempt from the address
  waits, doubling per failure over the limit. A success does not drain it.

An attempt waits for the larger of its username's and its address's delay
before it is checked; a failure is answered only after the new delay. Entries
quiet for longer than ``window`` (and not penalised) are forgotten; at most
``max_tracked`` of each kind are kept (the oldest go first).

Sans-IO: the clock is read through ``clock.seconds()`` (a ``task.Clock`` in
tests); nothing here waits.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["FailureCounter"]

_KEY_CHARS = 256  # a username longer than this is counted under its first 256 characters (bounds the memory)


class _Entry:
    __slots__ = ("level", "until", "last")

    def __init__(self) -> None:
        self.level = 0.0  # failures (usernames: since the last success; addresses: still in the bucket)
        self.until = 0.0  # attempts wait until then
        self.last = 0.0  # when the level was last updated


class FailureCounter:
    """Failed logins per username and per address, and the delays they impose."""

    def __init__(self, clock: Any, *, base_delay: float = 1.0, max_delay: float = 30.0,
                 address_limit: int = 100, window: float = 600.0, max_tracked: int = 10000) -> None:
        self._clock = clock
        self._base = base_delay
        self._max = max_delay
        self._address_limit = address_limit
        self._window = window
        self._drain = address_limit / window if window > 0 else float("inf")  # failures drained per second
        self._max_tracked = max_tracked
        self._users: OrderedDict[str, _Entry] = OrderedDict()
        self._addresses: OrderedDict[str, _Entry] = OrderedDict()

    def _backoff(self, failures: float) -> float:
        return min(self._max, self._base * (2 ** min(max(failures, 1) - 1, 62)))

    def delay(self, username: str | None, address: str) -> float:
        """Seconds an attempt for *username* (None: anonymous) from *address* waits now before it is checked."""
        self._expire()
        now = self._clock.seconds()
        wait = 0.0
        for table, key in ((self._users, username), (self._addresses, address)):
            entry = table.get(key[:_KEY_CHARS]) if key is not None else None
            if entry is not None:
                wait = max(wait, entry.until - now)
        return wait

    def failed(self, username: str | None, address: str) -> float:
        """Count one failure; return the delay before it is answered (and before the next attempt is checked)."""
        now = self._clock.seconds()
        delay = 0.0
        if username is not None:
            user = self._touch(self._users, username[:_KEY_CHARS])
            user.level += 1
            user.last = now
            delay = self._backoff(user.level)
            user.until = max(user.until, now + delay)
        address_entry = self._touch(self._addresses, address)
        address_entry.level = max(0.0, address_entry.level - (now - address_entry.last) * self._drain) + 1
        address_entry.last = now
        over = address_entry.level - self._address_limit
        if over > 0:
            penalty = self._backoff(int(over + 0.999999))
            address_entry.until = max(address_entry.until, now + penalty)
            delay = max(delay, penalty)
        return delay

    def succeeded(self, username: str | None) -> None:
        """A login for *username* succeeded: its own count is cleared (nobody else's, not the address's)."""
        if username is not None:
            self._users.pop(username[:_KEY_CHARS], None)

    def failures(self, username: str | None, address: str) -> tuple[int, int]:
        """The counts now (username's failures, address's failures still in its bucket), for log lines."""
        now = self._clock.seconds()
        user = self._users.get(username[:_KEY_CHARS]) if username is not None else None
        address_entry = self._addresses.get(address)
        in_bucket = 0.0
        if address_entry is not None:
            in_bucket = max(0.0, address_entry.level - (now - address_entry.last) * self._drain)
        return (int(user.level) if user is not None else 0), int(round(in_bucket))

    def _touch(self, table: OrderedDict[str, _Entry], key: str) -> _Entry:
        entry = table.pop(key, None) or _Entry()
        table[key] = entry  # most recently used last
        while len(table) > self._max_tracked:
            table.popitem(last=False)
        return entry

    def _expire(self) -> None:
        now = self._clock.seconds()
        for table in (self._users, self._addresses):
            while table:
                key, entry = next(iter(table.items()))
                if now - entry.last < self._window or entry.until > now:
                    break
                del table[key]

    def tracked(self) -> tuple[int, int]:
        """How many usernames and addresses are remembered (bounded by ``max_tracked`` each)."""
        return len(self._users), len(self._addresses)
