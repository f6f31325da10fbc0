"""Whether an inbound publish is allowed, and how it is stored: one pure decision for every publisher.

A client's PUBLISH, a will the broker publishes for its client, an admin
publish and a native produce to a topic all ask ``decide`` and act on its
answer; none decides on its own. It checks, in order: the topic alias (clients
only), the topic name and its limits, the payload size, whether retained
messages are available, ``$delayed/{seconds}/{topic}`` (clients only), the
reservation of ``$`` topics (``$SYS/...`` belongs to the broker: nobody outside
it may publish fake values there), and the ACL (write access of the identity
that publishes; the admin API is the operator's and is not subject to it). The
answer is ``Accept`` with the topic the message is stored on and its route, or
``Refuse`` with an MQTT reason code and a line for the log.

The route says where the retained quota is decided: a retained message with a
payload goes through ``Retained.put_retained`` (and a delayed one through
``Timers.schedule_timer``), whose store refuses it with ``QuotaExceeded`` when
``max_retained_messages`` / ``max_retained_bytes`` would be broken, so every
door meets the same quota in the same place. The function does no I/O and
reads no clock: ``now_ms`` comes in. The client hot path
(``Publisher.handle_publishes``) keeps a per-topic verdict on top of it for
the publishes where every check here passes by construction.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping

from lightqueue.topic import TopicError, validate_topic_name
from mqtt_proxy.codec import ReasonCode

DELAYED_PREFIX = "$delayed/"
MAX_DELAY_S = 40 * 24 * 3600


class Origin(enum.Enum):
    """Who publishes."""

    CLIENT = "client"
    """A PUBLISH from a connected MQTT client."""
    WILL = "will"
    """A will message, published by the broker for the client that set it."""
    ADMIN = "admin"
    """The admin API (``POST /api/v1/publish``): the operator, not subject to the ACL."""
    NATIVE = "native"
    """A native produce to a topic."""


class Route(enum.Enum):
    """How an accepted message is stored."""

    APPEND = "append"
    """An ordinary append (a client's goes into this tick's batch); a retained message with an empty payload
    clears its topic this way."""
    RETAINED = "retained"
    """``put_retained``: the retained quota decides."""
    DELAYED = "delayed"
    """``schedule_timer`` (``$delayed/``): stored when its time comes; a retained one meets the quota now."""


@dataclass(frozen=True, slots=True)
class Accept:
    """The publish is allowed."""

    topic: str
    """The topic it is stored on (the alias resolved, ``$delayed/{s}/`` taken off)."""
    route: Route
    deliver_at_ms: int | None = None
    """When a delayed message is due (``Route.DELAYED`` only)."""
    bind_alias: tuple[int, str] | None = None
    """A topic alias the client set with this PUBLISH: the connection records it."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """The publish is not allowed."""

    reason: int
    """The MQTT reason code (a PUBACK/PUBREC's, or a DISCONNECT's when ``peer_error``)."""
    why: str
    """For the log and for the answer of a native or admin request."""
    peer_error: bool = False
    """True when the publisher broke the protocol (a bad topic or alias, a payload too large): a client's
    connection closes with ``reason``. False for a refusal: the PUBLISH is answered with ``reason``."""


@dataclass(frozen=True, slots=True)
class PublishRules:
    """What ``decide`` checks against: the ACL and the limits in force."""

    acl: object | None = None
    """An ``mqtt_proxy.auth.acl.ACL`` (``allowed(username, client_id, topic, "write")``), or None: no ACL."""
    max_topic_length: int = 65535
    max_topic_levels: int | None = None
    max_payload: int = 0
    """Bytes; 0: not checked here (the native codec has its own ``max_data_bytes``)."""
    retain_available: bool = True
    topic_alias_maximum: int = 0

    @classmethod
    def of(cls, acl, config, limits) -> "PublishRules":
        """The rules of a front end: its ACL, ``[mqtt]`` config and ``[limits]``."""
        return cls(acl, limits.max_topic_length, limits.max_topic_levels, limits.max_payload,
                   config.retain_available, config.topic_alias_maximum)


def decide(rules: PublishRules, origin: Origin, topic: str, payload_size: int, retain: bool, *,
           username: str | None = None, client_id: str = "", now_ms: int = 0, alias: int | None = None,
           aliases: Mapping[int, str] | None = None, topic_checked: bool = False) -> Accept | Refuse:
    """Decide one inbound publish; see the module docstring for the order of the checks.

    ``alias``/``aliases``: a v5 client's Topic Alias and the aliases its
    connection has set. ``topic_checked``: the caller already validated this
    exact topic string against the same limits (the client path's cache).
    """
    bind = None
    if alias is not None:
        if alias == 0 or alias > rules.topic_alias_maximum:
            return Refuse(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} is out of range", True)
        if topic:
            bind = (alias, topic)
        else:
            topic = aliases.get(alias) if aliases is not None else None
            if topic is None:
                return Refuse(ReasonCode.PROTOCOL_ERROR, f"topic alias {alias} is not set", True)
            topic_checked = False
    if not topic_checked:
        problem = _topic_problem(rules, topic)
        if problem:
            return Refuse(ReasonCode.TOPIC_NAME_INVALID, problem, True)
    if rules.max_payload and payload_size > rules.max_payload:
        return Refuse(ReasonCode.PACKET_TOO_LARGE,
                      f"payload of {payload_size} bytes exceeds max_payload {rules.max_payload}", True)
    if retain and not rules.retain_available:
        return Refuse(ReasonCode.RETAIN_NOT_SUPPORTED, "retained messages are not available", True)
    deliver_at = None
    if origin is Origin.CLIENT and topic.startswith(DELAYED_PREFIX):
        # The reservation, the ACL and the limits apply to the topic it will really be published on.
        seconds, _, real_topic = topic[len(DELAYED_PREFIX):].partition("/")
        try:
            delay = int(seconds)
        except ValueError:
            delay = -1
        if not 0 <= delay <= MAX_DELAY_S or not real_topic or _topic_problem(rules, real_topic):
            return Refuse(ReasonCode.TOPIC_NAME_INVALID, f"{topic!r} is not $delayed/{{seconds}}/{{topic}}", True)
        topic, deliver_at = real_topic, now_ms + delay * 1000
    if topic.startswith("$"):
        return Refuse(ReasonCode.NOT_AUTHORIZED, f"{topic!r} is reserved for the broker ($ topics)")
    acl = rules.acl
    if (origin is not Origin.ADMIN and acl is not None and acl.configured
            and not acl.allowed(username, client_id, topic, "write")):
        return Refuse(ReasonCode.NOT_AUTHORIZED, f"the ACL does not let {username or client_id!r} write {topic!r}")
    if deliver_at is not None:
        return Accept(topic, Route.DELAYED, deliver_at, bind)
    return Accept(topic, Route.RETAINED if retain and payload_size else Route.APPEND, None, bind)


def _topic_problem(rules: PublishRules, topic: str) -> str | None:
    try:
        validate_topic_name(topic, rules.max_topic_length, rules.max_topic_levels)
    except TopicError as exc:
        return str(exc)
    except UnicodeEncodeError:
        return "the topic is not valid UTF-8"
    return None
