"""The twistmq twistd plugin: ``twistd -n twistmq node ...`` (see mqtt_proxy/tap.py)."""

from twisted.application.service import ServiceMaker

twistmq = ServiceMaker("twistmq", "mqtt_proxy.tap", "twistmq MQTT/IoT messaging engine", "twistmq")
