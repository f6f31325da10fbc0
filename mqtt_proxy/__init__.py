"""MQTT and native-protocol front end: codecs, sessions, servers."""
