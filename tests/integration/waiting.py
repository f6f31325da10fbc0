"""Bounded waits of the integration tests: poll what a test can observe until it shows, or fail at a deadline.

A fixed sleep guesses how long a node takes; too short it flakes under load,
too long it wastes every run. These helpers wait exactly as long as it takes.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Callable, TypeVar

T = TypeVar("T")

# How long "nothing more arrives" is watched in a negative assertion: on loopback a message the broker
# was about to send shows up within milliseconds, so this is ample yet short.
QUIET_PERIOD = 0.5

# Added to a wait whose length is a node's timer (an expiry, a rate window): the node reads the wall
# clock in whole milliseconds when it checks, the test sleeps on its own clock.
CLOCK_MARGIN_S = 0.05


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.05,
               what: str = "the condition") -> T:
    """``predicate()``'s first truthy value, polled every *interval* seconds; AssertionError naming *what*
    if none came within *timeout* seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def metric_value(http_port: int, name: str, label: str | None = None) -> float:
    """The sum of a node's /metrics samples named *name* (those with *label* in them, if given)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        if sample.partition("{")[0] == name and (label is None or label in sample):
            total += float(value)
    return total


def open_connections(node, kind: str = "mqtt") -> int:
    """How many connections the node holds open on its *kind* listener, from its /metrics."""
    port = node.port(kind)
    return int(metric_value(node.port("http"), "twistmq_listener_connections",
                            f'listener="{kind} 127.0.0.1:{port}"'))
