"""twistmq's version, read from the installed package metadata (pyproject.toml is its one source)."""

from __future__ import annotations

import sys
from importlib import metadata


def twistmq_version() -> str:
    """The installed twistmq version, or ``unknown`` when running from a checkout that was never installed."""
    try:
        return metadata.version("twistmq")
    except metadata.PackageNotFoundError:
        return "unknown"


def print_version() -> None:
    """``--version``: print twistmq's version and exit 0."""
    print(f"twistmq {twistmq_version()}", file=sys.__stdout__, flush=True)
    raise SystemExit(0)
