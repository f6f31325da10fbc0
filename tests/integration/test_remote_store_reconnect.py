"""RemoteStore across a broker's SIGKILL and restart: calls fail fast while it is down, the connection comes
back by itself (ClientService back-off), watches are registered again, nothing acknowledged is lost."""

from __future__ import annotations

import os
import time

import pytest

from cluster.rpc.protocol import NotConnected
from store.record import Message, RecordKind
from tests.contract.conftest import BrokerHarness
from tests.integration.node import NodeProcess

pytestmark = pytest.mark.slow


def publish(topic: str, body: bytes) -> Message:
    return Message(topic, body, RecordKind.MQTT_PUBLISH, 1)


def test_remote_store_survives_a_broker_restart(tmp_path):
    """Kill -9 the broker: calls fail at once with NotConnected; restarted on its port, the same RemoteStore
    reconnects, its watch hears news again, and the message acknowledged before the kill is still there."""
    h = BrokerHarness(str(tmp_path))
    try:
        queue = h.wait(h.store.add_filter("rc/#"))
        (start,) = h.wait(h.store.end_positions(queue))
        heard: list[str] = []
        h.wait(h.store.watch_queue(queue, heard.append))
        assert h.wait(h.store.append(publish("rc/1", b"before"))).ok
        port = h.broker.port("rpc")
        h.broker.kill()
        deadline = time.monotonic() + 10
        while h.peer.connected and time.monotonic() < deadline:
            h.reactor.iterate(0.01)
        began = time.monotonic()
        assert isinstance(h.error(h.store.append(publish("rc/2", b"lost?"))), NotConnected)
        assert time.monotonic() - began < 0.5  # failed fast, not after the call timeout
        h.broker = NodeProcess(h.broker.data_dir, listeners=(), role="broker",
                               extra_args=["--config", os.path.join(str(tmp_path), "broker.toml"),
                                           "--node-id", "contract-broker",
                                           "--rpc", f"tcp:{port}:interface=127.0.0.1"]).start()
        h.wait(h.peer.when_connected())
        h.run_for(0.3)
        assert heard[-1:] == [queue]  # re-registered, and told to look (news may have been missed)
        before = len(heard)
        assert h.wait(h.store.append(publish("rc/3", b"after"))).ok
        h.run_for(0.3)
        assert len(heard) == before + 1
        result = h.wait(h.store.read_queue(start, 10))
        assert [m.record.body for m in result.messages] == [b"before", b"after"]
    finally:
        h.close()
