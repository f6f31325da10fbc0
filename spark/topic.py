"""MQTT topic-filter matching for the data source's ``topicFilter`` option.

The design forbids ``spark`` to import ``lightqueue``, so this is a small,
self-contained matcher following MQTT 3.1.1 section 4.7 (the same rules hold in
5.0): ``+`` matches exactly one level, ``#`` (last level only) matches the
parent level and every level below it, and a filter that starts with a wildcard
does not match topics starting with ``$`` (MQTT-4.7.2-1).
"""

from __future__ import annotations


class TopicFilterError(ValueError):
    """A topic filter that MQTT would reject."""


def validate_filter(topic_filter: str) -> tuple[str, ...]:
    """Split ``topic_filter`` into levels, raising TopicFilterError if it is invalid."""
    if not topic_filter:
        raise TopicFilterError("a topic filter must be at least one character long (MQTT-4.7.3-1)")
    if "\x00" in topic_filter:
        raise TopicFilterError("a topic filter must not contain U+0000 (MQTT-4.7.3-2)")
    levels = tuple(topic_filter.split("/"))
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise TopicFilterError(
                f"'#' must be a whole level and the last one (MQTT-4.7.1-2): {topic_filter!r}")
        if "+" in level and level != "+":
            raise TopicFilterError(f"'+' must occupy a whole level (MQTT-4.7.1-3): {topic_filter!r}")
    return levels


def filter_matches(topic_filter: str, topic: str) -> bool:
    """True if ``topic`` (a concrete topic name) matches ``topic_filter``."""
    return TopicMatcher(topic_filter).matches(topic)


class TopicMatcher:
    """A validated filter that tests topics, caching answers for repeated topics."""

    __slots__ = ("filter", "_levels", "_cache")

    def __init__(self, topic_filter: str):
        self.filter = topic_filter
        self._levels = validate_filter(topic_filter)
        self._cache: dict[str, bool] = {}

    def matches(self, topic: str) -> bool:
        """True if ``topic`` matches this filter."""
        hit = self._cache.get(topic)
        if hit is None:
            hit = self._match(topic)
            if len(self._cache) < 100_000:
                self._cache[topic] = hit
        return hit

    def _match(self, topic: str) -> bool:
        levels = self._levels
        if topic.startswith("$") and levels[0] in ("+", "#"):
            return False
        parts = topic.split("/")
        for i, want in enumerate(levels):
            if want == "#":
                return True  # matches the parent level too: "a/#" matches "a"
            if i >= len(parts):
                return False
            if want != "+" and want != parts[i]:
                return False
        return len(parts) == len(levels)
