"""Unit tests of the password hash schemes against fixed vectors made by Mosquitto 2.0.11's mosquitto_passwd."""

import pytest

from mqtt_proxy.auth import hashes
from mqtt_proxy.auth.passwords import PasswordFile, PasswordFileError, verify_password

# Made with mosquitto_passwd (Debian's mosquitto 2.0.11):
#   mosquitto_passwd -b -c FILE alice secret               ($7$, the default: PBKDF2-SHA512, 101 iterations)
#   mosquitto_passwd -b -I 1000 FILE carol 'pässwörd'      ($7$ with 1000 iterations, a non-ASCII password)
#   mosquitto_passwd -b -c -H sha512-pbkdf2 FILE dave 'correct horse'
#   mosquitto_passwd -b -H sha512 FILE bob hunter2         ($6$: Mosquitto 1.x's salted SHA512)
MOSQUITTO_FILE = """\
alice:$7$101$7g5NDEgQpXCAjQXC$IagVRfLmp8PW0nGRmjbjXtzhVQnOEQrMF+T7/Sp6unWNsX6G2GNyPpk1oRPSMZ4CuBmdWRieq9/qVcWvb2Ja2Q==
bob:$6$nQ0Q/aGyU7rGJdFa$4ICtosvbHJ3SV3PCTqgptX8ajP+W40a9i6PNpNav9WdPPgRbb6eD7h32Zj2zu5LeWwQrKtEXO1RKiFjgqwAkpQ==
carol:$7$1000$fvT2jAtStLvCc4rH$knPxQgUqGQ0ju9tnJ1VIAPHMETJ1ns9ysB4h9fr+qhDdG6N/3Uzv5Uet/HZZtULgrBh+Y42aYpcrG3Xb70qERw==
dave:$7$101$BVE24e4MaRLGgHjo$4s1j07ljlUywL74Zxgh/vrSawefqI3dc9oidy6SOyJ7nFbi6Kb7OZibod+bKGO94JD/6EE3eN86/UsLoxzrXUw==
"""
PASSWORDS = {"alice": "secret", "bob": "hunter2", "carol": "pässwörd", "dave": "correct horse"}
VECTORS = {line.split(":", 1)[0]: line.split(":", 1)[1] for line in MOSQUITTO_FILE.splitlines()}


@pytest.mark.parametrize("user", sorted(PASSWORDS))
def test_mosquitto_vectors_verify(user):
    """Each mosquitto_passwd hash accepts its password and refuses a near miss."""
    encoded = VECTORS[user]
    assert verify_password(PASSWORDS[user], encoded)
    assert not verify_password(PASSWORDS[user] + "x", encoded)
    assert not verify_password(PASSWORDS[user][:-1], encoded)


def test_pbkdf2_vector_parses_as_mosquitto_writes_it():
    """$7$ is iterations, a 12-byte salt and a 64-byte PBKDF2-SHA512 digest, padded base64."""
    parsed = hashes.parse_hash(VECTORS["carol"])
    assert (parsed.scheme, parsed.params, len(parsed.salt), len(parsed.digest)) == ("$7$", (1000,), 12, 64)
    parsed = hashes.parse_hash(VECTORS["bob"])
    assert (parsed.scheme, parsed.params, len(parsed.salt), len(parsed.digest)) == ("$6$", (), 12, 64)


def test_unpadded_base64_accepted():
    """A $7$ line whose base64 lost its padding (hand-edited file) still verifies."""
    assert verify_password("secret", VECTORS["alice"].rstrip("="))


def test_mosquitto_file_loads_and_verifies(tmp_path):
    """A whole mosquitto_passwd file loads as it is, and PasswordFile.verify checks each user."""
    path = tmp_path / "passwd"
    path.write_text(MOSQUITTO_FILE, encoding="utf-8")
    table = PasswordFile.load(str(path))
    assert table.users() == ["alice", "bob", "carol", "dave"]
    for user, password in PASSWORDS.items():
        assert table.verify(user, password)
        assert not table.verify(user, "wrong")
    assert not table.verify("nobody", "secret")


def test_scrypt_and_mosquitto_lines_side_by_side(tmp_path):
    """twistmq-admin's scrypt lines and Mosquitto's lines live in one file; saving keeps the Mosquitto hashes."""
    path = tmp_path / "passwd"
    path.write_text(MOSQUITTO_FILE, encoding="utf-8")
    table = PasswordFile.load(str(path))
    table.add("erin", "e-pass", log_n=4)
    table.save()
    again = PasswordFile.load(str(path))
    assert again.verify("erin", "e-pass") and again.verify("alice", "secret") and again.verify("bob", "hunter2")
    assert VECTORS["carol"] in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("encoded,why", [
    ("$7$0$7g5NDEgQpXCAjQXC$" + "A" * 86, "iterations"),
    ("$7$99999999999$7g5NDEgQpXCAjQXC$" + "A" * 86, "iterations"),
    ("$7$abc$7g5NDEgQpXCAjQXC$" + "A" * 86, "ITERATIONS"),
    ("$7$101$7g5NDEgQpXCAjQXC", "ITERATIONS"),
    ("$7$101$!!!!$" + "A" * 86, "base64"),
    ("$7$101$7g5NDEgQpXCAjQXC$AAAA", "length"),
    ("$7$101$$" + "A" * 86, "length"),
    ("$6$nQ0Q/aGyU7rGJdFa$AAAA", "length"),
    ("$6$101$nQ0Q/aGyU7rGJdFa$" + "A" * 86, "$6$SALT$HASH"),
    ("$5$abc$def", "must start with"),
    ("plaintext", "must start with"),
])
def test_malformed_mosquitto_hashes_refused(tmp_path, encoded, why):
    """A malformed $7$/$6$ (or unknown scheme) line is refused at load, naming file, line and the problem."""
    path = tmp_path / "passwd"
    path.write_text(f"# mosquitto\nmallory:{encoded}\n", encoding="utf-8")
    with pytest.raises(PasswordFileError, match=rf"{path}:2: .*") as caught:
        PasswordFile.load(str(path))
    assert why in caught.value.reason
    assert (caught.value.path, caught.value.line) == (str(path), 2)
