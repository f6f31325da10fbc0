"""MQTT topic names and topic filters: validation, shared-subscription parsing, matching.

Pure functions, no I/O. Clause numbers are those of MQTT 3.1.1 (section 4.7),
with the MQTT 5.0 shared-subscription clauses (section 4.8.2) for ``$share``.

- A *topic name* is what a PUBLISH carries: no wildcards.
- A *topic filter* is what a SUBSCRIBE carries: ``+`` matches exactly one level
  (possibly empty), ``#`` matches the parent level and any number of levels below.
- Topics whose first character is ``$`` (``$SYS/...``) are not matched by filters
  whose first level is a wildcard (MQTT-4.7.2-1).

``filter_matches`` is the naive reference of the matching rules; the broker
matches through ``lightqueue.topic_trie.TopicTrie``, which is tested against it,
and readers that test many records against one filter (Spark) use ``TopicMatcher``.
This module imports nothing: ``mqtt_proxy``, ``push`` and ``spark`` import it
without loading the RocksDB side of ``lightqueue``.
"""

from __future__ import annotations

__all__ = [
    "MAX_LENGTH",
    "SHARE_PREFIX",
    "TopicError",
    "TopicMatcher",
    "filter_matches",
    "first_level",
    "is_system",
    "parse_shared",
    "validate_topic_filter",
    "validate_topic_name",
]

MAX_LENGTH = 65535
"""Largest topic name or filter in bytes of UTF-8 (MQTT-1.5.3, MQTT-4.7.3-3)."""

SHARE_PREFIX = "$share/"
"""A filter starting with this names a shared subscription (MQTT 5.0, 4.8.2)."""


class TopicError(ValueError):
    """A topic name or topic filter sent by a peer breaks the MQTT rules.

    The message says which rule, so it can be logged or sent back as a reason
    string. Passing something that is not a ``str`` is a programming error and
    raises ``TypeError`` instead.
    """


def _check_common(kind: str, text: str, max_length: int, max_levels: int | None) -> None:
    """Apply the rules shared by topic names and filters; *kind* names which one."""
    if not isinstance(text, str):
        raise TypeError(f"{kind} must be str, not {type(text).__name__}")
    if not text:
        raise TopicError(f"{kind} must not be empty (MQTT-4.7.3-1)")
    if "\x00" in text:
        raise TopicError(f"{kind} must not contain U+0000 (MQTT-4.7.3-2)")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise TopicError(f"{kind} is not valid UTF-8 (it holds a lone surrogate, MQTT-1.5.3-1)") from None
    if size > max_length:
        raise TopicError(f"{kind} is {size} bytes long, longer than the limit of {max_length} bytes")
    if max_levels is not None:
        levels = text.count("/") + 1
        if levels > max_levels:
            raise TopicError(f"{kind} has {levels} levels, more than the limit of {max_levels}")


def validate_topic_name(topic: str, max_length: int = MAX_LENGTH, max_levels: int | None = None) -> None:
    """Check a PUBLISH topic name; raise ``TopicError`` naming the broken rule.

    A topic name is non-empty (MQTT-4.7.3-1), holds no U+0000 (MQTT-4.7.3-2),
    is at most *max_length* bytes of UTF-8, has at most *max_levels* levels when
    given, and holds no wildcard ``+`` or ``#`` (MQTT-4.7.1-1).
    """
    _check_common("topic name", topic, max_length, max_levels)
    for wildcard in ("+", "#"):
        if wildcard in topic:
            raise TopicError(
                f"topic name must not contain the wildcard {wildcard!r} (MQTT-4.7.1-1): {topic!r}")


def validate_topic_filter(
    topic_filter: str, max_length: int = MAX_LENGTH, max_levels: int | None = None
) -> None:
    """Check a SUBSCRIBE topic filter; raise ``TopicError`` naming the broken rule.

    Besides the rules of ``validate_topic_name`` (minus the wildcard ban): ``#``
    must be alone in its level and that level must be the last (MQTT-4.7.1-2);
    ``+`` must be alone in its level (MQTT-4.7.1-3). ``$share/...`` gets no
    special treatment here: use ``parse_shared`` for filters that may be shared.
    """
    _check_common("topic filter", topic_filter, max_length, max_levels)
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if "#" in level:
            if level != "#":
                raise TopicError(
                    f"'#' must occupy an entire level of the topic filter (MQTT-4.7.1-2): {topic_filter!r}")
            if index != last:
                raise TopicError(
                    f"'#' must be the last level of the topic filter (MQTT-4.7.1-2): {topic_filter!r}")
        if "+" in level and level != "+":
            raise TopicError(
                f"'+' must occupy an entire level of the topic filter (MQTT-4.7.1-3): {topic_filter!r}")


def parse_shared(
    topic_filter: str, max_length: int = MAX_LENGTH, max_levels: int | None = None
) -> tuple[str | None, str]:
    """Split a filter into ``(share_name, filter)``; ``share_name`` is None when not shared.

    ``$share/{group}/{filter}`` is a shared subscription (MQTT 5.0, 4.8.2): the
    group is non-empty and holds no ``/``, ``+`` or ``#`` (MQTT-4.8.2-1), and is
    followed by ``/`` and a valid filter (MQTT-4.8.2-2). Any other text is an
    ordinary filter. Either way the returned filter has been validated
    (*max_length* and *max_levels* apply to the whole text) and ``TopicError``
    is raised otherwise.
    """
    validate_topic_filter(topic_filter, max_length, max_levels)
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    group, slash, real_filter = topic_filter[len(SHARE_PREFIX):].partition("/")
    if not group:
        raise TopicError(f"shared subscription has an empty share name (MQTT-4.8.2-1): {topic_filter!r}")
    for forbidden in ("+", "#"):
        if forbidden in group:
            raise TopicError(
                f"share name must not contain {forbidden!r} (MQTT-4.8.2-1): {topic_filter!r}")
    if not slash or not real_filter:
        raise TopicError(
            f"shared subscription has no topic filter after the share name (MQTT-4.8.2-2): {topic_filter!r}")
    validate_topic_filter(real_filter, max_length, max_levels)
    return group, real_filter


def filter_of(key: str) -> str:
    """The topic filter of a subscription key (``filter`` or ``$share/<group>/<filter>``)."""
    if key.startswith(SHARE_PREFIX):
        return key[len(SHARE_PREFIX):].partition("/")[2]
    return key


def first_level(topic: str) -> str:
    """Return the first level of a topic (the text before the first ``/``, maybe empty).

    Topic consume queues, read by backend consumers, are named after it:
    ``first_level("dev/1/temp") == "dev"``, ``first_level("/a") == ""``.
    """
    return topic.partition("/")[0]


def is_system(topic: str) -> bool:
    """Tell whether a topic starts with ``$`` (``$SYS/...``): wildcard-first filters skip it."""
    return topic.startswith("$")


def filter_matches(topic_filter: str, topic: str) -> bool:
    """Tell whether *topic_filter* matches the topic name *topic* (MQTT 3.1.1, 4.7).

    The reference implementation, level by level, written for clarity rather
    than speed; both arguments are assumed valid:

    - a level ``+`` matches exactly one level, an empty one included
      (``+/+`` matches ``/finance``);
    - ``#`` matches any number of levels, including the parent level itself
      (``sport/#`` matches ``sport``);
    - a filter whose first level is ``+`` or ``#`` does not match a topic
      starting with ``$`` (MQTT-4.7.2-1).
    """
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    if topic.startswith("$") and filter_levels[0] in ("+", "#"):
        return False
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)


class TopicMatcher:
    """One validated topic filter that tests topic names, remembering its answers for topics seen again.

    Raises ``TopicError`` for an invalid filter. Meant for a reader that tests
    many records against one filter (Spark's ``topicFilter``): topics repeat, so
    the answers are cached (up to ``MAX_CACHED`` topics, then computed each time).
    """

    __slots__ = ("filter", "_cache")
    MAX_CACHED = 100_000

    def __init__(self, topic_filter: str) -> None:
        validate_topic_filter(topic_filter)
        self.filter = topic_filter
        self._cache: dict[str, bool] = {}

    def matches(self, topic: str) -> bool:
        """Tell whether the topic name *topic* matches this filter."""
        hit = self._cache.get(topic)
        if hit is None:
            hit = filter_matches(self.filter, topic)
            if len(self._cache) < self.MAX_CACHED:
                self._cache[topic] = hit
        return hit
