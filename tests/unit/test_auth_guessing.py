"""Unit tests of password-guessing limits: failures per username and per address, on a task.Clock."""

import pytest
from twisted.internet import task

from mqtt_proxy.auth.authenticator import Authenticator
from mqtt_proxy.auth.guessing import FailureCounter
from mqtt_proxy.auth.passwords import PasswordFile
from store.executor import SynchronousExecutor

SECRET = "s3cret-Pa55"


@pytest.fixture(scope="module")
def passwords():
    table = PasswordFile()
    for name in ("alice", "bob", "carol"):
        table.add(name, SECRET + name, log_n=4)
    return table


def make(passwords, **kwargs):
    clock = task.Clock()
    return Authenticator(passwords, False, clock, SynchronousExecutor(), **kwargs), clock


def attempt(auth, clock, username, password, host):
    """Run one attempt to its answer (advancing the clock to each timer); return (ok, seconds it took)."""
    box = []
    start = clock.seconds()
    auth.authenticate(username, password, "c-" + username, host).addBoth(box.append)
    for _ in range(10):
        if box or not clock.getDelayedCalls():
            break
        clock.advance(min(call.getTime() for call in clock.getDelayedCalls()) - clock.seconds())
    assert box, "no answer"
    return box[0].ok, clock.seconds() - start


def test_another_accounts_success_does_not_reset_the_count(passwords):
    """A valid login to alice from the same address leaves bob's back-off as it was (no guess a second)."""
    auth, clock = make(passwords, base_delay=1.0, max_delay=30.0)
    for _ in range(4):
        assert not attempt(auth, clock, "bob", "guess", "10.0.0.9")[0]
    assert attempt(auth, clock, "alice", SECRET + "alice", "10.0.0.9") == (True, 0.0)
    ok, took = attempt(auth, clock, "bob", "guess", "10.0.0.9")
    assert not ok and took >= 16.0  # the fifth failure for bob: 16 s, not the first failure's 1 s


def test_one_users_failures_do_not_lock_out_the_address(passwords):
    """While one user's fifth failure behind a NAT is held back, the other users of that address log in at once."""
    auth, clock = make(passwords, base_delay=1.0, max_delay=30.0)
    for _ in range(4):
        assert not attempt(auth, clock, "bob", "typo", "192.0.2.1")[0]
    held = []
    auth.authenticate("bob", "typo", "c-bob", "192.0.2.1").addBoth(held.append)  # answered in 16 s
    for user in ("alice", "carol"):
        box = []
        auth.authenticate(user, SECRET + user, "c-" + user, "192.0.2.1").addBoth(box.append)
        assert box and box[0].ok, user  # answered now, not after bob's delay
    assert held == []
    clock.advance(16)
    assert held and not held[0].ok


def test_address_guessing_many_usernames_is_slowed_past_the_limit(passwords):
    """One address trying a new username each time answers at once up to the limit, then waits."""
    auth, clock = make(passwords, base_delay=1.0, max_delay=30.0, address_limit=10, forget_after=600.0)
    for index in range(10):
        assert attempt(auth, clock, f"nobody{index}", "x", "198.51.100.7") == (False, 1.0)  # its username's delay
    # Past the limit the address's own delay doubles per failure, whatever the username.
    took = [attempt(auth, clock, f"other{index}", "x", "198.51.100.7")[1] for index in range(4)]
    assert took == [1.0, 2.0, 4.0, 8.0]
    assert auth.delay_for("198.51.100.8", "alice") == 0.0  # another address is not slowed


def test_success_clears_only_its_own_username():
    """FailureCounter.succeeded clears that username; the address bucket and other names keep their counts."""
    clock = task.Clock()
    counter = FailureCounter(clock, base_delay=1.0, max_delay=30.0, address_limit=3, window=30.0)
    for _ in range(3):
        counter.failed("bob", "h")
    counter.failed("carol", "h")
    counter.succeeded("bob")
    assert counter.failures("bob", "h") == (0, 4)
    assert counter.failures("carol", "h")[0] == 1
    assert counter.delay("bob", "h") > 0  # the address is over its limit of 3


def test_address_bucket_drains_with_time():
    """An address's failures drain at address_limit per window: one device's slow mistakes never reach it."""
    clock = task.Clock()
    counter = FailureCounter(clock, base_delay=1.0, max_delay=30.0, address_limit=100, window=600.0)
    for _ in range(1000):  # one failure every 30 s (its username's capped delay), for more than 8 hours
        counter.failed("misconfigured", "10.1.1.1")
        clock.advance(30)
    assert counter.failures(None, "10.1.1.1")[1] <= 1
    assert counter.delay("someone-else", "10.1.1.1") == 0.0


def test_username_delay_doubles_and_is_capped():
    """A username's delay doubles per failure up to max_delay, from any address."""
    clock = task.Clock()
    counter = FailureCounter(clock, base_delay=0.5, max_delay=4.0)
    assert [counter.failed("u", f"h{i}") for i in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert counter.delay("u", "elsewhere") == 4.0


def test_tables_are_bounded_and_long_names_share_a_key():
    """At most max_tracked usernames and addresses are kept; a huge username is counted by its first 256 chars."""
    clock = task.Clock()
    counter = FailureCounter(clock, max_tracked=3)
    for index in range(10):
        counter.failed(f"user{index}", f"10.0.0.{index}")
    assert counter.tracked() == (3, 3)
    counter.failed("x" * 300 + "a", "h")
    assert counter.failures("x" * 300 + "b", "h")[0] == 1


def test_quiet_entries_are_forgotten():
    """A username quiet for longer than the window (and not penalised) starts afresh."""
    clock = task.Clock()
    counter = FailureCounter(clock, base_delay=1.0, window=60.0)
    counter.failed("u", "h")
    counter.failed("u", "h")
    clock.advance(61)
    assert counter.delay("u", "h") == 0.0
    assert counter.tracked() == (0, 0)
    assert counter.failed("u", "h") == 1.0
