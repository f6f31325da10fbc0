"""Notify and pull: queue news merged per tick, and a read cache shared by sessions."""

from push.notifier import Notifier
from push.read_cache import ReadCache

__all__ = ["Notifier", "ReadCache"]
