"""One method per ``operationId`` of ``openapi.json``: what each admin route answers.

Each handler takes ``params`` (path), ``query`` and ``body`` and returns a
JSON-able value or a Deferred of one; a list route returns every item and the
API pages it. Errors are ``ApiError``s. State is read through ``NodeView``;
timers and native queues through the timer service and the native engine's
public ``handle``. The cluster issues add their routes here as methods, beside
their row in the file.
"""

from __future__ import annotations

import base64
import binascii

from twisted.internet import defer

from cluster.admin.api import ApiError, not_found
from mqtt_proxy.codec import ReasonCode
from mqtt_proxy.publish import PublishRefused
from store.api import QuotaExceeded, native_types
from store.timer_service import TimerNotFound


class Handlers:
    """The admin routes of one process (a node: every role's part of the API)."""

    def __init__(self, view, clock, stats, timers=None, native=None, history=None, bridges=None,
                 member=None) -> None:
        self.view = view
        self.member = member  # () -> this process's own cluster/members row (a standalone node)
        self.clock = clock
        self.stats = stats  # () -> the Stats object of openapi.json
        self.timers = timers  # store.timer_service.TimerService
        self.native = native  # lightqueue.native_engine.NativeEngine
        self.history = history  # cluster.admin.metrics.RateHistory: topic rates
        self.bridges = bridges  # () -> the rows of GET bridges (cluster.bridges.service.Bridges.rows); None: none

    def _session(self, client_id: str):
        session = self.view.session(client_id)
        if session is None:
            raise not_found(f"no client {client_id!r}")
        return session

    # -- overview ----------------------------------------------------------------------------------

    def get_stats(self, params, query, body):
        return self.stats()

    def list_members(self, params, query, body):
        """A standalone node (no controllers) is the whole cluster: it lists itself."""
        if self.member is not None:
            return [self.member()]
        return [{"id": self.view.member_id, "role": "node", "group": None, "active": True, "healthy": True,
                 "leader": False}]

    # -- clients and sessions ------------------------------------------------------------------------

    def _clients(self, query) -> list[dict]:
        items = self.view.clients()
        if "connected" in query:
            items = [c for c in items if c["connected"] == query["connected"]]
        if query.get("like"):
            items = [c for c in items if query["like"] in c["client_id"]]
        return items

    def list_clients(self, params, query, body):
        return self._clients(query)

    def get_client(self, params, query, body):
        return self.view.client(self._session(params["client_id"]))

    def kick_client(self, params, query, body):
        session = self._session(params["client_id"])
        return {"client_id": session.client_id, "kicked": self.view.kick(session)}

    def list_sessions(self, params, query, body):
        return self._clients(query)

    def get_session(self, params, query, body):
        return self.view.session_detail(self._session(params["client_id"]))

    def delete_session(self, params, query, body):
        session = self._session(params["client_id"])
        d = self.view.end_session(session)
        return d.addCallback(lambda _: {"client_id": session.client_id, "deleted": True})

    def list_subscriptions(self, params, query, body):
        items = self.view.subscriptions()
        if query.get("client_id") is not None:
            items = [s for s in items if s["client_id"] == query["client_id"]]
        return items

    # -- queues, topics, retained -----------------------------------------------------------------------

    def list_queues(self, params, query, body):
        return self.view.light_queues()

    def list_bridges(self, params, query, body):
        return [] if self.bridges is None else self.bridges()

    def get_queue(self, params, query, body):
        queue = self.view.light_queue(params["name"])
        if queue is None:
            raise not_found(f"no light queue {params['name']!r}")
        return queue

    def delete_queue(self, params, query, body):
        why = self.view.drop_queue(params["name"])
        if why == "not_found":
            raise not_found(f"no light queue {params['name']!r}")
        if why == "busy":
            raise ApiError(409, "conflict", f"light queue {params['name']!r} has subscribers")
        return {"name": params["name"], "deleted": True}

    def list_topics(self, params, query, body):
        rates = self.history.topic_rates if self.history is not None else {}
        return [{"topic": topic, "messages": n, "rate": round(rates.get(topic, 0.0), 2)}
                for topic, n in self.view.topic_offsets().items()]

    def list_retained(self, params, query, body):
        return self.view.retained()

    def delete_retained(self, params, query, body):
        topic = params["topic"]
        if not any(r["topic"] == topic for r in self.view.retained()):
            raise not_found(f"no retained message on {topic!r}")
        d = self.view.delete_retained(topic)
        return d.addCallback(lambda r: _stored(r, {"topic": topic, "deleted": True}))

    def publish(self, params, query, body):
        topic = body.get("topic")
        if not isinstance(topic, str) or not topic:
            raise ApiError(400, "bad_request", "topic must be a non-empty string")
        qos, retain = body.get("qos", 0), body.get("retain", False)
        if qos not in (0, 1, 2) or isinstance(qos, bool):
            raise ApiError(400, "bad_request", "qos must be 0, 1 or 2")
        if not isinstance(retain, bool):
            raise ApiError(400, "bad_request", "retain must be true or false")
        payload = body.get("payload", "")
        if not isinstance(payload, str):
            raise ApiError(400, "bad_request", "payload must be a string")
        if body.get("encoding", "utf-8") == "base64":
            try:
                data = base64.b64decode(payload, validate=True)
            except binascii.Error:
                raise ApiError(400, "bad_request", "payload is not base64") from None
        else:
            data = payload.encode("utf-8")
        d = self.view.publish(topic, data, qos, retain)
        d.addErrback(_refused)
        return d.addCallback(lambda r: _stored(r, {"topic": topic, "offset": r.offset, "status": r.status.name}))

    # -- native queues and timers -----------------------------------------------------------------------

    def list_native_queues(self, params, query, body):
        if self.native is None:
            raise not_found("this process serves no native queues")
        d = self.native.handle(native_types.Request(native_types.QUEUE_LIST, {}))
        monitor = self.native.handle(native_types.Request(native_types.NODE_MONITOR, {}))

        def both(replies):
            listing, node = replies
            return {"queues": listing.get("queues", []), "virtual_queues": listing.get("virtual_queues", {}),
                    "topics": listing.get("topics", []),
                    "pop": {"queue_count": node.get("queue_count", 0), "consumer_count": node.get("consumer_count", 0),
                            "inflight": node.get("inflight", 0)}}

        return defer.gatherResults([d, monitor], consumeErrors=True).addCallback(both)

    def get_timers(self, params, query, body):
        if self.timers is None:
            raise not_found("this process runs no timers")
        s = self.timers.stats()
        enqueued, delivered, cancelled = (int(s["timer_enqueued_total"]), int(s["timer_delivered_total"]),
                                          int(s["timer_cancelled_total"]))
        return {"pending": max(0, enqueued - delivered - cancelled - int(s["timer_lost_total"])),
                "enqueued": enqueued, "delivered": delivered, "cancelled": cancelled,
                "hops": int(s["timer_hops_total"]), "lost": int(s["timer_lost_total"]),
                "backlog": int(s["timer_backlog"])}

    def cancel_timer(self, params, query, body):
        if self.timers is None:
            raise not_found("this process runs no timers")
        try:
            timer_id = int(params["timer_id"])
        except ValueError:
            raise ApiError(400, "bad_request", f"timer id must be an integer, not {params['timer_id'][:64]!r}") \
                from None

        def missing(failure):
            failure.trap(TimerNotFound)
            raise not_found(str(failure.value))

        d = self.timers.cancel(timer_id)
        return d.addCallbacks(lambda done: {"timer_id": timer_id, "cancelled": bool(done)}, missing)


def _refused(failure):
    """The publish decision's refusal, or the retained quota's, as an API error."""
    if failure.check(PublishRefused):
        verdict = failure.value.verdict
        if verdict.reason == ReasonCode.NOT_AUTHORIZED:
            raise ApiError(403, "forbidden", verdict.why)
        raise ApiError(400, "bad_request", verdict.why)
    if failure.check(QuotaExceeded):
        raise ApiError(507, "quota_exceeded", failure.getErrorMessage())
    return failure


def _stored(result, answer: dict) -> dict:
    if result.status.name != "PUT_OK":
        raise ApiError(503, "not_stored", f"the store answered {result.status.name} {result.reason or ''}".strip())
    return answer
