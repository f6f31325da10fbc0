"""Light message queues in RocksDB, the topic-filter trie and the resolver that names a message's queues."""

from lightqueue.names import lmq_name, native_queue_name, topic_queue_name
from lightqueue.queue_index import LightQueueIndex, attach

__all__ = ["LightQueueIndex", "attach", "lmq_name", "native_queue_name", "topic_queue_name"]
