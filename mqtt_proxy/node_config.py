"""Reading ``conf/twistmq.toml`` (or ``--config FILE``) into the config dataclasses.

Each section maps to one dataclass; an unknown section or key, or a value of
the wrong type, is a ConfigError that names it, so the node can exit with one
line instead of starting half-configured.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass

from mqtt_proxy.config import LimitsConfig, MQTTConfig, NodeConfig
from store.config import ConfigError, StoreConfig, from_mapping

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "twistmq.toml")


@dataclass(frozen=True)
class Config:
    """Every section of the node's configuration."""

    node: NodeConfig
    store: StoreConfig
    mqtt: MQTTConfig
    limits: LimitsConfig
    native: dict  # raw [native] section: the native package builds its own dataclass from it
    base_dir: str  # directory of the config file: relative paths start here


SECTIONS = {"node": NodeConfig, "store": StoreConfig, "mqtt": MQTTConfig, "limits": LimitsConfig}


def load_config(path: str | None) -> Config:
    """Parse and check the TOML file at ``path`` (the default file when None)."""
    path = path or DEFAULT_CONFIG
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for section in raw:
        if section not in SECTIONS and section != "native":
            raise ConfigError(f"unknown config section [{section}] in {path}")
        if not isinstance(raw[section], dict):
            raise ConfigError(f"config key {section} must be a [section]")
    built = {}
    for name, cls in SECTIONS.items():
        values = dict(raw.get(name, {}))
        if name == "node":
            for key, value in values.items():
                if isinstance(value, str) and key not in ("data_dir", "mqtt_tls_ca", "ws_path"):
                    values[key] = (value,)  # one listener may be written as a plain string
                elif isinstance(value, list):
                    values[key] = tuple(value)
        built[name] = from_mapping(cls, name, values)
    return Config(built["node"], built["store"], built["mqtt"], built["limits"], dict(raw.get("native", {})),
                  os.path.dirname(os.path.abspath(path)))
