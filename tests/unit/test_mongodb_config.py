"""The [mongodb], [auth] and [auth.mongodb] sections: defaults, validation naming the key, never the URI."""

from __future__ import annotations

import pytest

from cluster.mongodb import config as mongodb_config
from cluster.mongodb.config import MongoConfig, check_usable
from cluster.runtime.config import load_config, settle
from store.config import ConfigError

SECRET_URI = "mongodb://fleet:s3cr3t-pw@127.0.0.1:27017/?authSource=admin"


def write(path, text):
    path.write_text(text)
    return str(path)


def test_defaults_name_the_twistmq_database_and_the_file_backend():
    """Without a file: database twistmq, timeout 5 s, no URI, the password file as the only source."""
    cfg = settle(load_config(None))
    assert cfg.mongodb == MongoConfig() and cfg.mongodb.database == "twistmq" and cfg.mongodb.timeout == 5.0
    assert cfg.auth.backends == ("file",) and not cfg.auth.mongodb
    assert cfg.auth_mongodb.collection == "mqtt_user" and cfg.auth_mongodb.acl_collection == "mqtt_acl"
    assert cfg.auth_mongodb.cache_ttl == 30.0


def test_sections_are_read_as_named(tmp_path):
    """[mongodb], [auth] and [auth.mongodb] keys are read with the names operators write."""
    path = write(tmp_path / "t.toml", f'[mongodb]\nuri = "{SECRET_URI}"\ndatabase = "fleet"\ntimeout = 2\n'
                 '[auth]\nbackends = ["file", "mongodb"]\nacl_nomatch = "allow"\n'
                 '[auth.mongodb]\ncollection = "devices"\nacl_collection = "rules"\ncache_ttl = 0.5\n')
    cfg = settle(load_config(path))
    assert cfg.mongodb.uri == SECRET_URI and cfg.mongodb.database == "fleet" and cfg.mongodb.timeout == 2
    assert cfg.auth.backends == ("file", "mongodb") and cfg.auth.acl_nomatch == "allow"
    assert (cfg.auth_mongodb.collection, cfg.auth_mongodb.acl_collection, cfg.auth_mongodb.cache_ttl) == \
        ("devices", "rules", 0.5)


def test_mongodb_backend_makes_anonymous_clients_refused_by_default(tmp_path):
    """A MongoDB source counts as authentication: allow_anonymous defaults to false, and a listener facing
    other hosts is accepted without a password file."""
    path = write(tmp_path / "t.toml", f'[mongodb]\nuri = "{SECRET_URI}"\n[auth]\nbackends = ["mongodb"]\n'
                 '[node]\nmqtt = "tcp:1883:interface=0.0.0.0"\n')
    cfg = settle(load_config(path))
    assert cfg.mqtt.allow_anonymous is False


@pytest.mark.parametrize("text,key", [
    ('[mongodb]\ndatabase = ""\n', "mongodb.database"),
    ('[mongodb]\ntimeout = 0\n', "mongodb.timeout"),
    ('[mongodb]\ntimeout = "5"\n', "mongodb.timeout"),
    ('[mongodb]\nuri = "http://fleet:s3cr3t-pw@host/"\n', "mongodb.uri"),
    ('[auth]\nbackends = ["ldap"]\n', "auth.backends"),
    ('[auth]\nacl_nomatch = "maybe"\n', "auth.acl_nomatch"),
    ('[auth.mongodb]\ncache_ttl = -1\n', "auth.mongodb.cache_ttl"),
    ('[auth.mongodb]\ncollection = ""\n', "auth.mongodb.collection"),
    ('[auth.mongodb]\nbogus = 1\n', "auth.mongodb.bogus"),
    ('[auth]\nbackends = ["mongodb"]\n', "mongodb.uri"),
    ('[mongodb]\nuri = "mongodb://fleet:s3cr3t-pw@host:99999/"\n[auth]\nbackends = ["mongodb"]\n', "mongodb.uri"),
])
def test_bad_values_name_the_key_and_never_the_password(tmp_path, text, key):
    """Each bad value is one ConfigError naming its key; the URI's password never appears in it."""
    path = write(tmp_path / "t.toml", text)
    with pytest.raises(ConfigError) as info:
        settle(load_config(path))
    assert key in str(info.value) and "s3cr3t-pw" not in str(info.value)
    assert "\n" not in str(info.value)


def test_password_file_outside_the_chain_is_refused(tmp_path):
    """A password file the chain does not name would be silently ignored: refused, naming the key."""
    (tmp_path / "passwd").write_text("")
    path = write(tmp_path / "t.toml", f'[mqtt]\npassword_file = "passwd"\n[mongodb]\nuri = "{SECRET_URI}"\n'
                 '[auth]\nbackends = ["mongodb"]\n')
    with pytest.raises(ConfigError, match="mqtt.password_file"):
        settle(load_config(path))


def test_missing_pymongo_is_one_line_naming_the_extra(monkeypatch):
    """A config that uses MongoDB where pymongo cannot be imported: one line naming the mongodb extra."""
    monkeypatch.setattr(mongodb_config, "pymongo_installed", lambda: False)
    with pytest.raises(ConfigError) as info:
        check_usable(MongoConfig(uri="mongodb://h/"), "auth.backends")
    assert str(info.value) == "auth.backends uses MongoDB but pymongo is not installed (pip install 'twistmq[mongodb]')"


def test_srv_uri_is_not_resolved_at_start():
    """A mongodb+srv:// URI is accepted without a DNS lookup at start (the client resolves it off the reactor)."""
    check_usable(MongoConfig(uri="mongodb+srv://fleet:pw@cluster0.invalid/"), "auth.backends")
