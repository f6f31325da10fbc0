"""Installed as users install servers: the README's Install section, run outside the checkout.

One sdist and one wheel are built (``python -m build``, as the README says) and
checked with ``twine check``; the wheel, with its ``[spark]`` extra, goes into a
fresh virtual environment in a temp dir, using pip's cache (``~/.cache/pip``) so
that only what the cache lacks is downloaded. Then the README's blocks marked
``<!-- readme: install -->`` run in order from a directory outside the checkout,
with no config file and no Spark or Python path variables: a node from the
installed ``twistd``, a retained publish read back by ``mosquitto_sub``, and the
README's Spark example (``ds.py``) counting what a device published. As in
``test_readme.py``, ``/tmp/twistmq`` becomes a temp dir and the fixed ports free
ones; ``/opt/twistmq`` becomes the temp venv. Only the build (``./dev`` lines) runs
in the checkout.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.docs import readme
from tests.docs.test_readme import Rewrite
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow

TOOLS = ("mosquitto_pub", "mosquitto_sub", "java")
DROPPED_VARS = ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME",
                "SPARK_LOCAL_IP", "TWISTMQ_CONFIG")
BUILD_REQUIREMENT = "setuptools==84.2.1"  # pyproject.toml's [build-system] requires


class InstalledNode(NodeProcess):
    """A node started by the README's installed ``twistd -n ... twistmq node`` line, from ``/``."""

    def __init__(self, command: str) -> None:
        self.argv = shlex.split(command, comments=True)
        super().__init__(self.argv[self.argv.index("--data-dir") + 1],
                         env={var: "" for var in DROPPED_VARS})

    def args(self) -> list[str]:
        return self.argv


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in DROPPED_VARS}


def _run(text: str, cwd: str, timeout: float = 900) -> str:
    r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=cwd, env=_env(), capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, (f"failed ({r.returncode}):\n{text}\n"
                               f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}")
    return r.stdout


def test_install_section_from_a_wheel_outside_the_checkout(tmp_path):
    """The wheel installs with [spark] into a fresh venv; a node run from / with no config serves MQTT and Spark."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"the Install section needs {', '.join(missing)}")
    if os.path.exists("/etc/twistmq/twistmq.toml"):
        pytest.skip("/etc/twistmq/twistmq.toml exists: a node without --config would read it, not the defaults")
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp_path / "probe"),
                            BUILD_REQUIREMENT], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"pip cannot fetch {BUILD_REQUIREMENT} (no package index and not in pip's cache): "
                    f"{probe.stderr.strip()[-300:]}")
    rewrite = Rewrite(str(tmp_path))
    venv = str(tmp_path / "opt-twistmq")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.makedirs(rewrite.tmp)
    with open(os.path.join(rewrite.tmp, "ds.py"), "w", encoding="utf-8") as f:
        f.write(readme.file_block("ds.py").text)  # the Spark section's example, which the last block runs

    def adapt(text: str) -> str:
        text = rewrite(text).replace("/opt/twistmq", venv)
        # The interpreter under test makes the venv (python3 on PATH may be another one).
        return "\n".join(sys.executable + line[len("python3"):] if line.startswith("python3 ") else line
                         for line in text.splitlines()) + "\n"

    blocks = [b for b in readme.blocks() if b.kind == "install"]
    assert len(blocks) >= 3 and {b.section for b in blocks} == {"Install"}
    nodes, outputs = [], []
    try:
        for block in blocks:
            for kind, text in readme.steps(block.text):
                if kind == "node":
                    nodes.append(InstalledNode(adapt(text).strip()).start(timeout=120))
                else:  # ./dev lines build in the checkout; the rest runs elsewhere
                    outputs.append(_run(adapt(text), readme.ROOT if text.startswith("./dev ") else str(elsewhere)))
        node = nodes[0]
        node.stop()
        with open(node.data_dir.rstrip("/") + ".stderr.log", encoding="utf-8", errors="replace") as f:
            log = f.read()
    finally:
        for node in nodes:
            node.stop_hard()
    dist = os.path.join(rewrite.tmp, "dist")
    assert sorted(os.listdir(dist)) == ["twistmq-0.1.0-py3-none-any.whl", "twistmq-0.1.0.tar.gz"]
    names = zipfile.ZipFile(os.path.join(dist, "twistmq-0.1.0-py3-none-any.whl")).namelist()
    assert {"cluster/admin/openapi.json", "cluster/admin/dashboard/index.html",
            "twisted/plugins/twistmq_plugin.py"} <= set(names)
    assert not [n for n in names if n.split("/")[0] in ("tests", "bench", "conf", "docs")]
    assert outputs[0].count("PASSED") == 2, outputs[0]  # twine check, both artefacts
    assert all(f" {role} " in outputs[1] for role in ("node", "broker", "proxy"))  # twistd twistmq --help
    assert "hello/world installed" in outputs[2] and "\n1 readings\n" in outputs[2], outputs[2]
    assert f"config=defaults data_dir={node.data_dir}" in log and "node_stopped" in log
    where = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import cluster; print(cluster.__file__)"],
                           cwd=str(elsewhere), env=_env(), capture_output=True, text=True, check=True).stdout
    assert where.startswith(venv + "/lib/"), where  # the installed package, not the checkout
