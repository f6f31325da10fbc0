"""What the admin API reads of a running node, in one place: clients, sessions, subscriptions, queues.

The MQTT front end is being reshaped, so this module touches only its most
stable surface: ``front.sessions`` (client id -> Session), ``front.connections``,
``front.stats``, ``front.server_disconnect`` (a kick) and
``front.registry.end_session``; of a Session: ``client_id``, ``conn``, ``level``,
``expiry``, ``subs`` (key -> Subscription: ``topic_filter``, ``queue``, ``qos``,
``share``, ``positions``) and ``outbound``; the retained index; of the store its
``queue_index`` (``queue_names``, ``min_offset``, ``max_offset``) and ``put``.
Everything here is synchronous and reads the reactor thread's state.
"""

from __future__ import annotations

from mqtt_proxy.codec import ReasonCode

LMQ_PREFIX, TOPIC_PREFIX, QUEUE_PREFIX = "%LMQ%", "%TOPIC%", "%QUEUE%"


class NodeView:
    """Reads (and the few changes: kick, end a session, drop a queue, publish) of one node's state."""

    LAG_TTL = 5.0
    """Seconds a computed lag total is reused: it walks every subscription, and /metrics, $SYS and each open
    dashboard ask for it."""

    def __init__(self, front, store, member_id: str, retained=None) -> None:
        self.front = front
        self.store = store
        self.retained_index = retained  # the node's RetainedIndex (the front end reaches it only through the store)
        self.member_id = member_id
        self._lag: tuple[float, tuple[int, int]] | None = None  # (computed at, (sum, max))

    # -- queues --------------------------------------------------------------------------------

    def _index(self):
        return getattr(self.store, "queue_index", None)

    def queue_span(self, queue: str) -> tuple[int, int]:
        """(min offset, max offset) of a queue: what it still holds is ``max - min`` entries."""
        index = self._index()
        if index is None:
            return 0, 0
        return index.min_offset(queue), index.max_offset(queue)

    def queue_names(self) -> list[str]:
        index = self._index()
        return index.queue_names() if index is not None else []

    def readers(self) -> dict[str, list[tuple[str, int]]]:
        """Queue -> [(client id, next offset)] of every session subscription reading it."""
        out: dict[str, list[tuple[str, int]]] = {}
        for cid, session in list(self.front.sessions.items()):
            for sub in list(session.subs.values()):
                out.setdefault(sub.queue, []).append((cid, next_offset(sub)))
        return out

    def light_queues(self) -> list[dict]:
        """Every light queue (one per topic filter in use) with its depth, subscribers and lag."""
        readers = self.readers()
        out = []
        for name in self.queue_names():
            if not name.startswith(LMQ_PREFIX):
                continue
            lo, hi = self.queue_span(name)
            subs = readers.get(name, [])
            lag = max((hi - max(off, lo) for _cid, off in subs), default=0)
            out.append({"name": name, "topic_filter": name[len(LMQ_PREFIX):], "depth": hi - lo,
                        "min_offset": lo, "max_offset": hi, "subscribers": len(subs), "lag": max(0, lag)})
        return out

    def light_queue(self, name: str) -> dict | None:
        for q in self.light_queues():
            if q["name"] == name:
                q["readers"] = [{"client_id": cid, "next_offset": off}
                                for cid, off in sorted(self.readers().get(name, []))]
                return q
        return None

    def lag_total(self) -> tuple[int, int]:
        """(sum, max) over session subscriptions of the entries each has yet to read (at most LAG_TTL old)."""
        now = self.front.clock.seconds()
        if self._lag is not None and now - self._lag[0] < self.LAG_TTL:
            return self._lag[1]
        self._lag = (now, self._lag_now())
        return self._lag[1]

    def _lag_now(self) -> tuple[int, int]:
        total = worst = 0
        for name, subs in self.readers().items():
            lo, hi = self.queue_span(name)
            for _cid, off in subs:
                lag = max(0, hi - max(off, lo))
                total += lag
                worst = max(worst, lag)
        return total, worst

    def drop_queue(self, name: str) -> str | None:
        """Delete an idle light queue; None if done, else why not (``"not_found"`` or ``"busy"``)."""
        index = self._index()
        if index is None or not name.startswith(LMQ_PREFIX) or name not in set(index.queue_names()):
            return "not_found"
        if self.readers().get(name):
            return "busy"
        return None if index.drop_idle(name) else "busy"

    def topic_offsets(self) -> dict[str, int]:
        """Topic consume queue (first topic level) -> messages stored in it so far."""
        index = self._index()
        if index is None:
            return {}
        return {n[len(TOPIC_PREFIX):]: index.max_offset(n) for n in index.queue_names()
                if n.startswith(TOPIC_PREFIX)}

    # -- clients and sessions --------------------------------------------------------------------

    def session(self, client_id: str):
        return self.front.sessions.get(client_id)

    def client(self, session) -> dict:
        conn = session.conn
        out = {"client_id": session.client_id, "connected": conn is not None, "proxy": self.member_id,
               "protocol_level": session.level, "subscriptions": len(session.subs),
               "inflight": len(session.outbound), "username": None, "peer": None}
        if conn is not None:
            out["username"] = getattr(conn, "username", None)
            out["peer"] = getattr(conn, "peer_host", None)
        return out

    def clients(self) -> list[dict]:
        return [self.client(s) for s in list(self.front.sessions.values())]

    def client_ids(self) -> list[str]:
        return list(self.front.sessions)

    def is_connected(self, client_id: str) -> bool:
        session = self.front.sessions.get(client_id)
        return session is not None and session.conn is not None

    def session_detail(self, session) -> dict:
        out = self.client(session)
        subs, queued = [], 0
        for key, sub in sorted(session.subs.items()):
            lo, hi = self.queue_span(sub.queue)
            offset = next_offset(sub)
            waiting = max(0, hi - max(offset, lo))
            queued += waiting
            inflight = sum(1 for o in list(session.outbound.values()) if getattr(o, "sub_key", None) == key)
            subs.append({"topic_filter": key, "qos": sub.options.qos, "queue": sub.queue, "next_offset": offset,
                         "queued": waiting, "inflight": inflight,
                         "share": getattr(sub.share, "group", None)})
        out.update(expiry=session.expiry, persistent=bool(session.persistent), queued=queued,
                   subscriptions=subs)
        return out

    def subscriptions(self) -> list[dict]:
        out = []
        for cid, session in list(self.front.sessions.items()):
            for key, sub in list(session.subs.items()):
                out.append({"id": f"{cid}\x00{key}", "client_id": cid, "topic_filter": key, "qos": sub.options.qos,
                            "queue": sub.queue, "share": getattr(sub.share, "group", None)})
        return out

    def kick(self, session) -> bool:
        """Disconnect a connected client (v5: DISCONNECT 0x98 administrative action); False if it was offline."""
        conn = session.conn
        if conn is None:
            return False
        self.front.server_disconnect(conn, ReasonCode.ADMINISTRATIVE_ACTION)
        return True

    def end_session(self, session):
        """Kick the client if connected, then forget its session (subscriptions, offsets, stored state)."""
        self.kick(session)
        return self.front.registry.end_session(session)

    def retained_count(self) -> int:
        return int(self.retained_index.count) if self.retained_index is not None else 0

    def connected(self) -> int:
        return sum(1 for s in list(self.front.sessions.values()) if s.conn is not None)

    # -- retained and publish --------------------------------------------------------------------

    def retained(self) -> list[dict]:
        index = self.retained_index
        if index is None:
            return []
        found = index.lookup("#") + index.lookup("$SYS/#")
        return [{"topic": t, "offset": off, "size": size} for t, off, size in found]

    def publish(self, topic: str, payload: bytes, qos: int, retain: bool):
        """Publish as the operator through the front end's publish decision and store interface; fires with the
        store's AppendResult, or fails with ``PublishRefused`` or ``QuotaExceeded``."""
        return self.front.publisher.publish_as_operator(topic, payload, qos, retain)

    def delete_retained(self, topic: str):
        """Clear a topic's retained message through the store interface; fires with the AppendResult."""
        return self.front.publisher.store.delete_retained(topic)


def next_offset(sub) -> int:
    """Where a subscription reads next in this node's copy of its light queue (the lowest of its positions;
    a shared subscription's is its share group's)."""
    positions = list(sub.positions.values())
    if not positions and sub.share is not None:
        positions = [c.next for c in getattr(sub.share, "cursors", {}).values()]
    return min((p.offset for p in positions), default=0)
