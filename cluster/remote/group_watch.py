"""``GroupWatch``: a proxy that cannot reach a broker group for a lease closes the sessions that group keeps.

When a broker loses a proxy for a lease it takes over the sessions that proxy held there
(``cluster.local.session_keeper``): their wills are published, their expiry runs. So the proxy,
cut off from the group as long, closes first every session with a part there (its client id's
group, the group of its stored will, a group one of its subscriptions' filters spans): its client
is disconnected (v5: DISCONNECT 0x89 Server busy) and reconnects where the groups can be reached,
so a will never fires for a client still connected. The will of such a session is published from
here if its group can be reached (else that group publishes it).

The session's parts are then handed over: at once in the groups that can be reached, and in the
lost group when it is back, by claiming them in the group's name (``group_holder``) if this
proxy's claim there is still the last; a group with nothing stored of it just has the claim
released.
"""

from __future__ import annotations

import logging

from twisted.internet import defer, task

from cluster.discovery.absence import Absences
from cluster.remote.routed_store import RoutedStore
from store.session_deadlines import group_holder

log = logging.getLogger("twistmq.proxy.group_watch")


class GroupWatch:
    """``GroupWatch(clock, store, registry, holder, lease, tick)``; ``start()`` once the RPC peers are started.

    ``store`` is the proxy's routed store (its ``groups`` are ``RemoteStore``s), ``registry`` the MQTT front
    end's session registry (``close_group_sessions``), ``holder`` this proxy's member id.
    """

    def __init__(self, clock, store: RoutedStore, registry, holder: str, lease: float, tick: float) -> None:
        self.clock = clock
        self.store = store  # its table and groups are read at each use: routes may change while it runs
        self.registry = registry
        self.holder = holder
        self.tick = min(tick, lease / 4)
        self.away = Absences(lease)
        self.pending: dict[str, list[tuple[str, int]]] = {}  # lost group -> (client id, our epoch there)
        self.closed = 0  # sessions closed because a group was lost
        self._loop = task.LoopingCall(self._check)
        self._loop.clock = clock

    def start(self) -> None:
        self._loop.start(self.tick, now=False)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def has_part_in(self, session, group: str) -> bool:
        """Whether ``group`` keeps a part of ``session``: it lives there, or its will or a subscription does."""
        cid = session.client_id
        table = self.store.table
        if table.group_of_client(cid) == group or self.store.will_group(cid) == group:
            return True
        return any(group in table.groups_of_filter(sub.topic_filter) for sub in session.subs.values())

    def _check(self) -> None:
        now = self.clock.seconds()
        for group, remote in list(self.store.groups.items()):
            if remote.peer.connected:
                self.away.seen(group)
                if group in self.pending:
                    self._back(group)
            else:
                self.away.gone(group, now)
        for group in self.away.lost(now):
            self._lost(group)

    def _lost(self, group: str) -> None:
        epochs: dict[str, dict[str, int]] = {}  # client id -> group -> our claim's epoch there

        def has_part(session) -> bool:
            if not self.has_part_in(session, group):
                return False
            epochs[session.client_id] = self.store.claim_epochs(session.client_id)  # before it is released
            return True

        dropped = self.registry.close_group_sessions(has_part)
        self.closed += len(dropped)
        log.warning("proxy_group_lost group=%s lease=%g sessions_closed=%d", group, self.away.lease, len(dropped))
        for client_id, _epoch in dropped:
            for g, epoch in epochs.get(client_id, {}).items():
                if g == group:  # handed over when it is back
                    self.pending.setdefault(group, []).append((client_id, epoch))
                elif self.store.groups[g].peer.connected:
                    self.hand_over(g, client_id, epoch)

    def _back(self, group: str) -> None:
        for client_id, epoch in self.pending.pop(group, ()):
            self.hand_over(group, client_id, epoch)

    def hand_over(self, group: str, client_id: str, epoch: int) -> defer.Deferred:
        """Give ``group`` the part of a session closed here, if our claim there (``epoch``) is still the last."""
        remote = self.store.groups[group]

        @defer.inlineCallbacks
        def run():
            state = yield remote.get_session(client_id)
            if state is None:
                yield remote.release_session(client_id, epoch)
            elif (state.holder, state.epoch) == (self.holder, epoch):  # not claimed elsewhere since
                yield remote.claim_session(client_id, group_holder(group))

        return run().addErrback(lambda f: log.warning("session_hand_over_failed group=%s client=%s reason=%s",
                                                      group, client_id, f.getErrorMessage()))
