"""Listener descriptions: one-line errors with an example, loopback detection, paths, and the exposure rule."""

from __future__ import annotations

import os

import pytest

from cluster.runtime.listeners import (
    check_exposure,
    is_loopback,
    parse_listener,
    unparse,
)
from mqtt_proxy.tls import parse_description
from store.config import ConfigError


def error_of(key, description, source=None, base_dir=None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_listener(key, description, source, base_dir)
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("key,value,expected", [
    ("mqtt", "1883", "--mqtt 1883: a bare port is not a listener"),
    ("mqtt", "localhost:1883", "--mqtt localhost:1883: unknown listener type 'localhost'"),
    ("native", "foo", "--native foo: not a listener description"),
    ("http", "tcp:notaport", "--http tcp:notaport: the port must be a number from 0 to 65535, not 'notaport'"),
    ("mqtt", "tcp:70000", "the port must be a number from 0 to 65535, not '70000'"),
    ("mqtt", "tcp:1883:interfce=127.0.0.1", "unknown tcp: argument 'interfce'"),
    ("mqtt", "tcp:1883:backlog=lots", "backlog must be a number"),
    ("mqtt_tls", "tcp:8883", "a TLS listener must be an ssl: endpoint"),
    ("mqtt_tls", "ssl:8883", "ssl: needs privateKey=FILE"),
    ("native_udp", "127.0.0.1:notaport", "--native-udp 127.0.0.1:notaport: the port must be a number"),
])
def test_bad_flag_value_is_one_line_naming_flag_value_and_example(key, value, expected):
    """Each malformed listener flag gives one line with the flag, the value, the problem and a correct example."""
    text = error_of(key, value)
    assert expected in text
    assert "; for example --" in text


def test_example_keeps_the_port_the_user_meant():
    """The Mosquitto habit ``--mqtt 1883`` is answered with the same port written correctly."""
    assert error_of("mqtt", "1883").endswith("for example --mqtt tcp:1883:interface=127.0.0.1")
    assert error_of("mqtt", "localhost:1884").endswith("for example --mqtt tcp:1884:interface=127.0.0.1")


def test_config_file_value_is_named_by_key_and_file():
    """A bad listener in the config file names the key and the file, and the example is TOML."""
    text = error_of("mqtt", "1883", source="/etc/twistmq/site.toml")
    assert text.startswith('node.mqtt = "1883" in /etc/twistmq/site.toml: ')
    assert text.endswith('for example mqtt = ["tcp:1883:interface=127.0.0.1"]')


@pytest.mark.parametrize("interface,loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True),
    ("", False), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("example.com", False),
])
def test_loopback_interfaces(interface, loopback):
    """Only loopback addresses (and localhost) count as this host; an empty interface is every interface."""
    assert is_loopback(interface) is loopback


def test_parsed_listener_fields():
    """A good description yields kind, port and interface; no interface means every interface."""
    listener = parse_listener("mqtt", "tcp:1883:interface=127.0.0.1")
    assert (listener.kind, listener.port, listener.interface, listener.local) == ("tcp", 1883, "127.0.0.1", True)
    assert parse_listener("mqtt", "tcp:1883").local is False
    assert parse_listener("mqtt", "tcp6:1883").local is False
    assert parse_listener("mqtt", r"tcp6:1883:interface=\:\:1").local is True
    assert parse_listener("mqtt", "unix:/tmp/mqtt.sock").local is True
    assert parse_listener("native_udp", "9876").interface == ""
    assert parse_listener("native_udp", "127.0.0.1:9876").local is True


def test_ssl_files_resolve_against_the_config_directory(tmp_path):
    """Relative privateKey/certKey in a config-file ssl: listener start at the config file's directory."""
    (tmp_path / "my key.pem").write_text("k")
    (tmp_path / "cert.pem").write_text("c")
    listener = parse_listener("mqtt_tls", "ssl:8883:interface=127.0.0.1:privateKey=my key.pem:certKey=cert.pem",
                              source=str(tmp_path / "site.toml"), base_dir=str(tmp_path))
    _, args, kwargs = parse_description(listener.description)
    assert args == ["8883"]
    assert kwargs["privateKey"] == str(tmp_path / "my key.pem")
    assert kwargs["certKey"] == str(tmp_path / "cert.pem")
    assert kwargs["interface"] == "127.0.0.1"


def test_missing_ssl_file_names_argument_and_resolved_path(tmp_path):
    """A missing certificate file is named with the path it was looked for at."""
    text = error_of("mqtt_tls", "ssl:8883:privateKey=nokey.pem", source=str(tmp_path / "c.toml"),
                    base_dir=str(tmp_path))
    assert f"privateKey: file {tmp_path / 'nokey.pem'} does not exist" in text


def test_unparse_escapes_what_twisted_would_split():
    """Values with ':', '=' or '\\' survive a round trip through Twisted's description syntax."""
    kwargs = {"port": "8883", "privateKey": "/p/a:b=c\\d", "interface": "::1"}
    kind, args, parsed = parse_description(unparse("ssl", kwargs, "port"))
    assert (kind, args) == ("ssl", ["8883"])
    assert parsed == {"privateKey": "/p/a:b=c\\d", "interface": "::1"}


def listeners(*pairs, source=None):
    return [parse_listener(key, value, source) for key, value in pairs]


def refusal(found, allow=None, allowed=True, ca="") -> str:
    with pytest.raises(ConfigError) as info:
        check_exposure(found, allow, allowed, ca)
    return str(info.value)


def test_loopback_listeners_need_nothing():
    """The default shape (everything on 127.0.0.1) starts with anonymous clients allowed."""
    check_exposure(listeners(("mqtt", "tcp:1883:interface=127.0.0.1"), ("native", "tcp:9876:interface=127.0.0.1"),
                             ("http", "tcp:8080:interface=127.0.0.1"), ("native_udp", "127.0.0.1:9876")),
                   None, True, "")


def test_open_mqtt_listener_without_auth_is_refused_with_the_ways_out():
    """An MQTT listener on every interface, anonymous allowed by default: refused, naming the listener and fixes."""
    text = refusal(listeners(("mqtt", "tcp:1883")))
    assert text.startswith("--mqtt tcp:1883 would accept anonymous clients from other hosts")
    assert "password_file" in text and "allow_anonymous = true" in text
    assert text.endswith("--mqtt tcp:1883:interface=127.0.0.1")
    assert "node.mqtt_ws" in refusal(listeners(("mqtt_ws", "tcp:8083:interface=10.0.0.1"), source="/c.toml"))


def test_open_mqtt_listener_with_auth_or_explicit_allow_starts():
    """A password file (anonymous then refused), explicit allow_anonymous, or client certs open the way."""
    open_mqtt = listeners(("mqtt", "tcp:1883"), ("mqtt_ws", "tcp:8083"))
    check_exposure(open_mqtt, None, False, "")     # password file set: anonymous refused
    check_exposure(open_mqtt, False, False, "")    # explicitly no anonymous clients
    check_exposure(open_mqtt, True, True, "")      # the operator accepts anonymous clients
    tls = [parse_listener("mqtt_tls", "ssl:8883:privateKey=" + os.devnull)]
    check_exposure(tls, None, True, "/ca.pem")     # client certificates required
    assert "--mqtt-tls" in refusal(tls, None, True, "")


def test_open_native_listener_needs_token_or_explicit_allow_anonymous():
    """A native listener facing other hosts needs [native] token or allow_anonymous = true; a password file is not enough."""
    native = listeners(("native", "tcp:9876"))
    text = refusal(native, None, False)
    assert "[native] token" in text and "allow_anonymous = true" in text
    assert "--native-udp" in refusal(listeners(("native_udp", "9876")), False, False)
    check_exposure(native, True, True, "")
    check_exposure(native, None, False, "", native_token="s3cret")
    check_exposure(listeners(("native_udp", "9876")), False, False, "", native_token="s3cret")


def test_http_on_every_interface_must_be_named():
    """A bare ``tcp:8080`` HTTP listener is refused; naming a non-loopback interface is a deliberate choice."""
    text = refusal(listeners(("http", "tcp:8080")), True, True)
    assert "/metrics" in text and "interface=0.0.0.0" in text
    check_exposure(listeners(("http", "tcp:8080:interface=0.0.0.0")), None, True, "")
