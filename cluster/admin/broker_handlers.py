"""The admin route a broker serves: its epoch entries (``twistmq-admin brokers epoch BROKER``).

A broker has no clients or sessions of its own to show: its API is the rows of openapi.json whose
``x-roles`` names ``broker``. ``epoch`` is a function the broker role passes in (admin imports no store):
it answers this broker's replication figures as plain data.
"""

from __future__ import annotations

from typing import Callable

from cluster.admin.api import ApiError


class BrokerHandlers:
    """``cluster/brokers/{broker}/epoch`` on the broker named ``broker``."""

    def __init__(self, node_id: str, epoch: Callable[[], dict]) -> None:
        self.node_id = node_id
        self.epoch = epoch

    def get_broker_epoch(self, params, query, body):
        if params["broker"] != self.node_id:
            raise ApiError(404, "not_found", f"this is broker {self.node_id!r}, not {params['broker']!r}: ask "
                           "that broker's own http listener (cluster.json names it)")
        return self.epoch()
