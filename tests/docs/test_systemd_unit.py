"""conf/systemd/twistmq@.service: a unit systemd accepts for every role, unprivileged, reloadable, hardened."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys

import pytest

from cluster.roles.table import ROLES
from tests.docs.readme import ROOT

UNIT = os.path.join(ROOT, "conf", "systemd", "twistmq@.service")
INSTALLED_TWISTD = "/opt/twistmq/bin/twistd"  # where the README's Install section puts it
HARDENING = ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices",
             "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups", "RestrictAddressFamilies",
             "RestrictNamespaces", "LockPersonality", "SystemCallFilter", "CapabilityBoundingSet")


def service_section() -> dict[str, str]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # keys are case-sensitive in unit files
    parser.read(UNIT)
    return dict(parser["Service"])


def test_unit_runs_each_role_unprivileged_with_its_own_state_dir_and_reloads_with_sighup():
    """An instance per role, as user twistmq, data under /var/lib/twistmq/ROLE, reload = SIGHUP, hardened."""
    service = service_section()
    assert service["ExecStart"].startswith(INSTALLED_TWISTD + " --nodaemon --pidfile= twistmq %i")
    assert service["User"] == "twistmq" and service["Group"] == "twistmq"
    assert service["StateDirectory"] == "twistmq/%i" and service["WorkingDirectory"] == "/var/lib/twistmq/%i"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["RestartPreventExitStatus"] == "2"  # a bad config: restarting repeats the same error
    assert [key for key in HARDENING if key not in service] == []


@pytest.mark.parametrize("role", [row.name for row in ROLES])
def test_systemd_analyze_verify_accepts_the_unit(tmp_path, role):
    """systemd-analyze verify passes for twistmq@ROLE, ExecStart pointed at this venv's twistd."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    with open(UNIT, encoding="utf-8") as f:
        text = f.read()
    (tmp_path / "twistmq@.service").write_text(text.replace(INSTALLED_TWISTD, twistd))
    r = subprocess.run(["systemd-analyze", "verify", str(tmp_path / f"twistmq@{role}.service")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "twistmq@" not in r.stderr, r.stderr
