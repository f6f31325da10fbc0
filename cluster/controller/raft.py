"""The metadata in Raft: pysyncobj's replicated log driving ``Metadata``, adapted to the reactor.

pysyncobj runs Raft on a thread of its own (``autoTick``): it applies committed commands there
and calls their callbacks there. So the state machine (``MetadataLog``) takes a lock around
every apply and every read, and ``RaftNode`` hands every callback to the reactor with
``callFromThread``: code on the reactor thread sees Deferreds and listener calls, never a thread.
Commands use the asynchronous API only (``callback=``): the synchronous one blocks for a whole
append period per call.

Calls into pysyncobj that touch its transport (``transferLeadership``) must run on its thread:
``_on_its_thread`` queues them for its next tick.

The journal (``raft.journal``) and snapshots (``raft.snapshot``) live in the data directory; the
journal is memory-mapped and flushed by pysyncobj once a second. They are checked before pysyncobj
opens them (``raft_files``): one it would misread stops the start instead of starting empty. With ``[cluster] secret`` set,
it is pysyncobj's password: peers' traffic is encrypted and a peer without it is not heard.
"""

from __future__ import annotations

import logging
import os
import queue
import threading

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from twisted.internet import defer

from cluster.controller.config import ControllerConfig
from cluster.controller.metadata import Metadata
from cluster.controller.raft_files import check_raft_files

log = logging.getLogger("twistmq.controller")

CODE_VERSION = 1
"""The highest ``@replicated(ver=N)`` of ``MetadataLog``: the leader switches the group to it once it leads."""

_FAILURES = {value: name for name, value in vars(FAIL_REASON).items() if name.isupper()}


class CommitFailed(Exception):
    """A command was not committed (no leader, leadership lost, queue full); ``reason`` is pysyncobj's."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"metadata change not committed: {reason}")
        self.reason = reason


class MetadataLog(SyncObjConsumer):
    """``Metadata`` as pysyncobj's consumer: each command is a replicated method, applied under a lock.

    pysyncobj numbers the replicated methods by their sorted names and writes the number into the
    journal: a command added later must come as a new code version (``@replicated(ver=N)`` and
    ``setCodeVersion``), or a journal written before would replay into the wrong methods.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._state = Metadata()
        self.on_applied = lambda: None  # set by RaftNode: called on pysyncobj's thread after each change

    def _apply(self, name: str, *args):
        with self._lock:
            result = getattr(self._state, name)(*args)
        self.on_applied()
        return result

    @replicated
    def seed(self, slots, routes):
        return self._apply("seed", slots, routes)

    @replicated
    def join(self, record):
        return self._apply("join", record)

    @replicated
    def update(self, record):
        return self._apply("update", record)

    @replicated
    def forget(self, node_id, generation):
        return self._apply("forget", node_id, generation)

    # Code version 1: the broker groups' replicas (RIP-44). Enabled by the leader (``RaftNode.enable_code``)
    # once it leads; numbered after every version 0 method, so a journal written before replays as it was.

    @replicated(ver=1)
    def register_broker(self, group, broker, address, can_master):
        return self._apply("register_broker", group, broker, address, can_master)

    @replicated(ver=1)
    def alter_sync_state_set(self, group, master, master_epoch, new_set, set_epoch):
        return self._apply("alter_sync_state_set", group, master, master_epoch, new_set, set_epoch)

    @replicated(ver=1)
    def elect_master(self, group, broker, alive, unclean):
        return self._apply("elect_master", group, broker, alive, unclean)

    @replicated
    def barrier(self):
        """A no-op: its callback fires once every command before it is applied here."""
        return True

    def read(self, fn):
        """``fn(metadata)`` under the lock: the only way to look at the state from another thread."""
        with self._lock:
            return fn(self._state)

    def _serialize(self):
        with self._lock:
            return self._state.to_dict()

    def _deserialize(self, data):
        with self._lock:
            self._state = Metadata.from_dict(data)


class RaftNode:
    """One controller's Raft member: ``start()``, ``commit(name, *args)``, leadership, ``stop()``."""

    def __init__(self, reactor, cfg: ControllerConfig, data_dir: str, password: str | None = None) -> None:
        self.reactor = reactor
        self.cfg = cfg
        self.address = cfg.raft
        self.metadata = MetadataLog()
        self._leader_listeners: list = []
        self._change_listeners: list = []
        self._thread_calls: queue.SimpleQueue = queue.SimpleQueue()
        self._sync: SyncObj | None = None
        self.leader_changes = 0
        """Times this node became or stopped being the leader (for metrics)."""
        self.conf = SyncObjConf(
            autoTick=True, autoTickPeriod=cfg.tick, appendEntriesPeriod=cfg.append_period,
            raftMinTimeout=cfg.election_min, raftMaxTimeout=cfg.election_max,
            # pysyncobj binds 0.0.0.0 at raft's port unless told: bind exactly what is configured
            bindAddress=cfg.raft_bind or cfg.raft,
            connectionRetryTime=cfg.connection_retry, connectionTimeout=max(3.5, cfg.election_max * 3),
            leaderFallbackTimeout=cfg.leader_fallback,
            logCompactionMinEntries=cfg.compaction_entries, logCompactionMinTime=cfg.compaction_seconds,
            journalFile=os.path.join(data_dir, "raft.journal"), fullDumpFile=os.path.join(data_dir, "raft.snapshot"),
            password=password or None,
            useFork=False,  # forking a process that runs a reactor and threads: not worth it for kilobytes
            commandsWaitLeader=False,  # fail at once without a leader: the caller answers "not leader"
            onStateChanged=self._state_changed_thread,
        )

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the Raft files and start pysyncobj's thread; a file it would misread is ``UnreadableRaftFile``."""
        os.makedirs(os.path.dirname(self.conf.journalFile), exist_ok=True)
        check_raft_files(self.conf.journalFile, self.conf.fullDumpFile)
        self.metadata.on_applied = lambda: self.reactor.callFromThread(self._changed)
        self._sync = SyncObj(self.address, list(self.cfg.peer_addresses()), self.conf, consumers=[self.metadata])
        self._sync.addOnTickCallback(self._run_thread_calls)

    def stop(self) -> defer.Deferred:
        """Stop pysyncobj's thread (closing its sockets and the journal) without blocking the reactor."""
        sync, self._sync = self._sync, None
        if sync is None:
            return defer.succeed(None)
        from twisted.internet import threads
        return threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), sync.destroy_synchronous)

    # -- what the reactor side reads ---------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._sync is not None and self._sync._isLeader()

    @property
    def leader(self) -> str | None:
        """The Raft address of the leader this node knows of (None during an election)."""
        node = self._sync._getLeader() if self._sync is not None else None
        return node.id if node is not None else None

    @property
    def term(self) -> int:
        return self._sync.raftCurrentTerm if self._sync is not None else 0

    def status(self) -> dict:
        """Raft figures for /metrics and ``controllers metadata``."""
        if self._sync is None:
            return {"state": "stopped"}
        s = self._sync.getStatus()
        connected = [peer for peer in self.cfg.peer_addresses() if s.get(f"partner_node_status_server_{peer}") == 2]
        return {"address": self.address, "leader": self.leader, "is_leader": self.is_leader, "term": s["raft_term"],
                "has_quorum": bool(s["has_quorum"]), "commit_index": s["commit_idx"],
                "last_applied": s["last_applied"], "log_length": s["log_len"], "peers": list(self.cfg.peer_addresses()),
                "peers_connected": connected}

    def read(self, fn):
        return self.metadata.read(fn)

    def on_leadership(self, listener) -> None:
        """``listener(is_leader)`` on the reactor thread whenever this node gains or loses the leadership."""
        self._leader_listeners.append(listener)

    def on_change(self, listener) -> None:
        """``listener()`` on the reactor thread after a command changed the metadata."""
        self._change_listeners.append(listener)

    # -- commands -------------------------------------------------------------------------------------

    def commit(self, name: str, *args) -> defer.Deferred:
        """Replicate ``Metadata.name(*args)``; fires with its result once applied here, or fails ``CommitFailed``."""
        if self._sync is None:
            return defer.fail(CommitFailed("stopped"))
        d: defer.Deferred = defer.Deferred()
        try:
            getattr(self.metadata, name)(*args, callback=lambda result, error: self.reactor.callFromThread(
                self._settle, d, result, error))
        except KeyError:  # pysyncobj knows no such command at the enabled code version (not switched yet)
            return defer.fail(CommitFailed(f"command {name} needs code version {CODE_VERSION}, not enabled yet"))
        return d

    def enable_code(self) -> defer.Deferred:
        """Switch every controller to ``CODE_VERSION``'s commands (a Raft command of pysyncobj's own), if not yet."""
        sync = self._sync
        if sync is None:
            return defer.fail(CommitFailed("stopped"))
        if sync.getCodeVersion() >= CODE_VERSION:
            return defer.succeed(None)
        d: defer.Deferred = defer.Deferred()
        sync.setCodeVersion(CODE_VERSION, callback=lambda result, error: self.reactor.callFromThread(
            self._settle, d, result, error))
        return d

    def transfer_leadership(self, target: str | None) -> defer.Deferred:
        """Ask the leader (this node) to hand over to *target* (a Raft address; None: the most caught-up)."""
        d: defer.Deferred = defer.Deferred()
        sync = self._sync
        if sync is None:
            return defer.fail(CommitFailed("stopped"))

        def transfer():
            sync.transferLeadership(target, callback=lambda result, error: self.reactor.callFromThread(
                self._settle, d, result, error))
        self._thread_calls.put(transfer)
        return d

    # -- pysyncobj's thread ------------------------------------------------------------------------------

    def _run_thread_calls(self) -> None:
        while True:
            try:
                call = self._thread_calls.get_nowait()
            except queue.Empty:
                return
            try:
                call()
            except Exception:  # noqa: BLE001 - pysyncobj's thread must go on ticking
                log.exception("raft_thread_call_failed")

    def _state_changed_thread(self, old, new) -> None:
        self.reactor.callFromThread(self._state_changed)

    # -- back on the reactor --------------------------------------------------------------------------

    def _settle(self, d: defer.Deferred, result, error) -> None:
        if error == FAIL_REASON.SUCCESS:
            d.callback(result)
        else:
            d.errback(CommitFailed(_FAILURES.get(error, str(error)).lower()))

    def _state_changed(self) -> None:
        leader = self.is_leader
        self.leader_changes += 1
        log.info("raft_state address=%s leader=%s term=%d", self.address, leader, self.term)
        for listener in self._leader_listeners:
            listener(leader)

    def _changed(self) -> None:
        for listener in self._change_listeners:
            listener()
