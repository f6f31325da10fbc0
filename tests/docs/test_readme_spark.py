"""The README's Spark example, run from outside the checkout through ./dev python, reads what a node stored."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.docs import readme
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow


def test_readme_spark_example_from_another_directory(tmp_path):
    """ds.py from the README, in a temp dir, with no Spark variables set, counts every simulated reading."""
    if shutil.which("java") is None:
        pytest.skip("Spark needs java")
    from spark import simulator

    data_dir = str(tmp_path / "data")
    node = NodeProcess(data_dir, listeners=("mqtt",)).start()
    try:
        # The simulator's own paho clients, topics (devices/sim-NNN/telemetry) and payloads.
        summary = simulator.main(["--host", "127.0.0.1", "--port", str(node.port("mqtt")), "--devices", "3",
                                  "--count", "5", "--interval", "0", "--silent", "0", "--quiet"])
    finally:
        assert node.stop() in (0, -15)  # -15: twistd re-raises SIGTERM after a clean shutdown
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "ds.py").write_text(readme.file_block("ds.py").text)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYSPARK_") and k not in ("SPARK_HOME", "PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([os.path.join(readme.ROOT, "dev"), "python", "ds.py", data_dir], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    total = sum(summary["published"].values())
    assert total == 15 and f"\n{total} readings\n" in r.stdout, r.stdout
    for device, count in summary["published"].items():
        assert f"|  {device}|       {count}|" in r.stdout, r.stdout
