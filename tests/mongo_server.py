"""A real MongoDB wire-protocol server for tests: ``secantusd-py`` (SecantusDB) in its own process.

No ``mongod`` can be installed here; SecantusDB serves MongoDB's wire protocol over
WiredTiger and advertises a one-node replica set, so ``pymongo`` (change streams
included) cannot tell it from a ``mongod``. It is GPL-2.0 and only ever run as a
process, never imported. The server binds 127.0.0.1 on a free port with a data
directory of its own; ``kill()`` SIGKILLs it and ``start()`` brings it back on the
same port and data directory, which is how tests stage an outage. ``standalone=True``
makes it present itself as a standalone ``mongod``, which (like a real one) refuses
change streams.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

SERVER = os.path.join(os.path.dirname(sys.executable), "secantusd-py")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MongoServer:
    """One ``secantusd-py`` process; ``uri`` is what a ``[mongodb] uri`` key names."""

    def __init__(self, data_dir: str, port: int | None = None, standalone: bool = False,
                 sync_on_commit: bool = True) -> None:
        self.data_dir = str(data_dir)
        self.sync_on_commit = sync_on_commit
        """True (the default): every commit is fsynced, so a SIGKILL loses no acknowledged write; without it the
        server buffers its log like a mongod answering w:1, j:false, and a kill loses the last writes."""
        self.standalone = standalone
        """True: the server presents itself as a standalone mongod, which has no change streams."""
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def uri(self) -> str:
        # directConnection: the server advertises a one-node replica set whose member name may not be
        # 127.0.0.1:PORT; a direct connection talks to the address given whatever the set calls it.
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    @property
    def log_path(self) -> str:
        return self.data_dir.rstrip("/") + ".log"

    def start(self, timeout: float = 30.0) -> "MongoServer":
        """Start the server and return once it answers ``ping``; RuntimeError (with its log tail) if not within *timeout*."""
        if not os.path.exists(SERVER):
            raise RuntimeError(f"{SERVER} is missing: SecantusDB comes with the test extra")
        storage = os.path.join(self.data_dir, "wt")
        os.makedirs(storage, exist_ok=True)
        # An empty config file: --config stops it from picking up a secantusd.toml in the cwd or $HOME.
        config = os.path.join(self.data_dir, "secantusd.toml")
        open(config, "a").close()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [SERVER, "--config", config, "--host", "127.0.0.1", "--port", str(self.port),
             "--storage-path", storage, "--log-level", "WARNING", "--cache-size", "64M",
             *(["--standalone"] if self.standalone else []),
             *(["--sync-on-commit"] if self.sync_on_commit else [])],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.data_dir, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.ping():
                return self
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"secantusd-py did not answer ping within {timeout:g} s: {self.log_tail()}")

    def ping(self, timeout_ms: int = 500) -> bool:
        """Whether the server answers ``ping`` right now."""
        import pymongo
        from pymongo.errors import PyMongoError

        client = pymongo.MongoClient(self.uri, serverSelectionTimeoutMS=timeout_ms,
                                     connectTimeoutMS=timeout_ms, socketTimeoutMS=timeout_ms)
        try:
            client.admin.command("ping")
            return True
        except PyMongoError:
            return False
        finally:
            client.close()

    def client(self, **kwargs):
        """A ``pymongo.MongoClient`` on this server (the caller closes it)."""
        import pymongo

        kwargs.setdefault("serverSelectionTimeoutMS", 5000)
        return pymongo.MongoClient(self.uri, **kwargs)

    def kill(self) -> None:
        """SIGKILL: no flush, no goodbye; the port and data directory stay for ``start()``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after *timeout* seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                return "\n".join(handle.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def remove(self) -> None:
        """Kill the server and delete its data directory."""
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)
