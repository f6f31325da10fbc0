"""The README's examples, run top to bottom as a new user would: the project's docs test.

Every block marked ``<!-- readme: run -->`` runs in order from the checkout
(``tests/docs/readme.py`` says how blocks are marked): ``./dev run`` commands
start a real node in the background, wait for its ``twistmq ready`` line and
stop it with SIGINT (the reader's Ctrl-C) at the next ``##`` section; the other lines run as
``bash -e -o pipefail`` scripts, so any failing command fails the test. So
that it can run beside other nodes and tests, ``/tmp/twistmq`` becomes a temp
dir and the README's fixed ports become free ones; nothing else is changed.
The Spark variables are removed from the environment first: ``./dev`` must set
them. Blocks marked ``skip`` (the benchmarks, a password prompt, transcripts)
are not run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess

import pytest

from tests.docs import readme
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow

PORTS = (1883, 8080, 8883, 9876, 27017)  # the fixed ports the examples use (27017: the MongoDB test server)
TOOLS = ("mosquitto_pub", "mosquitto_sub", "curl", "java")
SPARK_VARS = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rewrite:
    """/tmp/twistmq -> a temp dir and each fixed port -> a free one, in commands and files alike."""

    def __init__(self, tmp: str) -> None:
        self.tmp = os.path.join(tmp, "twistmq")
        self.ports = {p: _free_port() for p in PORTS}

    def __call__(self, text: str) -> str:
        text = text.replace(readme.EXAMPLE_DIR, self.tmp)
        for old, new in self.ports.items():
            text = re.sub(rf"(?<![\d.]){old}(?!\d)", str(new), text)
        return text


class ReadmeNode(NodeProcess):
    """A node started by a README ``./dev run`` line (the ready line and stop logic of NodeProcess)."""

    def __init__(self, command: str) -> None:
        argv = shlex.split(command, comments=True)
        super().__init__(argv[argv.index("--data-dir") + 1])
        self.argv = [os.path.join(readme.ROOT, "dev")] + argv[1:]

    def args(self) -> list[str]:
        return self.argv

    def interrupt(self, timeout: float = 60.0) -> int:
        """Ctrl-C, as the README tells the reader to stop a section's node; returns the exit status."""
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        finally:
            self.stop_hard()
            if self._log:
                self._log.close()


def _kill_left_behind(tmp: str) -> None:
    """SIGKILL what a README line started in the background under *tmp* (the MongoDB test server) and a failed
    block left running: only processes whose command line names this test's own temp dir."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(tmp in arg for arg in argv) and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SPARK_VARS}


def test_readme_top_to_bottom(tmp_path):
    """Every runnable README block works after the ones before it, with only 127.0.0.1 listeners."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"the README examples need {', '.join(missing)}")
    rewrite = Rewrite(str(tmp_path))
    nodes: list[ReadmeNode] = []
    section = None
    ran = []

    def stop_nodes():
        while nodes:
            node = nodes.pop()
            code = node.interrupt()
            assert code in (0, -signal.SIGINT), f"node {node.argv} exited {code} on Ctrl-C"  # twistd re-raises it
            with open(node._log.name, encoding="utf-8", errors="replace") as f:
                assert "node_stopped" in f.read(), f"node {node.argv} did not shut down cleanly on Ctrl-C"

    try:
        for block in readme.blocks():
            if block.section != section:
                stop_nodes()  # the README says to stop the previous section's node
                section = block.section
            if block.kind == "file":
                path = rewrite(block.arg)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(rewrite(block.text))
            if block.kind != "run":
                continue
            for kind, text in readme.steps(block.text):
                text = rewrite(text)
                if kind == "node":
                    node = ReadmeNode(text)
                    nodes.append(node)
                    node.start(timeout=120)
                    ran.append(f"[{section}] node {node.ports}")
                    continue
                r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=readme.ROOT, env=_env(),
                                   capture_output=True, text=True, timeout=600)
                ran.append(f"[{section}] README line {block.line}: rc={r.returncode}\n{text}{r.stdout[-2000:]}")
                assert r.returncode == 0, (f"README block at line {block.line} failed ({r.returncode}):\n{text}\n"
                                           f"stdout: {r.stdout[-3000:]}\nstderr: {r.stderr[-3000:]}")
        stop_nodes()
    finally:
        for node in nodes:
            node.stop_hard()
        _kill_left_behind(rewrite.tmp)
        print("\n".join(ran))
    assert any("jobs.py" in r for r in ran) and any("ds.py" in r for r in ran)
