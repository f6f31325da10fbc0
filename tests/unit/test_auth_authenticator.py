"""Unit tests of the authenticator: decisions, per-username slow-down on an injected clock, password-free logs."""

import pytest
from twisted.internet import defer, task
from twisted.logger import Logger, formatEvent

from mqtt_proxy.auth.authenticator import BAD_CREDENTIALS, NOT_AUTHORIZED, OK, Authenticator
from mqtt_proxy.auth.passwords import PasswordFile
from store.executor import DeferredExecutor, SynchronousExecutor

SECRET = "s3cret-Pa55"


@pytest.fixture(scope="module")
def passwords():
    table = PasswordFile()
    table.add("alice", SECRET, log_n=4)
    return table


def make(passwords=None, allow_anonymous=False, executor=None, events=None, **kwargs):
    """Build an Authenticator on a task.Clock, logging into *events*."""
    clock = task.Clock()
    auth = Authenticator(passwords, allow_anonymous, clock, executor or SynchronousExecutor(), **kwargs)
    if events is not None:
        auth.log = Logger(namespace="test", observer=events.append)
    return auth, clock


def watch(d):
    """Return a list that receives *d*'s result (or Failure) when it fires."""
    box = []
    d.addBoth(box.append)
    return box


def result_of(d):
    """Return the result of an already fired Deferred."""
    box = watch(d)
    assert box, "Deferred has not fired"
    return box[0]


def test_good_password(passwords):
    """The right password authenticates and the user is verified."""
    auth, _ = make(passwords)
    result = result_of(auth.authenticate("alice", SECRET, "c1", "10.0.0.1"))
    assert (result.ok, result.username, result.reason, result.verified) == (True, "alice", OK, True)
    assert result.acl_username == "alice"
    assert (result.v5_reason_code, result.v3_return_code) == (0, 0)


def test_password_as_bytes(passwords):
    """MQTT carries the password as binary data: UTF-8 bytes work."""
    auth, _ = make(passwords)
    assert result_of(auth.authenticate("alice", SECRET.encode(), "c1", "10.0.0.1")).ok


def test_bad_password_and_unknown_user(passwords):
    """A wrong password, an unknown user and a missing password give BAD_CREDENTIALS (0x86 / 4)."""
    auth, clock = make(passwords, base_delay=0)
    for user, password in (("alice", "nope"), ("mallory", SECRET), ("alice", None), ("alice", b"\xff")):
        result = result_of(auth.authenticate(user, password, "c1", "10.0.0.1"))
        assert (result.ok, result.reason) == (False, BAD_CREDENTIALS)
        assert (result.v5_reason_code, result.v3_return_code) == (0x86, 4)


def test_anonymous_switch(passwords):
    """No username: refused with NOT_AUTHORIZED unless anonymous access is on."""
    auth, _ = make(passwords, allow_anonymous=False, base_delay=0)
    result = result_of(auth.authenticate(None, None, "c1", "10.0.0.1"))
    assert (result.ok, result.reason, result.v5_reason_code, result.v3_return_code) == (False, NOT_AUTHORIZED, 0x87, 5)
    auth, _ = make(passwords, allow_anonymous=True)
    result = result_of(auth.authenticate(None, None, "c1", "10.0.0.1"))
    assert (result.ok, result.username, result.verified) == (True, None, False)


def test_username_without_password_file():
    """Without a password file a username is unverified: accepted only when anonymous access is on."""
    auth, _ = make(None, allow_anonymous=True)
    result = result_of(auth.authenticate("bob", "x", "c1", "h"))
    assert (result.ok, result.username, result.verified) == (True, "bob", False)
    assert result.acl_username is None
    auth, _ = make(None, allow_anonymous=False, base_delay=0)
    assert result_of(auth.authenticate("bob", "x", "c1", "h")).reason == NOT_AUTHORIZED


def test_certificate_identity_as_username(passwords):
    """With use_identity_as_username a verified certificate identity is the username, no password needed."""
    auth, _ = make(passwords, use_identity_as_username=True)
    result = result_of(auth.authenticate(None, None, "c1", "h", cert_identity="device-42"))
    assert (result.ok, result.username, result.verified) == (True, "device-42", True)
    result = result_of(auth.authenticate("alice", "wrong", "c1", "h", cert_identity="device-42"))
    assert result.username == "device-42"


def test_certificate_identity_ignored_when_option_off(passwords):
    """Without the option the certificate does not replace the password check."""
    auth, _ = make(passwords, base_delay=0)
    result = result_of(auth.authenticate("alice", "wrong", "c1", "h", cert_identity="alice"))
    assert not result.ok


def test_password_check_runs_on_executor(passwords):
    """Verification is submitted to the executor and the answer waits for it."""
    executor = DeferredExecutor()
    auth, _ = make(passwords, executor=executor)
    box = watch(auth.authenticate("alice", SECRET, "c1", "h"))
    assert box == [] and len(executor.pending) == 1
    executor.run_pending()
    assert box[0].ok


def test_password_file_needs_executor(passwords):
    """A password file without an executor is a programming error (scrypt would block the reactor)."""
    with pytest.raises(ValueError):
        Authenticator(passwords, False, task.Clock(), None)


def test_failures_slow_down_exponentially(passwords):
    """Each failure for one username doubles the wait, capped, whichever address the next attempt comes from."""
    auth, clock = make(passwords, base_delay=1.0, max_delay=8.0)
    expected = [1.0, 2.0, 4.0, 8.0, 8.0]
    for delay in expected:
        box = watch(auth.authenticate("alice", "wrong", "c1", "10.0.0.1"))
        # the answer to a failure waits for the new delay; the next attempt comes right after it
        assert box == []
        clock.advance(delay - 0.01)
        assert box == []
        clock.advance(0.01)
        assert not box[0].ok
    assert result_of(auth.authenticate("alice", SECRET, "c1", "10.0.0.2")).ok


def test_attempt_during_penalty_waits(passwords):
    """An attempt arriving while its address is penalised is not even checked until the penalty ends."""
    executor = DeferredExecutor()
    auth, clock = make(passwords, executor=executor, base_delay=4.0)
    first = watch(auth.authenticate("alice", "wrong", "c1", "10.0.0.1"))
    executor.run_pending()
    second = watch(auth.authenticate("alice", SECRET, "c2", "10.0.0.1"))
    assert executor.pending == []
    clock.advance(4.0)
    assert not first[0].ok
    assert len(executor.pending) == 1
    executor.run_pending()
    assert second[0].ok
    assert auth.delay_for("10.0.0.1", "alice") == 0.0  # a success clears the username


def test_penalties_are_forgotten(passwords):
    """A username idle longer than forget_after starts afresh; the table is bounded."""
    auth, clock = make(passwords, base_delay=1.0, forget_after=60.0, max_tracked=2)
    for name in ("u1", "u2", "u3"):
        auth.authenticate(name, "wrong", "c", "h")
    assert auth.delay_for("h", "u1") == 0.0  # evicted: only two usernames are tracked
    assert auth.delay_for("h", "u2") == 1.0
    clock.advance(61)
    auth.authenticate("u2", "wrong", "c", "h")
    assert auth.delay_for("h", "u2") == 1.0  # first failure again, not the second


def test_cancel_while_waiting(passwords):
    """Cancelling an attempt that waits on the clock leaves no pending call behind."""
    auth, clock = make(passwords, base_delay=5.0)
    first = auth.authenticate("alice", "wrong", "c", "h")
    second = auth.authenticate("alice", SECRET, "c", "h")
    box = watch(second)
    assert box == []
    first.cancel()
    second.cancel()
    assert isinstance(box[0].value, defer.CancelledError)
    assert clock.getDelayedCalls() == []


def test_logs_never_contain_passwords(passwords):
    """Attempt log lines carry client id, user and address, never the password."""
    events = []
    auth, clock = make(passwords, events=events, base_delay=1.0)
    auth.authenticate("alice", SECRET, "c-ok", "10.1.1.1")
    auth.authenticate("alice", "wrong-" + SECRET, "c-bad", "10.1.1.2")
    clock.advance(10)
    text = "\n".join(formatEvent(e) for e in events)
    assert "mqtt.auth.ok" in text and "mqtt.auth.fail" in text
    assert "c-ok" in text and "10.1.1.2" in text and "alice" in text
    assert SECRET not in text
    assert all(SECRET not in repr(value) for e in events for value in e.values())


def test_accepted_logins_unlogged_when_connection_lines_are_off(passwords):
    """log_ok=False ([log] connection_messages = false): no mqtt.auth.ok event is made; failures are logged."""
    events = []
    auth, clock = make(passwords, allow_anonymous=True, events=events, base_delay=1.0, log_ok=False)
    assert result_of(auth.authenticate(None, None, "anon", "10.1.1.1")).ok
    assert result_of(auth.authenticate("alice", SECRET, "c-ok", "10.1.1.1")).ok
    auth.authenticate("alice", "wrong", "c-bad", "10.1.1.2")
    clock.advance(10)
    text = "\n".join(formatEvent(e) for e in events)
    assert "mqtt.auth.ok" not in text and "mqtt.auth.fail" in text
