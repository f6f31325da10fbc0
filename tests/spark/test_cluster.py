"""The telemetry job submitted with spark-submit to a real Spark standalone cluster (master + worker on 127.0.0.1)."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.spark import truth
from tests.spark.checks import argv, check_stats
from tests.spark.helpers import parquet_rows

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Daemon:
    """A Spark daemon run in the foreground by ``spark-class``; its output is kept for diagnostics."""

    def __init__(self, spark_home, cls, args, env):
        self.lines: list[str] = []
        self.changed = threading.Condition()  # a line arrived or the output ended
        self.proc = subprocess.Popen([os.path.join(spark_home, "bin", "spark-class"), cls, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.ended = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def wait_for(self, text, timeout=90.0):
        with self.changed:
            found = self.changed.wait_for(lambda: self.ended or any(text in line for line in self.lines), timeout)
            if found and any(text in line for line in self.lines):
                return
        raise AssertionError(f"no {text!r} from {self.proc.args[1]}:\n{''.join(self.lines)[-3000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def test_job_on_a_standalone_cluster_gives_the_same_results(spark, ground, tmp_path):
    """spark-submit to a local master + worker: the job's tables equal the plain-Python truth, as in local mode."""
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    py = sys.executable
    env = {**os.environ, "SPARK_HOME": spark_home, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": py,
           "PYSPARK_DRIVER_PYTHON": py, "SPARK_NO_DAEMONIZE": "1", "SPARK_WORKER_DIR": str(tmp_path / "work")}
    port = _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    master = _Daemon(spark_home, "org.apache.spark.deploy.master.Master",
                     ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())], env)
    worker = None
    try:
        master.wait_for("I have been elected leader")
        worker = _Daemon(spark_home, "org.apache.spark.deploy.worker.Worker",
                         ["--host", "127.0.0.1", "--cores", "2", "--memory", "1g", "--webui-port", str(_free_port()),
                          "--work-dir", str(tmp_path / "work"), master_url], env)
        worker.wait_for("Successfully registered with master")
        out = tmp_path / "out"
        cmd = [os.path.join(spark_home, "bin", "spark-submit"), "--master", master_url,
               "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
               "--conf", "spark.executor.memory=512m", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.sql.shuffle.partitions=2", "--conf", f"spark.pyspark.python={py}",
               os.path.join(ROOT, "spark", "jobs", "telemetry.py"), *argv(ground, out)]
        started = time.monotonic()
        done = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-4000:]
        print(f"spark-submit took {time.monotonic() - started:.1f}s")
        assert any("app-" in line and "Launching executor" in line for line in master.lines), \
            "the job ran without the cluster's executors"
    finally:
        if worker is not None:
            worker.stop()
        master.stop()

    meas, window_ms = ground["meas"], ground["window_ms"]
    check_stats(parquet_rows(spark, str(out / "telemetry_stats")), truth.window_stats(meas, window_ms), window_ms)
