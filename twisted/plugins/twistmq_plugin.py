"""The twistmq twistd plugin: ``twistd -n twistmq node ...`` (see cluster/tap.py)."""

from twisted.application.service import ServiceMaker

twistmq = ServiceMaker("twistmq", "cluster.tap", "twistmq MQTT/IoT messaging engine", "twistmq")
