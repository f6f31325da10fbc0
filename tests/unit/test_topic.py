"""Unit tests of MQTT topic validation, shared-subscription parsing and the reference matcher."""

import re

import pytest
from hypothesis import given, settings, strategies as st

from lightqueue.topic import (
    TopicError,
    filter_matches,
    first_level,
    is_system,
    parse_shared,
    validate_topic_filter,
    validate_topic_name,
)

# The examples of MQTT 3.1.1 section 4.7 (and the same ones in 5.0 section 4.7):
# (filter, topic, matches).
SPEC_EXAMPLES = [
    # 4.7.1.2 multi-level wildcard
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    # 4.7.1.3 single-level wildcard
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+/tennis/#", "sport/tennis/player1", True),
    ("sport/+/player1", "sport/tennis/player1", True),
    # 4.7.2 topics beginning with $ (MQTT-4.7.2-1)
    ("#", "$SYS/broker/clients", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS/+/Clients", "$SYS/monitor/Clients", True),
    # 4.7.3 topic semantics: case-sensitive, spaces and a leading "/" are significant
    ("ACCOUNTS", "Accounts", False),
    ("Accounts payable", "Accounts payable", True),
    ("/finance", "finance", False),
    ("finance", "/finance", False),
]


@pytest.mark.parametrize("topic_filter,topic,expected", SPEC_EXAMPLES)
def test_spec_examples(topic_filter, topic, expected):
    """filter_matches gives the outcome the examples of MQTT section 4.7 give."""
    assert filter_matches(topic_filter, topic) is expected


@pytest.mark.parametrize("topic_filter,topic,expected", SPEC_EXAMPLES)
def test_spec_examples_are_valid(topic_filter, topic, expected):
    """Every filter and topic of the spec's examples passes validation."""
    validate_topic_filter(topic_filter)
    validate_topic_name(topic)


@pytest.mark.parametrize("topic", ["a", "/", "a/b/c", "//", "$SYS/x", "caf\u00e9/\U0001f600", " "])
def test_valid_topic_names_pass(topic):
    """Ordinary, empty-level, $-prefixed and non-ASCII topic names are accepted."""
    validate_topic_name(topic)


@pytest.mark.parametrize(
    "topic,problem",
    [
        ("", "must not be empty"),  # MQTT-4.7.3-1
        ("a/\x00/b", "U+0000"),  # MQTT-4.7.3-2
        ("a/+/b", "wildcard '+'"),  # MQTT-4.7.1-1
        ("a/#", "wildcard '#'"),  # MQTT-4.7.1-1
        ("a+b", "wildcard '+'"),
        ("a/\ud800", "not valid UTF-8"),  # MQTT-1.5.3-1
    ],
)
def test_invalid_topic_names_are_named(topic, problem):
    """Each broken topic-name rule raises TopicError whose message names it."""
    with pytest.raises(TopicError, match=re.escape(problem)) as info:
        validate_topic_name(topic)
    assert "topic name" in str(info.value)


def test_topic_name_length_counts_utf8_bytes():
    """The length limit counts UTF-8 bytes, as MQTT-1.5.3 does, not characters."""
    validate_topic_name("\u00e9" * 5, max_length=10)
    with pytest.raises(TopicError, match="11 bytes long, longer than the limit of 10 bytes"):
        validate_topic_name("\u00e9" * 5 + "a", max_length=10)
    validate_topic_name("a" * 65535)
    with pytest.raises(TopicError, match="longer than the limit of 65535"):
        validate_topic_name("a" * 65536)


def test_level_limit():
    """max_levels, when given, bounds the number of levels of names and filters."""
    validate_topic_name("a/b/c", max_levels=3)
    with pytest.raises(TopicError, match="4 levels, more than the limit of 3"):
        validate_topic_name("a/b/c/", max_levels=3)
    with pytest.raises(TopicError, match="topic filter has 4 levels"):
        validate_topic_filter("+/+/+/#", max_levels=3)


def test_non_string_is_a_type_error():
    """Passing bytes is a programming error (TypeError), not a peer's bad topic."""
    with pytest.raises(TypeError, match="must be str, not bytes"):
        validate_topic_name(b"a/b")
    with pytest.raises(TypeError):
        validate_topic_filter(None)


@pytest.mark.parametrize(
    "topic_filter", ["#", "+", "a/#", "+/+", "/+", "+/", "a/+/b/#", "$SYS/#", "//", "$share/g/a"])
def test_valid_filters_pass(topic_filter):
    """Wildcards alone in their level, '#' last, are accepted (MQTT-4.7.1-2/3)."""
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter,problem",
    [
        ("", "must not be empty"),  # MQTT-4.7.3-1
        ("a/\x00", "U+0000"),  # MQTT-4.7.3-2
        ("sport/tennis#", "'#' must occupy an entire level"),  # MQTT-4.7.1-2
        ("sport/#/ranking", "'#' must be the last level"),  # MQTT-4.7.1-2
        ("#/", "'#' must be the last level"),
        ("sport+", "'+' must occupy an entire level"),  # MQTT-4.7.1-3
        ("a/++/b", "'+' must occupy an entire level"),
        ("a/+#", "'#' must occupy an entire level"),
    ],
)
def test_invalid_filters_are_named(topic_filter, problem):
    """Each broken topic-filter rule raises TopicError whose message names it."""
    with pytest.raises(TopicError, match=re.escape(problem)) as info:
        validate_topic_filter(topic_filter)
    assert "topic filter" in str(info.value)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("a/b", (None, "a/b")),
        ("$share/group/a/+/#", ("group", "a/+/#")),
        ("$share/g/#", ("g", "#")),
        ("$share/g//", ("g", "/")),
        ("$share", (None, "$share")),
        ("$shared/g/a", (None, "$shared/g/a")),
        ("$SHARE/g/a", (None, "$SHARE/g/a")),
    ],
)
def test_parse_shared(text, expected):
    """$share/{group}/{filter} splits into group and filter; anything else is an ordinary filter."""
    assert parse_shared(text) == expected


@pytest.mark.parametrize(
    "text,problem",
    [
        ("$share//a", "empty share name"),  # MQTT-4.8.2-1
        ("$share/", "empty share name"),
        ("$share/g+/a", "'+' must occupy an entire level"),  # caught as a filter, MQTT-4.7.1-3
        ("$share/+/a", "share name must not contain '+'"),  # MQTT-4.8.2-1
        ("$share/#", "share name must not contain '#'"),
        ("$share/g", "no topic filter after the share name"),  # MQTT-4.8.2-2
        ("$share/g/", "no topic filter after the share name"),
        ("$share/g/a#", "'#' must occupy an entire level"),
        ("a/#/b", "'#' must be the last level"),
    ],
)
def test_parse_shared_rejects(text, problem):
    """A malformed shared subscription, or a bad filter, raises TopicError naming the problem."""
    with pytest.raises(TopicError, match=re.escape(problem)):
        parse_shared(text)


def test_parse_shared_applies_limits_to_the_whole_text():
    """max_length and max_levels count the $share prefix too."""
    with pytest.raises(TopicError, match="longer than the limit of 12"):
        parse_shared("$share/g/abcd", max_length=12)
    with pytest.raises(TopicError, match="3 levels"):
        parse_shared("$share/g/a", max_levels=2)


@pytest.mark.parametrize(
    "topic,level", [("dev/1/temp", "dev"), ("dev", "dev"), ("/a", ""), ("$SYS/x", "$SYS"), ("a/", "a")])
def test_first_level(topic, level):
    """first_level returns the text before the first '/'."""
    assert first_level(topic) == level


def test_is_system():
    """Only topics whose first character is '$' are system topics (MQTT-4.7.2)."""
    assert is_system("$SYS/broker") and is_system("$")
    assert not is_system("SYS/$x") and not is_system("/$SYS")


_levels = st.lists(st.sampled_from(["a", "b", "", "$x"]), min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(topic_levels=_levels)
def test_a_topic_matches_itself_and_its_parents(topic_levels):
    """A topic is matched by itself, by each prefix + '/#', and by '+' in place of any level."""
    topic = "/".join(topic_levels)
    assert filter_matches(topic, topic)
    for cut in range(1, len(topic_levels) + 1):
        assert filter_matches("/".join(topic_levels[:cut] + ["#"]), topic)
    for index in range(len(topic_levels)):
        plussed = list(topic_levels)
        plussed[index] = "+"
        expected = not (index == 0 and topic.startswith("$"))  # MQTT-4.7.2-1
        assert filter_matches("/".join(plussed), topic) is expected
