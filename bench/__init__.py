"""Benchmarks: a raw-socket MQTT load generator and the twistmq/Mosquitto/amqtt comparison.

Run ``./dev bench`` (or ``python -m bench.compare --help``); see ``bench/compare.py``.
Nothing here is imported by the broker, and nothing here runs as a test.
"""
