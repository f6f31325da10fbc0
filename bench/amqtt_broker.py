"""Runs an amqtt broker on 127.0.0.1:PORT in its own process, for the benchmarks.

    python -m bench.amqtt_broker --port 1883

Prints ``amqtt ready`` once listening and stops cleanly on SIGTERM/SIGINT.
``CONFIG_NOTES`` states every setting, for the report.
"""

import argparse
import asyncio
import logging
import signal

CONFIG_NOTES = [
    "listener tcp 127.0.0.1:PORT, max_connections 0 (unlimited)",
    "plugins: AnonymousAuthPlugin only, allow_anonymous false: any client with a username is accepted "
    "(the generator sends username 'bench', no password), because amqtt keeps offline QoS 1 messages "
    "only for non-anonymous sessions",
    "no $SYS plugin, no packet/event logging plugins, logging level WARNING",
    "no persistence plugin (sessions and offline messages in memory, as for Mosquitto)",
    "session_expiry_interval unset (persistent sessions never expire)",
]


def config(port):
    """The amqtt broker configuration used by the benchmarks."""
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}", "max_connections": 0}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": False}},
    }


async def serve(port):
    """Start the broker, announce readiness, run until a stop signal."""
    from amqtt.broker import Broker

    broker = Broker(config(port))
    await broker.start()
    print(f"amqtt ready on 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await broker.shutdown()


def main():
    parser = argparse.ArgumentParser(description="amqtt broker for bench/compare.py")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
