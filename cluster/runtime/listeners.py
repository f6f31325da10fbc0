"""The node's listener descriptions, checked before anything opens: syntax, where they face, who may connect.

Every listener flag (``--mqtt``, ``--mqtt-tls``, ``--mqtt-ws``, ``--native``,
``--native-udp``, ``--http``) and its ``[node]`` key is parsed here into a
``Listener``. A description Twisted would reject with a traceback (``1883``,
``localhost:1883``, ``tcp:notaport``, an unknown argument) is a ConfigError of
one line naming the flag or key, the value and a correct example.

Exposure (Mosquitto 2's rule, see ``MQTTConfig.allow_anonymous``): a listener
that faces other hosts (no ``interface=``, or a non-loopback one) needs a way
to tell clients apart, or an explicit ``allow_anonymous = true``:

- MQTT and WebSocket: a password file that anonymous clients cannot bypass, or
  an ``ssl:`` listener with ``mqtt_tls_ca`` (client certificates required);
- native: a ``[native] token`` every client must present, or ``allow_anonymous = true``;
- HTTP (/health and /metrics, read-only counters): the interface must be named
  (``interface=0.0.0.0``); a bare ``tcp:8080`` is refused, since MQTT's
  credentials cannot protect it and exposing it is then a choice, not a habit.

Cluster listeners (``ROLE_FLAGS``: RPC, and any later one between members)
face other hosts only with ``[cluster] secret`` set: members prove it to each
other when they connect (``check_cluster_exposure``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from dataclasses import dataclass

from mqtt_proxy.tls import parse_description
from store.config import ConfigError

FLAGS = {"mqtt": "--mqtt", "mqtt_tls": "--mqtt-tls", "mqtt_ws": "--mqtt-ws", "native": "--native",
         "native_udp": "--native-udp", "http": "--http"}
"""Config key of each listener kind -> its command-line flag, in the order listeners open."""

ROLE_FLAGS = {"rpc": "--rpc", "ha": "--ha"}
"""Listener kinds of other roles than the node's, with their flags (``[cluster]`` keys, checked the same way)."""
_SECTIONS = {"rpc": "cluster", "ha": "cluster"}

_DEFAULT_PORTS = {"mqtt": 1883, "mqtt_tls": 8883, "mqtt_ws": 8083, "native": 9876, "native_udp": 9876,
                  "http": 8080, "rpc": 7800, "ha": 7850}
_STREAM_TYPES = ("tcp", "tcp6", "ssl", "unix")
_ARGUMENTS = {
    "tcp": {"port", "interface", "backlog", "reuseport"},
    "tcp6": {"port", "interface", "backlog", "reuseport"},
    "ssl": {"port", "interface", "backlog", "privateKey", "certKey", "extraCertChain", "dhParameters"},
    "unix": {"address", "mode", "backlog", "lockfile"},
}
SSL_FILE_ARGUMENTS = ("privateKey", "certKey", "extraCertChain", "dhParameters")
"""Arguments of an ``ssl:`` description that name files."""


@dataclass(frozen=True)
class Listener:
    """One listener as configured: what it serves, its description, and where it binds."""

    key: str
    """The ``[node]`` key of its kind: mqtt, mqtt_tls, mqtt_ws, native, native_udp or http."""
    description: str
    """The endpoint description (``[HOST:]PORT`` for native_udp), with file paths made absolute."""
    where: str
    """How an error names it: ``--mqtt tcp:1883`` or ``node.mqtt = "tcp:1883" in FILE``."""
    kind: str
    """tcp, tcp6, ssl, unix or udp."""
    port: int | None
    """Port number (None for unix sockets)."""
    interface: str
    """Address it binds; empty: every interface."""
    from_flag: bool = True
    """Given on the command line (else read from the config file)."""

    @property
    def local(self) -> bool:
        """True when only this host can connect: a loopback interface or a unix socket."""
        return self.kind == "unix" or is_loopback(self.interface)


def is_loopback(interface: str) -> bool:
    """True for 127.0.0.0/8, ::1 and localhost; False for an empty interface (every one) or any other."""
    if interface == "localhost":
        return True
    try:
        return ipaddress.ip_address(interface).is_loopback
    except ValueError:
        return False


def example(key: str, from_flag: bool, port: int | None = None) -> str:
    """A correct loopback listener of this kind (on *port* if given), written as a flag or as TOML."""
    port = _DEFAULT_PORTS[key] if port is None else port
    if key == "native_udp":
        text = f"127.0.0.1:{port}"
    elif key == "mqtt_tls":
        text = f"ssl:{port}:interface=127.0.0.1:privateKey=KEY:certKey=CERT"
    else:
        text = f"tcp:{port}:interface=127.0.0.1"
    flag = FLAGS.get(key) or ROLE_FLAGS[key]
    return f"{flag} {text}" if from_flag else f"{key} = [{json.dumps(text)}]"


def _meant_port(description: str) -> int | None:
    """The port a malformed description seems to mean (its last number), for the example."""
    for part in reversed(description.replace("=", ":").split(":")):
        if part.isdigit() and int(part) <= 65535:
            return int(part)
    return None


def where(key: str, description: str, source: str | None) -> str:
    """Name a listener for a message: its flag when *source* is None, else its key and the config file."""
    if source is None:
        return f"{FLAGS.get(key) or ROLE_FLAGS[key]} {description}"
    return f"{_SECTIONS.get(key, 'node')}.{key} = {json.dumps(description)} in {source}"


def parse_listener(key: str, description: str, source: str | None = None,
                   base_dir: str | None = None) -> Listener:
    """Check one description; *source* is the config file it came from (None: the command line).

    Relative file names inside it start at *base_dir* (the working directory when None).
    """
    name = where(key, description, source)
    try:
        if key == "native_udp":
            listener = _parse_udp(key, description, name)
        else:
            listener = _parse_stream(key, description, name, base_dir)
    except _Bad as bad:
        hint = example(key, source is None, _meant_port(description))
        raise ConfigError(f"{name}: {bad}; for example {hint}") from None
    return dataclasses.replace(listener, from_flag=source is None)


class _Bad(Exception):
    """What is wrong with a description (the caller adds where and an example)."""


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise _Bad(f"the port must be a number from 0 to 65535, not {text!r}")
    return int(text)


def _parse_udp(key: str, description: str, name: str) -> Listener:
    host, _, port = description.rpartition(":")
    return Listener(key, description, name, "udp", _port(port), host)


def _parse_stream(key: str, description: str, name: str, base_dir: str | None) -> Listener:
    if ":" not in description:
        if description.isdigit():
            raise _Bad("a bare port is not a listener: say its type and interface")
        raise _Bad("not a listener description (TYPE:PORT:interface=ADDRESS)")
    kind, args, kwargs = parse_description(description)
    if kind not in _STREAM_TYPES:
        raise _Bad(f"unknown listener type {kind!r} (use tcp, tcp6, ssl or unix)")
    if key == "mqtt_tls" and kind != "ssl":
        raise _Bad("a TLS listener must be an ssl: endpoint")
    positional = "address" if kind == "unix" else "port"
    if len(args) > 1 or (args and positional in kwargs):
        raise _Bad(f"{kind}: takes one positional argument (the {positional})")
    if args:
        kwargs[positional] = args[0]
    unknown = sorted(set(kwargs) - _ARGUMENTS[kind])
    if unknown:
        raise _Bad(f"unknown {kind}: argument {unknown[0]!r} (known: {', '.join(sorted(_ARGUMENTS[kind]))})")
    if positional not in kwargs:
        raise _Bad(f"{kind}: needs a {positional}")
    if kwargs.get("reuseport", "no").lower() not in ("yes", "no", "true", "false", "1", "0", "on", "off"):
        raise _Bad(f"reuseport must be yes or no, not {kwargs['reuseport']!r}")
    if "backlog" in kwargs and not kwargs["backlog"].isdigit():
        raise _Bad(f"backlog must be a number, not {kwargs['backlog']!r}")
    if kind == "ssl" and "privateKey" not in kwargs:
        raise _Bad("ssl: needs privateKey=FILE (and certKey=FILE unless the key file holds the certificate)")
    path_arguments = {"ssl": SSL_FILE_ARGUMENTS, "unix": ("address",)}.get(kind, ())
    changed = False
    for arg in path_arguments:
        if arg in kwargs:
            path = resolve_path(kwargs[arg], base_dir)
            if kind == "ssl" and not os.path.exists(path):
                raise _Bad(f"{arg}: file {path} does not exist")
            changed = changed or path != kwargs[arg]
            kwargs[arg] = path
    if changed:  # written back with absolute paths, so the working directory does not matter
        description = unparse(kind, kwargs, positional)
    if kind == "unix":
        return Listener(key, description, name, kind, None, "")
    return Listener(key, description, name, kind, _port(kwargs["port"]), kwargs.get("interface", ""))


def resolve_path(path: str, base_dir: str | None) -> str:
    """*path* made absolute: relative ones start at *base_dir* (the config file's), or the working directory."""
    path = os.path.expanduser(path)
    if base_dir is not None and not os.path.isabs(path):
        path = os.path.join(base_dir, path)
    return os.path.abspath(path)


def unparse(kind: str, kwargs: dict[str, str], positional: str) -> str:
    """Write a description back, escaping ``\\``, ``:`` and ``=`` in values as Twisted reads them."""
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace(":", "\\:").replace("=", "\\=")
    parts = [kind, esc(kwargs[positional])]
    parts += [f"{k}={esc(v)}" for k, v in kwargs.items() if k != positional]
    return ":".join(parts)


def check_exposure(listeners, allow_anonymous: bool | None, anonymous_allowed: bool, tls_ca: str,
                   native_token: str = "") -> None:
    """Refuse a listener that faces other hosts without authentication, unless allow_anonymous is true.

    *allow_anonymous* is the value as written (None: unset); *anonymous_allowed* what it means once
    defaulted; *tls_ca* is ``mqtt_tls_ca`` (client certificates are required on ssl: MQTT listeners);
    *native_token* is ``[native] token`` (native clients must present it).
    """
    for listener in listeners:
        if listener.local:
            continue
        problem = _exposure_problem(listener, allow_anonymous, anonymous_allowed, tls_ca, native_token)
        if problem:
            local = example(listener.key, listener.from_flag, listener.port)
            raise ConfigError(f"{listener.where} would {problem}, or bind it to this host: {local}")


def check_cluster_exposure(listeners, secret: str) -> None:
    """Refuse a cluster listener (a ``ROLE_FLAGS`` kind) that faces other hosts while ``[cluster] secret`` is
    empty: without it any host that reaches the port could join the cluster."""
    if secret:
        return
    for listener in listeners:
        if listener.key in ROLE_FLAGS and not listener.local:
            local = example(listener.key, listener.from_flag, listener.port)
            raise ConfigError(f"{listener.where} is not on loopback: set [cluster] secret (members prove it to "
                              f"each other when they connect), or bind it to this host: {local}")


def _exposure_problem(listener: Listener, allow_anonymous: bool | None, anonymous_allowed: bool,
                      tls_ca: str, native_token: str) -> str | None:
    if listener.key == "http":
        if listener.interface:
            return None  # an explicit non-loopback interface: serving /metrics there is deliberate
        return ("serve /health and /metrics (no authentication) on every interface: "
                "name the interface to publish them (interface=0.0.0.0)")
    if allow_anonymous is True:
        return None  # the operator said so
    if listener.key in ("native", "native_udp"):
        if native_token:
            return None  # every native request is checked against the token
        return ("accept native clients from other hosts without authentication: set [native] token, "
                "accept them with [mqtt] allow_anonymous = true")
    if not anonymous_allowed:
        return None  # a password file (or allow_anonymous = false) refuses clients without credentials
    if listener.kind == "ssl" and tls_ca:
        return None  # the TLS handshake requires a client certificate signed by mqtt_tls_ca
    return ("accept anonymous clients from other hosts: require authentication ([mqtt] password_file, "
            "or mqtt_tls_ca with an ssl: listener), accept them with [mqtt] allow_anonymous = true")
