"""The proxy's group watch on a task.Clock: which sessions it closes when a broker group is out of reach for a
lease, and how it hands their parts over (the groups and the registry are small stand-ins recording calls)."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet import defer, task

from cluster.remote.group_watch import GroupWatch
from cluster.routing import SlotTable
from store import api
from store.session_deadlines import group_holder

LEASE, TICK = 1.0, 0.05
TABLE = SlotTable.build(("g1", "g2"))


def named(prefix: str, group: str, of=TABLE.group_of_client) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if of(f"{prefix}-{i}") == group)


class Peer:
    def __init__(self) -> None:
        self.connected = True

    def up(self) -> None:
        self.connected = True


class Group:
    """A group's store as the watch uses it: its session parts (holder, epoch) and the calls made."""

    def __init__(self) -> None:
        self.peer = Peer()
        self.parts: dict[str, tuple[str, int]] = {}
        self.calls: list[tuple] = []

    def get_session(self, cid):
        part = self.parts.get(cid)
        return defer.succeed(None if part is None else api.SessionState(api.SessionMeta(cid, 60, 5), holder=part[0],
                                                                        epoch=part[1]))

    def claim_session(self, cid, holder, owner=""):
        self.calls.append(("claim", cid, holder))
        return defer.succeed(99)

    def release_session(self, cid, epoch):
        self.calls.append(("release", cid, epoch))
        return defer.succeed(None)


class Registry:
    def __init__(self, sessions) -> None:
        self.sessions = sessions
        self.closed: list[str] = []

    def close_group_sessions(self, has_part):
        dropped = [(s.client_id, 1) for s in self.sessions if has_part(s)]
        self.closed += [cid for cid, _ in dropped]
        return dropped


def session(cid: str, *filters: str):
    return SimpleNamespace(client_id=cid, subs={f: SimpleNamespace(topic_filter=f) for f in filters})


def rig(sessions, wills=None, epochs=None):
    groups = {"g1": Group(), "g2": Group()}
    store = SimpleNamespace(table=TABLE, groups=groups, will_group=(wills or {}).get,
                            claim_epochs=lambda cid: dict((epochs or {}).get(cid, {})))
    clock = task.Clock()
    registry = Registry(sessions)
    watch = GroupWatch(clock, store, registry, "proxy-1", LEASE, TICK)
    watch.start()
    return clock, groups, registry, watch


def advance(clock, seconds: float) -> None:
    for _ in range(int(round(seconds / TICK))):
        clock.advance(TICK)


def test_a_group_out_of_reach_for_a_lease_closes_the_sessions_with_a_part_there():
    """Homed in the group, its will there, or a subscription spanning it: closed after one lease, not before;
    a session with nothing there stays; a group back within the lease closes nothing."""
    level2 = named("t", "g2", TABLE.group_of_topic)
    homed, will, sub = named("home", "g1"), named("will", "g2"), named("sub", "g2")
    other = named("other", "g2")
    sessions = [session(homed), session(will), session(sub, "+/x"), session(other, f"{level2}/#")]
    clock, groups, registry, watch = rig(sessions, wills={will: "g1"})
    groups["g1"].peer.connected = False
    advance(clock, LEASE / 2)
    groups["g1"].peer.up()
    advance(clock, TICK)
    groups["g1"].peer.connected = False
    advance(clock, LEASE - 2 * TICK)
    assert registry.closed == []
    advance(clock, 3 * TICK)
    assert registry.closed == [homed, will, sub]
    advance(clock, 3 * LEASE)
    assert registry.closed == [homed, will, sub] and watch.closed == 3  # once per absence


def test_the_parts_are_handed_over_where_reachable_at_once_and_in_the_lost_group_when_it_is_back():
    """A closed session's part in a reachable group is claimed in that group's name if our claim is still the
    last there; in the lost group the same once it is back; a group with nothing stored has the claim released,
    and one where another holder claimed since is left alone."""
    a, b = named("a", "g1"), named("b", "g1")
    clock, groups, registry, watch = rig([session(a), session(b)], epochs={a: {"g1": 4, "g2": 7}, b: {"g1": 5, "g2": 8}})
    groups["g2"].parts = {a: ("proxy-1", 7), b: ("proxy-2", 9)}
    groups["g1"].parts = {a: ("proxy-1", 4)}
    groups["g1"].peer.connected = False
    advance(clock, LEASE + 2 * TICK)
    assert groups["g2"].calls == [("claim", a, group_holder("g2"))]
    assert groups["g1"].calls == []
    groups["g1"].peer.up()
    advance(clock, TICK)
    assert groups["g1"].calls == [("claim", a, group_holder("g1")), ("release", b, 5)]
