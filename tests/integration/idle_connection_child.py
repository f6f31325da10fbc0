"""Child process for the idle-connection memory test: a node in this process, COUNT idle MQTT clients.

A fresh interpreter (as a node's), so the transport class has made no object
yet. Builds the ``node`` role with MQTT on a free loopback port, connects COUNT
MQTT 3.1.1 clients from a thread (blocking sockets, 40 connecting at a time,
CONNECT then CONNACK, kept open), then prints one JSON line: how many server transports of the MQTT
clients hold a ``__dict__`` of their own, the others keep their attributes in
the class's shared keys. Usage: python idle_connection_child.py DATA_DIR COUNT
"""

import gc
import json
import socket
import sys
from pathlib import Path

from twisted.internet import reactor, tcp, threads

from cluster.tap import Options, makeService
from mqtt_proxy.codec import MQTT_3_1_1, Connect, encode
from mqtt_proxy.protocol import MQTTServerProtocol


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clients(port: int, count: int, wave: int = 40) -> list:
    """Connect ``count`` clients, ``wave`` at a time (as clients come: many transports before the first write)."""
    socks = []
    while len(socks) < count:
        batch = [socket.create_connection(("127.0.0.1", port), timeout=10)
                 for _ in range(min(wave, count - len(socks)))]
        for s in batch:
            s.sendall(encode(Connect(client_id=f"idle{len(socks)}", keep_alive=300), MQTT_3_1_1))
            socks.append(s)
        for s in batch:
            ack = b""
            while len(ack) < 4:
                chunk = s.recv(4 - len(ack))
                if not chunk:
                    raise RuntimeError("closed before CONNACK")
                ack += chunk
            if ack[3] != 0:
                raise RuntimeError(f"CONNACK refused: {ack!r}")
    return socks


def main() -> None:
    data_dir, count = Path(sys.argv[1]), int(sys.argv[2])
    port = free_port()
    config = data_dir / "twistmq.toml"
    config.write_text("[mqtt]\nallow_anonymous = true\n")
    options = Options()
    options.parseOptions(["node", "--mqtt", f"tcp:{port}:interface=127.0.0.1", "--data-dir", str(data_dir / "data"),
                          "--config", str(config)])
    service = makeService(options, reactor)
    result = {}

    def check(socks):
        transports = [r for r in reactor.getReaders()
                      if isinstance(r, tcp.Server) and isinstance(r.protocol, MQTTServerProtocol)]
        result["transports"] = len(transports)
        result["with_dict"] = sum(any(type(x) is dict for x in gc.get_referents(t)) for t in transports)
        for s in socks:
            s.close()

    def failed(failure):
        result["error"] = failure.getErrorMessage()

    def stop(_):
        return service.stopService().addBoth(lambda _: reactor.stop())

    def run():
        d = threads.deferToThread(clients, port, count)
        d.addCallback(check).addErrback(failed).addBoth(stop)

    service.startService()
    reactor.callWhenRunning(run)
    reactor.run()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
