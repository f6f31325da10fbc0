"""File-system helpers shared by the commit log, the timer log and the timer wheel."""

from __future__ import annotations

import os


def fsync_dir(directory: str) -> None:
    """Make a new or renamed file's directory entry durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
