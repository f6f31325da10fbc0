"""Unit tests of the SIGHUP reloader over real files: one log line per file, a bad file keeps the old content."""

import pytest
from twisted.logger import Logger, formatEvent

from mqtt_proxy.auth.acl import load_acl
from mqtt_proxy.auth.passwords import PasswordFile, hash_password
from mqtt_proxy.auth.reload import Reloader, ReloadTarget, security_targets

FAST = 4  # log2 N for tests: keeps scrypt cheap


@pytest.fixture
def files(tmp_path):
    """A password file with alice and an ACL letting alice read a/#, loaded as the node loads them."""
    passwd, acl = tmp_path / "passwd", tmp_path / "acl"
    passwd.write_text(f"alice:{hash_password('a-pw', log_n=FAST)}\n")
    acl.write_text("user alice\ntopic read a/#\n")
    return passwd, acl, PasswordFile.load(str(passwd)), load_acl(str(acl))


def reloader(passwords, acl, tls=()):
    """A Reloader over the node's targets; returns it and the list its log lines go to."""
    events: list = []
    return Reloader(security_targets(passwords, acl, list(tls)),
                    log=Logger(namespace="test", observer=events.append)), events


def lines(events) -> list[str]:
    return [formatEvent(e) for e in events]


def test_one_line_per_file_and_new_content_in_force(files):
    """A good reload logs reload_ok once per file with its path, and the new users and rules apply."""
    passwd, acl_path, passwords, acl = files
    passwd.write_text(f"bob:{hash_password('b-pw', log_n=FAST)}\n")
    acl_path.write_text("user bob\ntopic readwrite b/#\n")
    r, events = reloader(passwords, acl)
    assert r.reload() == {"passwords": True, "acl": True}
    assert lines(events) == [f"reload_ok kind=passwords file={passwd} users=1",
                             f"reload_ok kind=acl file={acl_path} users=1 clients=0 rules=1"]
    assert passwords.verify("bob", "b-pw") and not passwords.verify("alice", "a-pw")
    assert acl.allowed("bob", "c", "b/x", "write") and not acl.allowed("alice", "c", "a/x", "read")


def test_bad_acl_is_logged_and_kept_while_passwords_reload(files):
    """A broken ACL logs reload_failed (file, line, reason) and keeps its rules; the password file still reloads."""
    passwd, acl_path, passwords, acl = files
    passwd.write_text(f"bob:{hash_password('b-pw', log_n=FAST)}\n")
    acl_path.write_text("user alice\ntopic read a/#\ntopic rw a/#\n")
    r, events = reloader(passwords, acl)
    assert r.reload() == {"passwords": True, "acl": False}
    failed = [ln for ln in lines(events) if ln.startswith("reload_failed")]
    assert failed == [f"reload_failed kind=acl file={acl_path} line=3 reason=\"unknown access 'rw' in a 'topic' "
                      "line (expected read, write, readwrite or deny)\" kept=previous"]
    assert events[-1]["log_level"].name == "error" and events[-1]["line"] == 3
    assert acl.allowed("alice", "c", "a/x", "read")
    assert passwords.verify("bob", "b-pw")


def test_bad_password_file_is_logged_and_kept(files):
    """A broken password file logs reload_failed with its line and keeps the old users able to log in."""
    passwd, acl_path, passwords, acl = files
    passwd.write_text("# users\nalice:$7$0$AAAA$AAAA\n")
    r, events = reloader(passwords, acl)
    assert r.reload() == {"passwords": False, "acl": True}
    assert lines(events)[0].startswith(f"reload_failed kind=passwords file={passwd} line=2 reason=")
    assert passwords.verify("alice", "a-pw")


def test_missing_file_is_logged_and_kept(files):
    """A password file that disappeared logs why (no such file) and keeps the users."""
    passwd, _acl_path, passwords, acl = files
    passwd.unlink()
    r, events = reloader(passwords, acl)
    assert r.reload()["passwords"] is False
    assert lines(events)[0] == (f"reload_failed kind=passwords file={passwd} line=- "
                                "reason='No such file or directory' kept=previous")
    assert passwords.verify("alice", "a-pw")


def test_nothing_configured_says_so():
    """With no password file, no ACL and no TLS listener a reload logs one line saying there is nothing to do."""
    r, events = reloader(None, load_acl(None))
    assert r.reload() == {}
    assert r.targets == [] and "nothing to reload" in lines(events)[0]


def test_a_crashing_target_does_not_stop_the_others(files):
    """An unexpected exception in one target is logged with its traceback and the next target still reloads."""
    _passwd, acl_path, _passwords, acl = files

    def broken():
        raise RuntimeError("bug")
    events: list = []
    r = Reloader([ReloadTarget("tls", "/x/cert.pem", broken, "mqtt-tls")] + security_targets(None, acl, []),
                 log=Logger(namespace="test", observer=events.append))
    assert r.reload() == {"tls:mqtt-tls": False, "acl": True}
    text = lines(events)
    assert text[0] == ("reload_failed kind=tls listener=mqtt-tls file=/x/cert.pem reason='internal error' "
                       "kept=previous")
    assert "log_failure" in events[0]
    assert text[1].startswith(f"reload_ok kind=acl file={acl_path}")
