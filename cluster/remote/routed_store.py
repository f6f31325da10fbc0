"""``RoutedStore``: one ``store.api.Store`` over several broker groups, routed by ``cluster.routing``.

A proxy holds one store per group (remote, over RPC) and this facade in front
of them, so the MQTT front end and the native server see a single store:

- appends go to the group of the message's topic (a batch is split by group
  and its results put back in order);
- a light queue is read, watched and filtered in every group its filter spans;
  positions name their group, so a read goes to exactly one;
- session state goes to the client id's group, share positions to the group
  each position names, retained messages to their topic's group (a filter's
  retained messages are merged from every group it spans);
- native requests go to the queue's group (or the topic's), or to the group a ``msg_id`` they carry
  names (a produce to a virtual queue whose real queues live in other groups than its own goes to
  each real queue's group, so a consume of any of them finds it): the ids in replies are ``cluster.remote.msg_ids``'s (group number above the offset), so
  they are unique across groups and a confirm, ack or timer cancel finds its group;
- a timer id is a msg_id too: cancelling goes to the group it names (a plain offset, as ids were
  before groups were numbered, asks each group in turn).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Callable, Mapping, Sequence

from twisted.internet import defer

from cluster.remote.msg_ids import GroupIds, pack
from cluster.routing import SlotTable
from lightqueue.topic import filter_of
from mqtt_proxy.native.codec import echo_of
from store import api, native_types
from store.record import Message

log = logging.getLogger("twistmq.cluster.remote.routed_store")


def _concat(results) -> tuple:
    return tuple(itertools.chain.from_iterable(r for _, r in results))


def _first_error(results):
    for ok, value in results:
        if not ok:
            return value
    return None


def _gathered(ds: list[defer.Deferred]) -> defer.Deferred:
    """Fires with every result in order, or fails with the first failure (after all have fired)."""
    def done(results):
        failure = _first_error(results)
        if failure is not None:
            return failure
        return results
    return defer.DeferredList(ds, consumeErrors=True).addCallback(done)


def _hand_to(result, waiter: defer.Deferred) -> None:
    """Give a shared Deferred's result to one of its waiters (the shared one keeps none: it is handled there)."""
    waiter.callback(result)  # a Failure errbacks the waiter


@dataclasses.dataclass(eq=False)
class _Claim:
    """This store's claim of a client id: its home epoch and the epoch of each group it was made in."""

    home_epoch: int
    epochs: dict[str, int]
    holder: str
    owner: str
    lazy: bool
    """The groups not in ``epochs`` are claimed at the session's first write there (a fresh id), not missed."""
    skipped: set[str] = dataclasses.field(default_factory=set)
    """Groups a first-write claim could not reach (missed, as an unreachable group at the claim is)."""
    claiming: dict[str, defer.Deferred] = dataclasses.field(default_factory=dict)
    """Group -> its first-write claim on its way."""


class RoutedStore:
    """``store.api.Store`` over ``{group: Store}`` (see the module doc)."""

    def __init__(self, table: SlotTable, groups: dict[str, api.Store],
                 group_numbers: Mapping[str, int] | None = None,
                 virtual_queues: Mapping[str, Sequence[str]] | None = None) -> None:
        missing = set(table.groups) - set(groups)
        if missing:
            raise ValueError(f"no store for broker groups {sorted(missing)}")
        self.table = table
        self.groups = groups
        self._group_numbers = dict(group_numbers or {})
        self._ids = GroupIds(groups, self._group_numbers)
        self.native_unavailable = 0  # native requests answered for a group that could not be reached
        # ``[native] virtual_queues``: a virtual queue -> its real queues (the brokers know them too)
        self.virtual_queues = {name: tuple(dict.fromkeys(targets)) for name, targets in (virtual_queues or {}).items()}
        self._watch_ids = itertools.count(1)
        self._watches: dict[int, tuple[str, list[tuple[api.Store, api.Watch]]]] = {}
        self._claims: dict[str, _Claim] = {}  # client id -> this store's last claim of it
        self._outbound_group: dict[tuple[str, int], str] = {}  # (client id, packet id) -> group of its position
        self._will_group: dict[str, str] = {}  # client id -> the group its stored will is in (its topic's)

    @property
    def ids(self) -> GroupIds:
        """msg_ids: each group's number above its offsets (numbered again if the groups change)."""
        if set(self._ids.numbers) != set(self.groups) | set(self._group_numbers):
            self._ids = GroupIds(self.groups, self._group_numbers)
        return self._ids

    def reroute(self, table: SlotTable, groups: dict[str, api.Store]) -> None:
        """Route by ``table`` over ``groups`` from the next call on (the controllers' metadata changed).

        Watches and filter interest already taken stay with the groups they were taken in: slots do
        not move at run time, so a changed table only adds groups or explicit routes.
        """
        missing = set(table.groups) - set(groups)
        if missing:
            raise ValueError(f"no store for broker groups {sorted(missing)}")
        self.table, self.groups = table, groups

    def _group(self, name: str) -> api.Store:
        try:
            return self.groups[name]
        except KeyError:
            raise api.WrongGroup(f"no broker group {name!r} (groups: {', '.join(self.table.groups)})") from None

    def _each(self, names, call: Callable[[api.Store], defer.Deferred]) -> defer.Deferred:
        try:
            ds = [defer.maybeDeferred(call, self._group(n)) for n in names]
        except api.StoreError as exc:
            return defer.fail(exc)
        return _gathered(ds)

    # -- the message log -------------------------------------------------------------------------------

    def append(self, message: Message) -> defer.Deferred:
        if not isinstance(message, Message):
            return defer.fail(api.InvalidArgument(f"expected a Message, got {type(message).__name__}"))
        return self.groups[self.table.group_of_topic(message.topic)].append(message)

    def append_batch(self, messages: tuple[Message, ...]) -> defer.Deferred:
        if set(map(type, messages)) - {Message}:
            for message in messages:
                if not isinstance(message, Message):
                    return defer.fail(api.InvalidArgument(f"expected a Message, got {type(message).__name__}"))
        if len(self.table.groups) == 1:  # every topic is the one group's: no hashing per message
            return self.groups[self.table.groups[0]].append_batch(tuple(messages))
        by_group: dict[str, list[int]] = {}
        group_of: dict[str, str] = {}  # a tick's publishes come from few topics: each is hashed once
        for i, message in enumerate(messages):
            topic = message.topic
            group = group_of.get(topic)
            if group is None:
                group = group_of[topic] = self.table.group_of_topic(topic)
            by_group.setdefault(group, []).append(i)
        if len(by_group) == 1:
            (group,) = by_group
            return self.groups[group].append_batch(tuple(messages))
        order = list(by_group.items())

        def merge(results):
            out: list = [None] * len(messages)
            for (_, indexes), (_, group_results) in zip(order, results):
                for i, result in zip(indexes, group_results):
                    out[i] = result
            return tuple(out)

        ds = [self.groups[g].append_batch(tuple(messages[i] for i in idx)) for g, idx in order]
        return _gathered(ds).addCallback(merge)

    # -- queues ------------------------------------------------------------------------------------------

    def first_positions(self, queue: str) -> defer.Deferred:
        return self._each(self.table.groups_of_queue_name(queue), lambda s: s.first_positions(queue)).addCallback(
            _concat)

    def end_positions(self, queue: str) -> defer.Deferred:
        return self._each(self.table.groups_of_queue_name(queue), lambda s: s.end_positions(queue)).addCallback(
            _concat)

    def read_queue(self, position: api.QueuePosition, max_count: int) -> defer.Deferred:
        if not isinstance(position, api.QueuePosition):
            return defer.fail(api.InvalidArgument(f"expected a QueuePosition, got {type(position).__name__}"))
        try:
            store = self._group(position.group)
        except api.StoreError as exc:
            return defer.fail(exc)
        return store.read_queue(position, max_count)

    def add_filter(self, topic_filter: str, restoring: bool = False) -> defer.Deferred:
        try:
            groups = self.table.groups_of_filter(topic_filter)
        except Exception as exc:  # noqa: BLE001 - a bad filter is the inner stores' error to name
            return defer.fail(api.InvalidArgument(f"topic filter {topic_filter!r}: {exc}"))
        return self._each(groups, lambda s: s.add_filter(topic_filter, restoring)).addCallback(lambda rs: rs[0][1])

    def remove_filter(self, topic_filter: str) -> defer.Deferred:
        return self._each(self.table.groups_of_filter(topic_filter),
                          lambda s: s.remove_filter(topic_filter)).addCallback(lambda _: None)

    def watch_queue(self, queue: str, callback: Callable[[str], None]) -> defer.Deferred:
        watch_id = next(self._watch_ids)
        stores = [self._group(g) for g in self.table.groups_of_queue_name(queue)]

        def registered(results):
            inner = [(store, w) for store, (_, w) in zip(stores, results)]
            self._watches[watch_id] = (queue, inner)
            return api.Watch(queue, watch_id)

        return _gathered([s.watch_queue(queue, callback) for s in stores]).addCallback(registered)

    def unwatch_queue(self, watch: api.Watch) -> defer.Deferred:
        entry = self._watches.pop(getattr(watch, "watch_id", None), None)
        if entry is None or entry[0] != watch.queue:
            return defer.fail(api.NotFound(f"no watch {watch!r}"))
        return _gathered([store.unwatch_queue(w) for store, w in entry[1]]).addCallback(lambda _: None)

    # -- session state ----------------------------------------------------------------------------------------
    #
    # A session lives in its client id's group (the home: meta, QoS 2 ids, the claim that fences older
    # holders). Each group a subscription's filter spans also keeps that subscription with its own position,
    # the outbound messages read from it and a copy of the session's meta, so that group's broker holds the
    # filter's interest and its retention keeps what the session owes while no proxy holds it. The front end
    # sees the home group's epoch; this store carries each group's, until the session is released.
    #
    # A CONNECT claims at home first (``claim_and_get``: the claim and the stored session in one call). An id
    # somebody held, or with a stored session, is then claimed in every other group at once, so its old holder
    # is fenced everywhere before anything is read. A fresh id (nobody held it, nothing stored: most CONNECTs)
    # has nothing in the other groups and no holder there to fence: each is claimed just before the session's
    # first write to it, so a connect costs one call per group the session uses, not one per group. A group a
    # claim could not reach is not read for the session (it would only keep the CONNECT waiting a second call
    # timeout); its writes carry epoch 0, which passes only where nobody ever claimed the session, and are not
    # waited for where they go to every group.

    @property
    def claims(self) -> int:
        """Client ids whose claim this store carries (claimed and not yet released)."""
        return len(self._claims)

    def _home(self, client_id: str) -> str:
        if not isinstance(client_id, str):
            raise api.InvalidArgument(f"client id must be a string, not {type(client_id).__name__}")
        return self.table.group_of_client(client_id)

    def _current(self, client_id: str, epoch: int) -> _Claim | None:
        """This store's claim of ``client_id`` if ``epoch`` is its home epoch."""
        claim = self._claims.get(client_id)
        return claim if claim is not None and claim.home_epoch == epoch else None

    def _epoch_in(self, client_id: str, group: str, epoch: int) -> int:
        """The epoch to write ``group`` with, for a writer holding home epoch ``epoch``."""
        claim = self._current(client_id, epoch)
        if claim is not None:
            return claim.epochs.get(group, 0)  # 0: the group could not be reached when the session was claimed
        # Not this proxy's last claim: the home group judges it; elsewhere it must not pass a newer claim.
        return epoch if group == self._home(client_id) else 0

    def _in(self, client_id: str, group: str, epoch: int, call: Callable[[api.Store, int], defer.Deferred],
            missed_unwaited: str = "") -> defer.Deferred:
        """``call(group's store, the epoch to write it with)``; a group the claim left for the first write is
        claimed first. Raises StoreError for an unknown group.

        ``missed_unwaited`` (the operation's name): if that claim cannot reach the group, the write is still
        tried there but not waited for (as a group missed at the CONNECT's claim is, by ``put_session``).
        """
        store = self._group(group)
        claim = self._current(client_id, epoch)
        if claim is None or not claim.lazy or group in claim.epochs or group in claim.skipped:
            return defer.maybeDeferred(call, store, self._epoch_in(client_id, group, epoch))
        shared = claim.claiming.get(group)
        if shared is None:
            shared = claim.claiming[group] = defer.maybeDeferred(
                store.claim_session, client_id, claim.holder, claim.owner).addCallbacks(
                self._first_claimed, self._first_missed, callbackArgs=(client_id, group, claim),
                errbackArgs=(client_id, group, claim))
        waiter = defer.Deferred()
        shared.addBoth(_hand_to, waiter)

        def claimed(there: int):
            d = defer.maybeDeferred(call, store, there)
            if missed_unwaited and group in claim.skipped:
                d.addErrback(self._write_missed, group, client_id, missed_unwaited)
                return None
            return d

        return waiter.addCallback(claimed)

    def _first_claimed(self, there: int, client_id: str, group: str, claim: _Claim) -> int:
        claim.claiming.pop(group, None)
        if self._claims.get(client_id) is not claim:  # released (or claimed again) while this claim was on its way
            self.groups[group].release_session(client_id, there).addErrback(self._release_failed, group, client_id)
            raise api.Fenced(f"session {client_id!r} was released while group {group!r} was being claimed")
        claim.epochs[group] = there
        return there

    def _first_missed(self, failure, client_id: str, group: str, claim: _Claim) -> int:
        claim.claiming.pop(group, None)
        self._claim_missed(failure, group, client_id)
        claim.skipped.add(group)
        return 0

    def _write(self, client_id: str, groups, name: str, *args, epoch: int) -> defer.Deferred:
        try:
            ds = [self._in(client_id, g, epoch, lambda store, there: getattr(store, name)(client_id, *args, there))
                  for g in groups]
        except api.StoreError as exc:
            return defer.fail(exc)
        return _gathered(ds).addCallback(lambda _: None)

    def _spanned(self, client_id: str, topic_filter: str) -> tuple[str, ...]:
        return self.table.groups_of_filter(topic_filter)

    def claim_session(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred:
        """``claim_and_get``'s epoch."""
        return self.claim_and_get(client_id, holder, owner).addCallback(lambda claimed: claimed.epoch)

    def claim_and_get(self, client_id: str, holder: str, owner: str = "") -> defer.Deferred:
        """Claim at home (it must answer), then, unless the id is fresh, in every other group that can be reached
        now, reading each group's part of a stored session with its claim (see the section's comment)."""
        try:
            home = self._home(client_id)
            home_store = self._group(home)
        except api.StoreError as exc:
            return defer.fail(exc)
        others = tuple(g for g in self.table.groups if g != home)

        def at_home(found: api.ClaimedSession):
            fresh = found.session is None and not found.taken_from
            if fresh or not others:
                self._claims[client_id] = _Claim(found.epoch, {home: found.epoch}, holder, owner, lazy=bool(others))
                return found
            ds = [defer.maybeDeferred(self.groups[g].claim_and_get, client_id, holder, owner).addErrback(
                self._claim_missed, g, client_id) for g in others]
            return defer.DeferredList(ds, consumeErrors=True).addCallback(everywhere, found)

        def everywhere(results, found: api.ClaimedSession):
            failure = _first_error(results)
            if failure is not None:  # refused by another group: the client is refused, its claims are nobody's
                self._release_all(client_id, {home: found.epoch} | {
                    g: c.epoch for g, (ok, c) in zip(others, results) if ok and c is not None})
                return failure
            epochs = {home: found.epoch}
            parts = [(home, found.session)]
            for group, (_ok, there) in zip(others, results):
                if there is not None:
                    epochs[group] = there.epoch
                    parts.append((group, there.session))
            self._claims[client_id] = _Claim(found.epoch, epochs, holder, owner, lazy=False)
            if found.session is None:
                return found
            if len(epochs) < len(self.table.groups):
                log.warning("session_part_skipped groups=%s client=%s reason=unreachable at its claim",
                            ",".join(sorted(g for g in self.table.groups if g not in epochs)), client_id)
            return api.ClaimedSession(found.epoch, self._merge(client_id, parts), found.taken_from)

        return defer.maybeDeferred(home_store.claim_and_get, client_id, holder, owner).addCallback(at_home)

    def _release_all(self, client_id: str, epochs: dict[str, int]) -> defer.Deferred:
        return _gathered([defer.maybeDeferred(self.groups[g].release_session, client_id, e).addErrback(
            self._release_failed, g, client_id) for g, e in epochs.items()]).addCallback(lambda _: None)

    @staticmethod
    def _release_failed(failure, group: str, client_id: str) -> None:
        log.warning("session_release_failed group=%s client=%s reason=%s", group, client_id, failure.getErrorMessage())

    def release_session(self, client_id: str, epoch: int) -> defer.Deferred:
        """Release the claim in each group it was made in (only the home group's if ``epoch`` is not this
        store's last claim of the client); this store forgets the claim."""
        try:
            home = self._home(client_id)
        except api.StoreError as exc:
            return defer.fail(exc)
        claim = self._current(client_id, epoch)
        if claim is not None:
            del self._claims[client_id]
            epochs = claim.epochs  # a claim still on its way is released when it lands (``_first_claimed``)
        else:
            epochs = {home: epoch}
        for key in [k for k in self._outbound_group if k[0] == client_id]:
            del self._outbound_group[key]
        self._will_group.pop(client_id, None)  # each group drops the will of a released claim
        return _gathered([defer.maybeDeferred(self.groups[g].release_session, client_id, e)
                          for g, e in epochs.items()]).addCallback(lambda _: None)

    def _missed(self, client_id: str, epoch: int) -> frozenset[str]:
        """The groups this store's last claim of ``client_id`` (home epoch ``epoch``) could not reach."""
        claim = self._current(client_id, epoch)
        if claim is None:
            return frozenset()
        if claim.lazy:
            return frozenset(claim.skipped)
        return frozenset(g for g in self.table.groups if g not in claim.epochs)

    @staticmethod
    def _claim_missed(failure, group: str, client_id: str):
        failure.trap(api.Unavailable)
        log.warning("session_claim_skipped group=%s client=%s reason=%s", group, client_id, failure.getErrorMessage())
        return None

    def _merge(self, client_id: str, states) -> api.SessionState | None:
        """One session from each group's part of it (None unless the home group has it)."""
        home_name = self._home(client_id)
        by_group = {g: st for g, st in states if st is not None}
        home = by_group.get(home_name)
        if home is None:
            return None
        subs: dict[str, api.SubscriptionState] = {}
        outbound: dict[int, api.OutboundState] = {}
        for group in sorted(by_group):
            st = by_group[group]
            for sub in st.subscriptions:
                have = subs.get(sub.key)
                subs[sub.key] = sub if have is None else dataclasses.replace(
                    have, positions=have.positions + sub.positions)
            for out in st.outbound:
                outbound[out.packet_id] = out
                self._outbound_group[(client_id, out.packet_id)] = out.position.group
        return dataclasses.replace(home, subscriptions=tuple(subs[k] for k in sorted(subs)),
                                   outbound=tuple(outbound[p] for p in sorted(outbound)))

    def get_session(self, client_id: str) -> defer.Deferred:
        """The home group's part first; the other groups' only if it has one (without it they are not a session).

        A session this store claims is read where the claim was made (a fresh id's groups not claimed yet have
        nothing of it).
        """
        try:
            home = self._home(client_id)
            store = self._group(home)
        except api.StoreError as exc:
            return defer.fail(exc)
        claim = self._claims.get(client_id)
        missed = self._missed(client_id, claim.home_epoch) if claim is not None else frozenset()
        others = tuple(g for g in self.table.groups if g != home and g not in missed
                       and (claim is None or g in claim.epochs))

        def home_read(state):
            if state is None:
                return None
            if missed:
                log.warning("session_part_skipped groups=%s client=%s reason=unreachable at its claim",
                            ",".join(sorted(missed)), client_id)
            if not others:
                return self._merge(client_id, [(home, state)])
            return self._each(others, lambda s: s.get_session(client_id)).addCallback(
                lambda rs: self._merge(client_id, [(home, state)] + [(g, st) for g, (_, st) in zip(others, rs)]))

        return defer.maybeDeferred(store.get_session, client_id).addCallback(home_read)

    def list_sessions(self) -> defer.Deferred:
        groups = self.table.groups

        def merged(results):
            parts: dict[str, list] = {}
            for group, (_, states) in zip(groups, results):
                for st in states:
                    parts.setdefault(st.meta.client_id, []).append((group, st))
            out = (self._merge(cid, parts[cid]) for cid in sorted(parts))
            return tuple(st for st in out if st is not None)

        return self._each(groups, lambda s: s.list_sessions()).addCallback(merged)

    def list_wills(self) -> defer.Deferred:
        """Each group's wills (a will is kept in the group of its topic, with that group's claim of its id)."""
        return self._each(self.table.groups, lambda s: s.list_wills()).addCallback(
            lambda rs: tuple(sorted(_concat(rs), key=lambda held: held.client_id)))

    def put_session(self, meta: api.SessionMeta, epoch: int) -> defer.Deferred:
        if not isinstance(meta, api.SessionMeta):
            return defer.fail(api.InvalidArgument(f"expected a SessionMeta, got {type(meta).__name__}"))
        # every group keeps the meta: a group's part of a session is listed and restored with it
        missed = self._missed(meta.client_id, epoch)
        waited = []
        for group in self.table.groups:
            try:
                d = self._in(meta.client_id, group, epoch, lambda store, there: store.put_session(meta, there),
                             missed_unwaited="put_session")
            except api.StoreError as exc:
                return defer.fail(exc)
            if group in missed:  # down at the claim: tried, not waited for (it would fail after a call timeout)
                d.addErrback(self._write_missed, group, meta.client_id, "put_session")
            else:
                waited.append(d)
        return _gathered(waited).addCallback(lambda _: None)

    @staticmethod
    def _write_missed(failure, group: str, client_id: str, name: str) -> None:
        log.warning("session_write_skipped group=%s client=%s operation=%s reason=%s", group, client_id, name,
                    failure.getErrorMessage())

    def delete_session(self, client_id: str, epoch: int) -> defer.Deferred:
        for key in [k for k in self._outbound_group if k[0] == client_id]:
            del self._outbound_group[key]
        return self._write(client_id, self.table.groups, "delete_session", epoch=epoch)

    def put_subscription(self, client_id: str, subscription: api.SubscriptionState, epoch: int) -> defer.Deferred:
        if not isinstance(subscription, api.SubscriptionState):
            return defer.fail(api.InvalidArgument(
                f"expected a SubscriptionState, got {type(subscription).__name__}"))
        try:
            groups = self._spanned(client_id, subscription.topic_filter)
        except ValueError as exc:
            return defer.fail(api.InvalidArgument(str(exc)))
        parts = []
        for group in groups:
            own = tuple(p for p in subscription.positions if p.group == group)
            if subscription.share_group is None and not own:
                return defer.fail(api.InvalidArgument(
                    f"subscription {subscription.key!r} has no position in group {group!r}, which its filter spans"))
            parts.append((group, dataclasses.replace(subscription, positions=own)))
        try:
            ds = [self._in(client_id, group, epoch, lambda store, there, part=part: store.put_subscription(
                client_id, part, there)) for group, part in parts]
        except api.StoreError as exc:
            return defer.fail(exc)
        return _gathered(ds).addCallback(lambda _: None)

    def delete_subscription(self, client_id: str, key: str, epoch: int) -> defer.Deferred:
        return self._write(client_id, self._spanned(client_id, filter_of(key)), "delete_subscription", key,
                           epoch=epoch)

    def put_outbound(self, client_id: str, outbound: api.OutboundState, epoch: int) -> defer.Deferred:
        if not isinstance(outbound, api.OutboundState):
            return defer.fail(api.InvalidArgument(f"expected an OutboundState, got {type(outbound).__name__}"))
        group = outbound.position.group
        self._outbound_group[(client_id, outbound.packet_id)] = group
        return self._write(client_id, (group,), "put_outbound", outbound, epoch=epoch)

    def delete_outbound(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        group = self._outbound_group.pop((client_id, packet_id), None)
        groups = (group,) if group is not None else self.table.groups
        return self._write(client_id, groups, "delete_outbound", packet_id, epoch=epoch)

    def _home_write(self, name: str, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        try:
            home = self._home(client_id)
        except api.StoreError as exc:
            return defer.fail(exc)
        return self._write(client_id, (home,), name, packet_id, epoch=epoch)

    def put_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._home_write("put_released", client_id, packet_id, epoch)

    def delete_released(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._home_write("delete_released", client_id, packet_id, epoch)

    def put_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._home_write("put_inbound_qos2", client_id, packet_id, epoch)

    def delete_inbound_qos2(self, client_id: str, packet_id: int, epoch: int) -> defer.Deferred:
        return self._home_write("delete_inbound_qos2", client_id, packet_id, epoch)

    def claim_epochs(self, client_id: str) -> dict[str, int]:
        """Group -> the epoch of this store's last claim of ``client_id`` there (empty: none held)."""
        claim = self._claims.get(client_id)
        return dict(claim.epochs) if claim is not None else {}

    def will_group(self, client_id: str) -> str | None:
        """The group this store put ``client_id``'s will in (None: none stored through it)."""
        return self._will_group.get(client_id)

    def put_will(self, client_id: str, will: api.WillState, epoch: int) -> defer.Deferred:
        """In the group of the will's topic: the one that publishes it if this holder is lost."""
        if not isinstance(will, api.WillState) or not isinstance(will.message, Message):
            return defer.fail(api.InvalidArgument(f"expected a WillState, got {type(will).__name__}"))
        group = self.table.group_of_topic(will.message.topic)
        old = self._will_group.get(client_id)
        self._will_group[client_id] = group
        d = self._write(client_id, (group,), "put_will", will, epoch=epoch)
        if old is not None and old != group:  # a will on another topic's group replaces it
            self._write(client_id, (old,), "delete_will", epoch=epoch).addErrback(
                self._write_missed, old, client_id, "delete_will")
        return d

    def delete_will(self, client_id: str, epoch: int) -> defer.Deferred:
        group = self._will_group.pop(client_id, None)
        if group is None:
            return defer.succeed(None)  # none stored through this store (a claim drops an older holder's)
        return self._write(client_id, (group,), "delete_will", epoch=epoch)

    def get_share_positions(self, share_group: str, topic_filter: str) -> defer.Deferred:
        return self._each(self.table.groups_of_filter(topic_filter),
                          lambda s: s.get_share_positions(share_group, topic_filter)).addCallback(_concat)

    def put_share_position(self, share_group: str, topic_filter: str,
                           position: api.QueuePosition) -> defer.Deferred:
        if not isinstance(position, api.QueuePosition):
            return defer.fail(api.InvalidArgument(f"expected a QueuePosition, got {type(position).__name__}"))
        try:
            store = self._group(position.group)
        except api.StoreError as exc:
            return defer.fail(exc)
        return store.put_share_position(share_group, topic_filter, position)

    # -- retained -------------------------------------------------------------------------------------------------

    def get_retained(self, topic_filter: str) -> defer.Deferred:
        return self._each(self.table.groups_of_filter(topic_filter),
                          lambda s: s.get_retained(topic_filter)).addCallback(
            lambda rs: tuple(sorted(_concat(rs), key=lambda m: m.topic)))

    def put_retained(self, message: Message) -> defer.Deferred:
        if not isinstance(message, Message):
            return defer.fail(api.InvalidArgument(f"expected a Message, got {type(message).__name__}"))
        return self.groups[self.table.group_of_topic(message.topic)].put_retained(message)

    def delete_retained(self, topic: str) -> defer.Deferred:
        if not isinstance(topic, str):
            return defer.fail(api.InvalidArgument(f"topic must be a string, not {type(topic).__name__}"))
        return self.groups[self.table.group_of_topic(topic)].delete_retained(topic)

    # -- timers --------------------------------------------------------------------------------------------------

    def schedule_timer(self, message: Message, deliver_at_ms: int) -> defer.Deferred:
        """The timer's id is a msg_id: its group's number above the offset."""
        if not isinstance(message, Message):
            return defer.fail(api.InvalidArgument(f"expected a Message, got {type(message).__name__}"))
        group = self.table.group_of_topic(message.topic)
        number = self.ids.numbers[group]
        # The group answers an AppendResult (store.api): its offset becomes the msg_id, the rest stays.
        return self.groups[group].schedule_timer(message, deliver_at_ms).addCallback(
            lambda r: r._replace(offset=pack(number, r.offset)))

    def cancel_timer(self, timer_id: int) -> defer.Deferred:
        """To the group the id names; a plain offset (group number 0) asks each group in turn, group 0 first
        (ids handed out before groups were numbered)."""
        group, offset = self.ids.group_of(timer_id)
        if group is None:
            return defer.fail(api.NotFound(f"no timer {timer_id!r} (no broker group has its number)"))
        if offset != timer_id:
            return self.groups[group].cancel_timer(offset)
        remaining = [group] + [g for g in self.table.groups if g != group]

        def attempt(_=None):
            if not remaining:
                return defer.fail(api.NotFound(f"no timer {timer_id!r}"))
            d = self.groups[remaining.pop(0)].cancel_timer(timer_id)
            d.addErrback(lambda f: f.trap(api.NotFound) and attempt())
            return d

        return attempt()

    # -- native queues ----------------------------------------------------------------------------------------------

    def native_request(self, request: api.NativeObject, max_data_bytes: int | None = None) -> defer.Deferred:
        """To the group a ``msg_id`` in the request names, else to the group of its queue (by name) or topic
        (by first level); a request naming neither (lists, monitors) to every group, their replies merged.
        Offsets in the replies become msg_ids (``cluster.remote.msg_ids``). A group that cannot be reached
        answers ``code: -1`` naming it: nothing is acknowledged that its broker did not store."""
        if not isinstance(request, dict):
            return defer.fail(api.InvalidArgument(f"a native request is a JSON object, not {type(request).__name__}"))
        queue, topic = request.get("queue"), request.get("topic")
        if isinstance(queue, str) and queue in self.virtual_queues and _is_produce(request):
            spread = self._virtual_produce(queue, request, max_data_bytes)
            if spread is not None:
                return spread
        try:
            if isinstance(queue, str):
                groups = (self.table.group_of_queue(queue),)
            elif isinstance(topic, str):
                groups = (self.table.group_of_topic(topic),)
            else:
                groups = self.table.groups
        except Exception:  # noqa: BLE001 - a name routing cannot read: the first group's broker names the problem
            groups = self.table.groups[:1]
        msg_id = request.get("msg_id")
        if isinstance(msg_id, int) and not isinstance(msg_id, bool) and msg_id >= 0:
            group, offset = self.ids.group_of(msg_id)
            if group is None:
                return defer.succeed(native_types.error_reply(f"msg_id {msg_id} names no broker group",
                                                              echo_of(request)))
            if offset != msg_id:
                groups, request = (group,), dict(request, msg_id=offset)
            elif not isinstance(queue, str) and not isinstance(topic, str):
                # a plain offset naming no queue (a timer cancel): its group number is 0's, but an id
                # handed out before groups were numbered may be any group's: ask each, group 0 first
                return self._native_first_ok([group] + [g for g in self.table.groups if g != group],
                                             request, max_data_bytes)
        ds = [self._native_in(g, request, max_data_bytes) for g in groups]
        return ds[0] if len(ds) == 1 else defer.gatherResults(ds).addCallback(merged_native_replies)

    def _native_first_ok(self, groups: list[str], request: dict, max_data_bytes: int | None) -> defer.Deferred:
        """Ask ``groups`` in turn; the first success answers, else the first group's error."""
        def answered(reply, rest, first):
            if reply.get("code", 0) == 0:
                return dict(reply, msg_id=request["msg_id"]) if "msg_id" in reply else reply
            return ask(rest, first or reply) if rest else first or reply

        def ask(rest, first=None):
            return self._native_in(rest[0], request, max_data_bytes).addCallback(answered, rest[1:], first)
        return ask(groups)

    def _virtual_produce(self, queue: str, request: dict, max_data_bytes: int | None) -> defer.Deferred | None:
        """A produce to virtual queue ``queue`` whose real queues are not all in its own group: one produce per
        real queue, each to that queue's group (the engine there stores it once for that queue); one reply, the
        first error, else the first real queue's reply naming the virtual queue (its ``msg_id`` is that queue's:
        a consume of each real queue answers with the id it confirms). None when every real queue lives in the virtual queue's group (its engine stores one record
        for them all)."""
        targets = self.virtual_queues[queue]
        try:
            home = self.table.group_of_queue(queue)
            groups = [self.table.group_of_queue(t) for t in targets]
        except Exception:  # noqa: BLE001 - a name routing cannot read: the broker names the problem
            return None
        if all(g == home for g in groups):
            return None

        def merged(replies: list[dict]) -> dict:
            for reply in replies:
                if reply.get("code", 0) != 0:
                    return dict(reply, queue=queue) if "queue" in reply else reply
            out = dict(replies[0])
            if "queue" in out:
                out["queue"] = queue
            return out

        ds = [self._native_in(g, dict(request, queue=t), max_data_bytes) for g, t in zip(groups, targets)]
        return defer.gatherResults(ds).addCallback(merged)

    def _native_in(self, group: str, request: dict, max_data_bytes: int | None) -> defer.Deferred:
        def failed(failure):
            failure.trap(api.StoreError)
            self.native_unavailable += 1
            log.warning("native_forward_failed group=%s reason=%s", group, failure.getErrorMessage())
            return native_types.error_reply(f"broker group {group} unavailable: {failure.getErrorMessage()}",
                                            echo_of(request))

        queue_request = isinstance(request.get("queue"), str)
        d = self.groups[group].native_request(request, max_data_bytes)
        return d.addCallback(lambda reply: self.ids.reply(group, reply, queue_request)
                             if isinstance(reply, dict) else reply).addErrback(failed)


def _is_produce(request: dict) -> bool:
    action = request.get("action")
    return (action == native_types.PRODUCE and not isinstance(action, bool)) or action == native_types.ACTIONS[native_types.PRODUCE]


def merged_native_replies(replies: list[dict]) -> dict:
    """One reply from each group's: the first error, else the first reply with list fields concatenated and
    counts summed."""
    for reply in replies:
        if reply.get("code", 0) != 0:
            return reply
    out = dict(replies[0])
    for reply in replies[1:]:
        for key, value in reply.items():
            if isinstance(value, list) and isinstance(out.get(key), list):
                out[key] = out[key] + value
            elif isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("code", "seq", "action") \
                    and isinstance(out.get(key), (int, float)):
                out[key] = out[key] + value
    return out
