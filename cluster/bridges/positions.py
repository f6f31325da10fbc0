"""Where each bridge is in its light queue, kept in ``DATA_DIR/bridges/NAME.json``.

A position is written after the batch before it is in MongoDB, by a
temporary file renamed over the old one (``os.replace``): a kill -9 leaves the
old position or the new one, never a torn file. The rename is not fsynced: a
position lost to a power cut is an older one, and reading from an older one
inserts nothing twice (the documents' ``_id``). The file names the queue and
group it is a position in, so a bridge whose filter changed starts afresh.
"""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger("twistmq.cluster.bridges")


class PositionFile:
    """The saved position of one bridge; ``save`` runs on ``executor`` (a file write and a rename)."""

    def __init__(self, directory: str, name: str, queue: str, group: str, executor) -> None:
        self.path = os.path.join(directory, f"{name}.json")
        self.queue = queue
        self.group = group
        self._executor = executor

    def load(self) -> int | None:
        """The saved queue offset; None when there is none for this queue and group (a new bridge)."""
        try:
            with open(self.path, "rb") as f:
                saved = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("bridge_position_unreadable path=%s reason=%s (starting afresh)", self.path, exc)
            return None
        if not isinstance(saved, dict) or saved.get("queue") != self.queue or saved.get("group") != self.group \
                or type(saved.get("offset")) is not int or saved["offset"] < 0:
            log.warning("bridge_position_other path=%s saved=%r queue=%s group=%s (starting afresh)", self.path,
                        saved, self.queue, self.group)
            return None
        return saved["offset"]

    def save(self, offset: int):
        """Fires once ``offset`` is the saved position."""
        return self._executor.submit(self.write, offset)

    def write(self, offset: int) -> None:
        """The blocking part of ``save``."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps({"queue": self.queue, "group": self.group, "offset": offset}).encode())
        os.replace(tmp, self.path)
