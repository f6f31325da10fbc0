"""Unit tests of the data source's MQTT topic-filter matcher (no Spark)."""

import pytest

from lightqueue.topic import TopicError as TopicFilterError
from lightqueue.topic import TopicMatcher, filter_matches
from lightqueue.topic import validate_topic_filter as validate_filter
from tests.spark.truth import topic_matches


@pytest.mark.parametrize("topic_filter,topic,expected", [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),  # MQTT-4.7.1-2: '#' includes the parent
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "anything/at/all", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),  # an empty level is still a level
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/uptime", False),  # MQTT-4.7.2-1: wildcards do not match '$' topics
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("devices/dev-01/telemetry", "devices/dev-01/telemetry", True),
    ("devices/dev-01/telemetry", "devices/dev-01/Telemetry", False),  # topics are case-sensitive
])
def test_filter_matches_mqtt_examples(topic_filter, topic, expected):
    """The matcher gives the answers of MQTT 3.1.1 section 4.7's examples, as does the ground truth."""
    assert filter_matches(topic_filter, topic) is expected
    assert topic_matches(topic_filter, topic) is expected


@pytest.mark.parametrize("bad", ["", "sport/tennis#", "sport/#/ranking", "sport+", "a/b+/c", "a\x00b"])
def test_invalid_filters_are_rejected(bad):
    """Filters MQTT forbids (misplaced wildcards, empty, NUL) raise TopicFilterError."""
    with pytest.raises(TopicFilterError):
        validate_filter(bad)


def test_matcher_caches_answers_consistently():
    """A reused matcher answers repeated topics the same way."""
    m = TopicMatcher("a/+/c")
    assert [m.matches(t) for t in ("a/b/c", "a/b/c", "a/b/d", "a/b/c")] == [True, True, False, True]
