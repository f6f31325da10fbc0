"""The one inbound publish decision (mqtt_proxy/publish_rules.py), called as every publisher calls it."""

from __future__ import annotations

import pytest

from mqtt_proxy.auth.acl import ACL
from mqtt_proxy.codec import ReasonCode
from mqtt_proxy.publish_rules import Accept, Origin, PublishRules, Refuse, Route, decide

RULES = PublishRules(max_topic_length=64, max_topic_levels=4, max_payload=100, topic_alias_maximum=8)
ORIGINS = list(Origin)


@pytest.mark.parametrize("origin", ORIGINS)
def test_sys_topics_are_refused_whoever_publishes(origin):
    """A `$` topic is the broker's: a client, a will, the admin API and a native produce are all refused."""
    verdict = decide(RULES, origin, "$SYS/broker/version", 3, False)
    assert type(verdict) is Refuse and verdict.reason == ReasonCode.NOT_AUTHORIZED and not verdict.peer_error


@pytest.mark.parametrize("origin", ORIGINS)
def test_topic_limits_apply_whoever_publishes(origin):
    """max_topic_levels applies to every publisher: a topic of 5 levels against a limit of 4 is a bad topic."""
    verdict = decide(RULES, origin, "a/b/c/d/e", 3, False)
    assert type(verdict) is Refuse and verdict.reason == ReasonCode.TOPIC_NAME_INVALID and verdict.peer_error


def test_retained_with_payload_goes_through_the_quota_route():
    """A retained message with a payload is routed to put_retained (the quota's door); an empty one clears."""
    assert decide(RULES, Origin.WILL, "t", 3, True) == Accept("t", Route.RETAINED)
    assert decide(RULES, Origin.WILL, "t", 0, True) == Accept("t", Route.APPEND)
    assert decide(RULES, Origin.CLIENT, "t", 3, False) == Accept("t", Route.APPEND)


def test_retain_not_available_refuses_retained_publishes():
    """With retain_available off a retained publish is refused (MQTT-3.3.1-14 / RETAIN_NOT_SUPPORTED)."""
    rules = PublishRules(retain_available=False)
    verdict = decide(rules, Origin.WILL, "t", 3, True)
    assert type(verdict) is Refuse and verdict.reason == ReasonCode.RETAIN_NOT_SUPPORTED


def test_delayed_prefix_is_parsed_for_clients_only():
    """`$delayed/5/x` from a client is due 5 s later on `x`; from anyone else it is just a reserved `$` topic."""
    assert decide(RULES, Origin.CLIENT, "$delayed/5/x", 1, False, now_ms=1000) == Accept("x", Route.DELAYED, 6000)
    assert type(decide(RULES, Origin.WILL, "$delayed/5/x", 1, False)) is Refuse
    bad = decide(RULES, Origin.CLIENT, "$delayed/soon/x", 1, False)
    assert type(bad) is Refuse and bad.reason == ReasonCode.TOPIC_NAME_INVALID
    sys = decide(RULES, Origin.CLIENT, "$delayed/5/$SYS/x", 1, False)
    assert type(sys) is Refuse and sys.reason == ReasonCode.NOT_AUTHORIZED


def test_acl_applies_to_clients_and_wills_not_to_the_operator():
    """The ACL's write check applies to a client and its will; the admin API is the operator's."""
    acl = ACL.parse("user alice\ntopic write alice/#\n")
    rules = PublishRules(acl=acl)
    assert decide(rules, Origin.CLIENT, "alice/1", 1, False, username="alice") == Accept("alice/1", Route.APPEND)
    for origin in (Origin.CLIENT, Origin.WILL):
        verdict = decide(rules, origin, "bob/1", 1, False, username="alice")
        assert type(verdict) is Refuse and verdict.reason == ReasonCode.NOT_AUTHORIZED
    assert decide(rules, Origin.ADMIN, "bob/1", 1, False) == Accept("bob/1", Route.APPEND)


def test_topic_alias_binds_and_resolves():
    """A PUBLISH with a topic and an alias binds it; one with the alias alone resolves it; 0 or > max is bad."""
    assert decide(RULES, Origin.CLIENT, "t/1", 1, False, alias=3) == Accept("t/1", Route.APPEND, None, (3, "t/1"))
    assert decide(RULES, Origin.CLIENT, "", 1, False, alias=3, aliases={3: "t/1"}) == Accept("t/1", Route.APPEND)
    unset = decide(RULES, Origin.CLIENT, "", 1, False, alias=4, aliases={3: "t/1"})
    assert type(unset) is Refuse and unset.reason == ReasonCode.PROTOCOL_ERROR and unset.peer_error
    assert decide(RULES, Origin.CLIENT, "t", 1, False, alias=9).reason == ReasonCode.TOPIC_ALIAS_INVALID


def test_payload_limit():
    """A payload over max_payload is too large (a peer error: the connection closes)."""
    verdict = decide(RULES, Origin.CLIENT, "t", 101, False)
    assert type(verdict) is Refuse and verdict.reason == ReasonCode.PACKET_TOO_LARGE and verdict.peer_error
