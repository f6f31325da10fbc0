"""Light queues in RocksDB, the topic rules and trie, the queue resolver, and the native queue engine.

The RocksDB parts are re-exported lazily: ``lightqueue.topic`` (the topic rules,
which ``mqtt_proxy``, ``push`` and ``spark`` import) must load without ``rocksdict``.
"""

from lightqueue.names import lmq_name, native_queue_name, topic_queue_name

__all__ = ["LightQueueIndex", "attach", "lmq_name", "native_queue_name", "topic_queue_name"]


def __getattr__(name: str):
    # PEP 562: import queue_index (and so rocksdict) only when its names are asked for.
    if name in ("LightQueueIndex", "attach"):
        from lightqueue import queue_index
        return getattr(queue_index, name)
    raise AttributeError(f"module 'lightqueue' has no attribute {name!r}")
