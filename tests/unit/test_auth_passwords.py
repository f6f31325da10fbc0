"""Unit tests of the scrypt password file: hashing, verification, load/save, malformed lines."""

import os
import stat

import pytest

from mqtt_proxy.auth.passwords import (PasswordFile, PasswordFileError, hash_password, validate_username,
                                       verify_password)

FAST = 4  # log2 N for tests: keeps scrypt cheap


def test_hash_round_trip():
    """A hash verifies its own password and no other."""
    encoded = hash_password("correct horse", log_n=FAST)
    assert encoded.startswith("$scrypt$ln=4,r=8,p=1$")
    assert verify_password("correct horse", encoded)
    assert not verify_password("correct hors", encoded)


def test_salt_makes_hashes_differ():
    """Two hashes of one password differ (random salt) and both verify."""
    a, b = hash_password("pw", log_n=FAST), hash_password("pw", log_n=FAST)
    assert a != b
    assert verify_password("pw", a) and verify_password("pw", b)


def test_non_ascii_password():
    """Passwords are UTF-8 text."""
    encoded = hash_password("pässwörd ✓", log_n=FAST)
    assert verify_password("pässwörd ✓", encoded)


def test_save_load_add_delete(tmp_path):
    """Users survive a save/load round trip; delete removes one; the file is mode 0600."""
    path = str(tmp_path / "passwd")
    table = PasswordFile()
    table.add("alice", "a-secret", log_n=FAST)
    table.add("bob", "b-secret", log_n=FAST)
    table.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = open(path).read()
    assert "a-secret" not in text and "b-secret" not in text
    loaded = PasswordFile.load(path)
    assert loaded.users() == ["alice", "bob"]
    assert loaded.verify("alice", "a-secret")
    assert not loaded.verify("alice", "b-secret")
    assert not loaded.verify("nobody", "a-secret")
    loaded.delete("alice")
    loaded.save()
    assert PasswordFile.load(path).users() == ["bob"]
    with pytest.raises(KeyError):
        loaded.delete("alice")


def test_add_replaces_password():
    """Adding an existing user changes its password."""
    table = PasswordFile()
    table.add("alice", "old", log_n=FAST)
    table.add("alice", "new", log_n=FAST)
    assert len(table) == 1
    assert table.verify("alice", "new") and not table.verify("alice", "old")


def test_comments_and_blank_lines_ignored(tmp_path):
    """Comment and blank lines are skipped."""
    path = tmp_path / "passwd"
    path.write_text(f"# users\n\nalice:{hash_password('x', log_n=FAST)}\n")
    assert PasswordFile.load(str(path)).users() == ["alice"]


@pytest.mark.parametrize("line", [
    "alice",
    "alice:plaintext",
    "alice:$scrypt$ln=4,r=8$AAAA$AAAA",
    "alice:$scrypt$ln=99,r=8,p=1$AAAAAAAAAAAAAAAAAAAAAA$" + "A" * 43,
    "alice:$scrypt$ln=4,r=8,p=1$!!!$AAAA",
    "alice:$scrypt$ln=4,r=8,p=1$AAAAAAAAAAAAAAAAAAAAAA$AAAA",
])
def test_malformed_line_names_file_and_line(tmp_path, line):
    """A bad line is rejected with path:line in the message."""
    path = tmp_path / "passwd"
    path.write_text("# header\n" + line + "\n")
    with pytest.raises(PasswordFileError, match=rf"{path}:2: "):
        PasswordFile.load(str(path))


def test_duplicate_user_rejected(tmp_path):
    """A user listed twice is an error naming the second line."""
    encoded = hash_password("x", log_n=FAST)
    path = tmp_path / "passwd"
    path.write_text(f"alice:{encoded}\nalice:{encoded}\n")
    with pytest.raises(PasswordFileError, match=":2: "):
        PasswordFile.load(str(path))


@pytest.mark.parametrize("name", ["", "a:b", "tab\there", " padded", "nl\n"])
def test_bad_usernames(name):
    """Usernames that cannot be stored on one line are refused."""
    with pytest.raises(PasswordFileError):
        validate_username(name)


def test_repr_hides_hashes():
    """repr shows the user count, not hashes."""
    table = PasswordFile()
    table.add("alice", "pw", log_n=FAST)
    assert "scrypt" not in repr(table) and "1 users" in repr(table)


def test_reload_picks_up_added_and_removed_users(tmp_path):
    """reload() re-reads the file in place: a user added to the file verifies, a removed one no longer does."""
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hash_password('a-pw', log_n=FAST)}\n")
    table = PasswordFile.load(str(path))
    path.write_text(f"bob:{hash_password('b-pw', log_n=FAST)}\n")
    table.reload()
    assert table.users() == ["bob"]
    assert table.verify("bob", "b-pw") and not table.verify("alice", "a-pw")


@pytest.mark.parametrize("content", ["alice:$scrypt$broken\n", b"alice:\xff\xfe\n"], ids=["bad-hash", "not-utf8"])
def test_reload_of_a_bad_file_keeps_the_old_table(tmp_path, content):
    """A reload that fails (bad line, not UTF-8, file gone) raises and leaves the users as they were."""
    path = tmp_path / "passwd"
    path.write_text(f"alice:{hash_password('a-pw', log_n=FAST)}\n")
    table = PasswordFile.load(str(path))
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(PasswordFileError, match=rf"^{path}"):
        table.reload()
    assert table.verify("alice", "a-pw")
    path.unlink()
    with pytest.raises(OSError):
        table.reload()
    assert table.verify("alice", "a-pw")
