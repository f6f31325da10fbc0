"""Settling the node's config: paths relative to the config file, missing files named, safe defaults."""

from __future__ import annotations

import pytest

from cluster.runtime.config import find_config, load_config, settle, with_data_dir, with_flags
from store.config import ConfigError


def write(path, text):
    path.write_text(text)
    return str(path)


def test_default_config_listens_on_loopback_only():
    """With the shipped config every listener binds a loopback address and anonymous clients are accepted."""
    cfg = settle(load_config(None))
    assert cfg.listeners and all(listener.local for listener in cfg.listeners)
    assert cfg.mqtt.allow_anonymous is True


def test_relative_paths_start_at_the_config_files_directory(tmp_path):
    """acl_file, password_file, mqtt_tls_ca, data_dir and log.file resolve against the config's directory."""
    conf = tmp_path / "conf"
    conf.mkdir()
    for name in ("acl", "passwd", "ca.pem"):
        (conf / name).write_text("")
    path = write(conf / "site.toml", '[mqtt]\nacl_file = "acl"\npassword_file = "passwd"\n'
                                     '[node]\nmqtt_tls_ca = "ca.pem"\ndata_dir = "data"\n[log]\nfile = "node.log"\n')
    cfg = settle(load_config(path))
    assert cfg.mqtt.acl_file == str(conf / "acl")
    assert cfg.mqtt.password_file == str(conf / "passwd")
    assert cfg.node.mqtt_tls_ca == str(conf / "ca.pem")
    assert cfg.node.data_dir == str(conf / "data")
    assert cfg.log.file == str(conf / "node.log")


def test_command_line_paths_start_at_the_working_directory(tmp_path, monkeypatch):
    """--data-dir and --mqtt-tls-ca resolve against the working directory, not the config file's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ca.pem").write_text("")
    flags = {"data_dir": "d", "mqtt_tls_ca": "ca.pem"}
    cfg = settle(with_flags(load_config(None), flags), set(flags))
    assert cfg.node.data_dir == str(tmp_path / "d")
    assert cfg.node.mqtt_tls_ca == str(tmp_path / "ca.pem")


@pytest.mark.parametrize("section,key", [("mqtt", "acl_file"), ("mqtt", "password_file"), ("node", "mqtt_tls_ca")])
def test_missing_file_names_key_and_resolved_path(tmp_path, section, key):
    """A file that is not there is one error naming the key and the absolute path looked at."""
    path = write(tmp_path / "site.toml", f'[{section}]\n{key} = "missing-{key}"\n')
    with pytest.raises(ConfigError) as info:
        settle(load_config(path))
    assert str(info.value) == f"{section}.{key}: {tmp_path / ('missing-' + key)} does not exist"


def test_missing_file_from_a_flag_names_the_flag(tmp_path, monkeypatch):
    """--mqtt-tls-ca with a missing file names the flag and the path under the working directory."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        settle(with_flags(load_config(None), {"mqtt_tls_ca": "nope.pem"}), {"mqtt_tls_ca"})
    assert str(info.value) == f"--mqtt-tls-ca: {tmp_path / 'nope.pem'} does not exist"


def test_config_file_listeners_are_checked_and_named_by_key(tmp_path):
    """A malformed listener in the config file is refused naming the key and the file."""
    path = write(tmp_path / "site.toml", '[node]\nnative = "9876"\n')
    with pytest.raises(ConfigError) as info:
        settle(load_config(path))
    assert str(info.value).startswith(f'node.native = "9876" in {path}: a bare port')


def test_allow_anonymous_unset_means_no_password_file(tmp_path):
    """Unset allow_anonymous becomes false once a password file is set, and true without one."""
    (tmp_path / "passwd").write_text("")
    with_passwords = write(tmp_path / "a.toml", '[mqtt]\npassword_file = "passwd"\n')
    assert settle(load_config(with_passwords)).mqtt.allow_anonymous is False
    explicit = write(tmp_path / "b.toml", '[mqtt]\npassword_file = "passwd"\nallow_anonymous = true\n')
    assert settle(load_config(explicit)).mqtt.allow_anonymous is True


def test_open_listener_refused_unless_password_file(tmp_path):
    """An MQTT listener on every interface needs a password file (then anonymous clients are refused)."""
    flags = {"mqtt": ("tcp:1883",)}
    with pytest.raises(ConfigError, match="would accept anonymous clients"):
        settle(with_flags(load_config(None), flags), set(flags))
    (tmp_path / "passwd").write_text("")
    path = write(tmp_path / "a.toml", '[mqtt]\npassword_file = "passwd"\n')
    cfg = settle(with_flags(load_config(path), flags), set(flags))
    assert cfg.node.mqtt == ("tcp:1883",) and cfg.mqtt.allow_anonymous is False


def test_log_section_is_validated(tmp_path):
    """[log] level must be a known level; an unknown [log] key is named."""
    with pytest.raises(ConfigError, match="log.level must be one of"):
        load_config(write(tmp_path / "a.toml", '[log]\nlevel = "LOUD"\n'))
    with pytest.raises(ConfigError, match="unknown config key log.colour"):
        load_config(write(tmp_path / "b.toml", '[log]\ncolour = true\n'))
    assert load_config(write(tmp_path / "c.toml", '[log]\nlevel = "warning"\n')).log.level == "warning"


def test_config_path_that_is_a_directory_is_one_line(tmp_path):
    """--config pointing at a directory is a ConfigError, not a traceback."""
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(str(tmp_path))


def test_config_lookup_order_is_flag_then_environment_then_etc_then_defaults(tmp_path):
    """--config wins over $TWISTMQ_CONFIG, which wins over the system file, which is used only if it exists."""
    etc = tmp_path / "twistmq.toml"
    env = {"TWISTMQ_CONFIG": "/from/env.toml"}
    assert find_config("/from/flag.toml", env, str(etc)) == "/from/flag.toml"
    assert find_config(None, env, str(etc)) == "/from/env.toml"
    assert find_config(None, {}, str(etc)) is None
    etc.write_text("")
    assert find_config(None, {"TWISTMQ_CONFIG": ""}, str(etc)) == str(etc)


def test_no_config_file_means_the_built_in_defaults(tmp_path, monkeypatch):
    """Without a file every key has its default, whatever the working directory holds."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    write(tmp_path / "conf" / "twistmq.toml", "[node]\nmqtt = \"tcp:1\"\n")  # not read: no lookup by cwd
    cfg = load_config(None)
    assert cfg.source == "defaults" and cfg.node.mqtt == ("tcp:1883:interface=127.0.0.1",)


def test_an_unset_data_dir_is_made_under_the_data_root_per_role(tmp_path):
    """data_dir unset: ROOT/ROLE, made on the spot; a data_dir given by file or flag is left alone."""
    cfg = with_data_dir(load_config(None), "broker", str(tmp_path / "lib"))
    assert cfg.node.data_dir == str(tmp_path / "lib" / "broker") and (tmp_path / "lib" / "broker").is_dir()
    given = with_flags(load_config(None), {"data_dir": str(tmp_path / "d")})
    assert with_data_dir(given, "node", str(tmp_path / "lib")).node.data_dir == str(tmp_path / "d")


def test_a_data_root_that_cannot_be_made_asks_for_data_dir(tmp_path):
    """When ROOT/ROLE cannot be made (here ROOT is a file) the error names it and asks for --data-dir."""
    root = tmp_path / "file"
    root.write_text("")
    with pytest.raises(ConfigError, match=r"file/node cannot be made .*pass --data-dir DIR"):
        with_data_dir(load_config(None), "node", str(root))


@pytest.mark.parametrize("text, message", [
    ('group_numbers = { g1 = 0, g2 = 0 }', "same number"),
    ('group_numbers = { g1 = 40000 }', "0-32767"),
    ('group_numbers = { g1 = "one" }', "group_numbers maps"),
    ('advertise = { rpc = "tcp:h:1" }', "advertise_rpc"),
    ('advertise = { mqtt = 1883 }', "advertise maps"),
    ('zone = " eu "', "zone must be"),
])
def test_cluster_ids_and_advertised_addresses_are_validated(tmp_path, text, message):
    """[cluster] group_numbers, advertise and zone: a bad value is a ConfigError naming the key."""
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path / "c.toml", f"[cluster]\n{text}\n"))
