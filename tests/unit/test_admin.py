"""Tests of twistmq-admin: certs and passwd subcommands, one-line errors with exit status 2."""

import io
import os
import subprocess
import sys

import pytest
from cryptography import x509

from cluster.admin.errors import AdminError
from cluster.admin.main import main
from cluster.tools import passwd
from mqtt_proxy.auth.passwords import PasswordFile


def admin_command():
    """Return the argv prefix of the installed console script, or ``python -m`` when it is not installed."""
    script = os.path.join(os.path.dirname(sys.executable), "twistmq-admin")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "cluster.admin.main"]


def test_real_command_certs_and_passwd(tmp_path):
    """The real command creates a CA, server and client certificates and a password entry."""
    pki = tmp_path / "pki"
    run = subprocess.run(admin_command() + ["certs", "--out", str(pki), "--client", "dev1", "--host", "broker.lan"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "--mqtt-tls ssl:8883:privateKey=" in run.stdout
    ca = x509.load_pem_x509_certificate((pki / "ca.pem").read_bytes())
    server = x509.load_pem_x509_certificate((pki / "server.pem").read_bytes())
    client = x509.load_pem_x509_certificate((pki / "client-dev1.pem").read_bytes())
    assert server.issuer == ca.subject and client.issuer == ca.subject
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "broker.lan"} <= set(san.get_values_for_type(x509.DNSName))
    assert oct(os.stat(pki / "client-dev1.key").st_mode & 0o777) == "0o600"
    assert b"PRIVATE KEY" not in run.stdout.encode()

    pwfile = tmp_path / "passwd"
    run = subprocess.run(admin_command() + ["passwd", str(pwfile), "alice"], input="pa55word\n",
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "pa55word" not in run.stdout + run.stderr
    assert PasswordFile.load(str(pwfile)).verify("alice", "pa55word")

    run = subprocess.run(admin_command() + ["passwd", str(pwfile), "nobody", "--delete"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "error" in run.stderr


def test_certs_reuses_existing_ca(tmp_path, capsys):
    """A second run signs new client certificates with the same CA."""
    out = str(tmp_path)
    assert main(["certs", "--out", out]) == 0
    ca_before = (tmp_path / "ca.pem").read_bytes()
    assert main(["certs", "--out", out, "--client", "late", "--no-server"]) == 0
    assert (tmp_path / "ca.pem").read_bytes() == ca_before
    client = x509.load_pem_x509_certificate((tmp_path / "client-late.pem").read_bytes())
    assert client.issuer == x509.load_pem_x509_certificate(ca_before).subject


def test_certs_bad_client_name(tmp_path, capsys):
    """A client name that is not a file name is a one-line error, exit 2."""
    assert main(["certs", "--out", str(tmp_path), "--client", "../x"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_passwd_add_change_delete(tmp_path, capsys):
    """passwd adds, updates and deletes users without printing passwords."""
    path = str(tmp_path / "pw")
    assert main(["passwd", path, "alice", "--password", "one"]) == 0
    assert main(["passwd", path, "bob", "--password", "two"]) == 0
    assert main(["passwd", path, "alice", "--password", "three"]) == 0
    table = PasswordFile.load(path)
    assert table.users() == ["alice", "bob"] and table.verify("alice", "three")
    assert main(["passwd", path, "bob", "--delete"]) == 0
    assert PasswordFile.load(path).users() == ["alice"]
    out = capsys.readouterr()
    assert "three" not in out.out + out.err


@pytest.mark.parametrize("argv", [
    ["passwd", "{dir}/pw", "bad:name", "--password", "x"],
    ["passwd", "{dir}/pw", "alice", "--password", ""],
    ["passwd", "{dir}/missing/pw", "alice", "--password", "x"],
    ["passwd", "{dir}/pw", "alice", "--password", "x", "--delete"],
    ["nonsense"],
    [],
])
def test_errors_are_one_line_exit_2(tmp_path, capsys, argv):
    """User errors and usage errors print one line and exit with status 2."""
    argv = [a.format(dir=tmp_path) for a in argv]
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_passwd_reads_stdin_and_refuses_empty():
    """Without a terminal the password is the first line of stdin; an empty one is refused."""
    assert passwd.read_password(io.StringIO("secret\nignored\n")) == "secret"
    with pytest.raises(AdminError):
        passwd.read_password(io.StringIO("\n"))


def test_corrupt_password_file_names_line(tmp_path, capsys):
    """A corrupt password file is reported as file:line."""
    path = tmp_path / "pw"
    path.write_text("garbage\n")
    assert main(["passwd", str(path), "alice", "--password", "x"]) == 2
    assert f"{path}:1:" in capsys.readouterr().err


def test_users_with_the_file_backend(tmp_path, capsys):
    """users add/passwd/list/delete --backend file edit [mqtt] password_file (relative to the config file);
    adding twice, changing a missing user and --superuser are one-line errors with exit status 2."""
    config = tmp_path / "twistmq.toml"
    config.write_text('[mqtt]\npassword_file = "passwd"\n')
    base = ["--backend", "file", "--config", str(config)]
    assert main(["users", "add", "dev-1", *base, "--password", "first-pw"]) == 0
    assert PasswordFile.load(str(tmp_path / "passwd")).verify("dev-1", "first-pw")
    assert main(["users", "passwd", "dev-1", *base, "--password", "second-pw"]) == 0
    assert PasswordFile.load(str(tmp_path / "passwd")).verify("dev-1", "second-pw")
    capsys.readouterr()
    assert main(["users", "list", *base]) == 0 and capsys.readouterr().out.splitlines() == ["dev-1"]
    for argv, message in ((["users", "add", "dev-1", *base, "--password", "x"], "already exists"),
                          (["users", "passwd", "nobody", *base, "--password", "x"], "no user 'nobody'"),
                          (["users", "add", "dev-2", *base, "--password", "x", "--superuser"], "--backend mongodb"),
                          (["users", "add", *base], "needs a USER")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    assert main(["users", "delete", "dev-1", *base]) == 0
    assert PasswordFile.load(str(tmp_path / "passwd")).users() == []


def test_users_mongodb_backend_needs_a_uri(tmp_path, capsys):
    """--backend mongodb with a config that names no [mongodb] uri: one line naming the key, exit status 2."""
    config = tmp_path / "twistmq.toml"
    config.write_text("[auth]\nbackends = [\"mongodb\"]\n")
    assert main(["users", "list", "--backend", "mongodb", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "mongodb.uri must be set" in err and err.count("\n") == 1
