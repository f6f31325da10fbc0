"""Notify and pull: queue news merged per tick, and a read cache shared by sessions."""

from push.notifier import Notifier
from push.read_cache import ReadCache
from push.watches import QueueWatches

__all__ = ["Notifier", "QueueWatches", "ReadCache"]
