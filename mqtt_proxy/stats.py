"""Counters of the MQTT front end, read by $SYS topics and /metrics."""

from __future__ import annotations


class BrokerStats:
    """Plain counters; the reactor thread is the only writer."""

    __slots__ = ("messages_received", "messages_sent", "bytes_received", "bytes_sent", "clients_connected",
                 "connections_total", "connections_refused", "protocol_errors", "messages_dropped",
                 "messages_expired", "messages_gap", "messages_denied", "retained_dropped")

    def __init__(self) -> None:
        self.messages_received = 0
        self.messages_sent = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        self.clients_connected = 0
        self.connections_total = 0
        self.connections_refused = 0
        self.protocol_errors = 0
        self.messages_dropped = 0
        self.messages_expired = 0  # stored messages whose expiry passed before they could be delivered
        self.messages_gap = 0  # owed messages a reader found deleted (a disk limit forced them out)
        self.messages_denied = 0  # messages not delivered: the ACL no longer lets the session's identity read them
        self.retained_dropped = 0  # retained messages for a SUBSCRIBE beyond what the client's queue holds

    def sent(self, nbytes: int) -> None:
        """One PUBLISH of ``nbytes`` went out."""
        self.messages_sent += 1
        self.bytes_sent += nbytes

    def received(self, nbytes: int) -> None:
        """One PUBLISH of ``nbytes`` came in."""
        self.messages_received += 1
        self.bytes_received += nbytes
