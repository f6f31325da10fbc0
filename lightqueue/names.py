"""Queue names: one namespace for light queues, topic consume queues and native queues.

A prefix keeps the three kinds apart (a topic filter can never be mistaken for
a native queue name). NUL separates queue names inside a record, so no name
may contain it.
"""

from __future__ import annotations

from lightqueue.topic import first_level

LMQ_PREFIX = "%LMQ%"  # one per MQTT topic filter in use (RocketMQ's light message queue)
TOPIC_PREFIX = "%TOPIC%"  # one per first topic level, for backend consumers
QUEUE_PREFIX = "%QUEUE%"  # native protocol queues
MAX_NAME_BYTES = 4096


class QueueNameError(ValueError):
    """A queue name that cannot be stored."""


def _checked(name: str) -> str:
    if "\x00" in name:
        raise QueueNameError("queue name contains NUL")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise QueueNameError("queue name is not valid UTF-8") from None
    if size > MAX_NAME_BYTES:
        raise QueueNameError(f"queue name longer than {MAX_NAME_BYTES} bytes")
    return name


def lmq_name(topic_filter: str) -> str:
    """The light queue that indexes messages matching ``topic_filter``."""
    return _checked(LMQ_PREFIX + topic_filter)


def topic_queue_name(topic: str) -> str:
    """The topic consume queue of an MQTT topic (keyed by its first level)."""
    return _checked(TOPIC_PREFIX + first_level(topic))


def native_queue_name(queue: str) -> str:
    """The queue behind a native-protocol queue name."""
    if not queue:
        raise QueueNameError("queue name is empty")
    return _checked(QUEUE_PREFIX + queue)
