"""Boolean topic checks for the codec and the session layer.

The rules themselves live once, in ``lightqueue.topic``; an invalid *filter*
is not a connection error in v5 (the SUBACK answers 0x8F for that entry), so
callers want a yes/no here rather than an exception.
"""

from __future__ import annotations

from lightqueue.topic import SHARE_PREFIX, TopicError, parse_shared, validate_topic_name

__all__ = ["SHARE_PREFIX", "is_valid_topic_name", "is_valid_topic_filter", "is_shared_filter", "split_shared_filter"]


def is_valid_topic_name(name: str) -> bool:
    """A topic name is non-empty and has no wildcard or U+0000 (MQTT-3.3.2-2, MQTT-4.7.3-1)."""
    try:
        validate_topic_name(name)
    except TopicError:
        return False
    return True


def is_valid_topic_filter(topic_filter: str) -> bool:
    """Wildcards fill whole levels, '#' comes last, and ``$share/{name}/{filter}`` is well formed."""
    try:
        parse_shared(topic_filter)
    except TopicError:
        return False
    return True


def is_shared_filter(topic_filter: str) -> bool:
    """True for a shared subscription filter (``$share/...``)."""
    return topic_filter.startswith(SHARE_PREFIX)


def split_shared_filter(topic_filter: str) -> tuple[str | None, str]:
    """(share name, filter) of ``$share/name/filter``; (None, filter) for a plain filter."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None, topic_filter
    share_name, _, rest = topic_filter[len(SHARE_PREFIX):].partition("/")
    return share_name, rest
