"""Start a real ``twistd -n twistmq node`` process for tests and read its bound ports.

Every node binds 127.0.0.1 on port 0 and reports the ports it got in its
``twistmq ready`` line, so tests run in parallel without port clashes.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWISTD = os.path.join(os.path.dirname(sys.executable), "twistd")
READY = re.compile(r"twistmq ready (.*)")


class NodeProcess:
    """One node process (or another ``role``'s) over a data directory; ``start`` again after ``kill`` to test recovery."""

    def __init__(self, data_dir: str, listeners=("mqtt", "http"), extra_args=(), env=None, role="node") -> None:
        self.data_dir = data_dir
        self.role = role
        self.listeners = listeners
        self.extra_args = list(extra_args)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, list[int]] = {}
        self.output: list[str] = []
        self._log = None

    def args(self) -> list[str]:
        args = [TWISTD, "-n", "--pidfile=", "twistmq", self.role, "--data-dir", self.data_dir]
        for kind in self.listeners:
            if kind == "native-udp":
                args += ["--native-udp", "127.0.0.1:0"]
            else:
                args += [f"--{kind}", "tcp:0:interface=127.0.0.1"]
        return args + self.extra_args

    def start(self, timeout: float = 30.0) -> "NodeProcess":
        env = dict(os.environ, **(self.env or {}))
        self._log = open(os.path.join(os.path.dirname(self.data_dir.rstrip("/")) or ".",
                                      os.path.basename(self.data_dir.rstrip("/")) + ".stderr.log"), "ab")
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.PIPE, stderr=self._log, cwd="/", env=env)
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    text = line.decode(errors="replace")
                    self.output.append(text)
                    m = READY.search(text)
                    if m:
                        self.ports = {}
                        for part in m.group(1).split():
                            name, _, addr = part.partition("=")
                            self.ports.setdefault(name, []).append(int(addr.rsplit(":", 1)[1]))
                        self._drain_in_background()
                        return self
            if self.proc.poll() is not None:
                break
        self.stop_hard()
        raise RuntimeError(f"node did not become ready: rc={self.proc.returncode} out={self.output[-20:]}")

    def _drain_in_background(self) -> None:
        # Keep reading stdout so the node never blocks on a full pipe.
        import threading

        def drain(stream, sink):
            for line in iter(stream.readline, b""):
                sink.append(line.decode(errors="replace").rstrip("\n"))
                if len(sink) > 2000:
                    del sink[:1000]
        threading.Thread(target=drain, args=(self.proc.stdout, self.output), daemon=True).start()

    def port(self, kind: str = "mqtt") -> int:
        return self.ports[kind][0]

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log:
            self._log.close()
        return self.proc.returncode

    def stop_hard(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
