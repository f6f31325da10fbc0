"""The documented configuration matches the config dataclasses, so the docs cannot drift."""

from __future__ import annotations

import dataclasses
import os

from cluster.runtime.config import load_config
from cluster.runtime.config_doc import markdown_table, toml_text
from store.config import NativeConfig, from_mapping

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCUMENTED_CONFIG = os.path.join(ROOT, "conf", "twistmq.toml")


def test_conf_file_documents_every_key_with_its_default():
    """conf/twistmq.toml is exactly what the generator prints (python -m cluster.runtime.config_doc toml)."""
    with open(DOCUMENTED_CONFIG) as f:
        assert f.read().strip() == toml_text().strip()


def test_conf_file_says_what_a_node_without_a_file_runs_on():
    """conf/twistmq.toml loads to exactly the built-in defaults a node with no config file uses."""
    documented, builtin = load_config(DOCUMENTED_CONFIG), load_config(None)
    assert builtin.source == "defaults" and documented.source == DOCUMENTED_CONFIG
    # [native] stays a raw table until the native package builds its own dataclass from it.
    native = from_mapping(NativeConfig, "native", documented.native)
    assert native == NativeConfig()
    assert dataclasses.replace(documented, path="", base_dir="", native={}) == dataclasses.replace(builtin, base_dir="")
    assert builtin.node.mqtt == ("tcp:1883:interface=127.0.0.1",) and builtin.node.data_dir == ""


def test_readme_lists_every_config_key():
    """The README's key table is the generated one (python -m cluster.runtime.config_doc markdown)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    start = readme.index("<!-- config:start -->") + len("<!-- config:start -->")
    end = readme.index("<!-- config:end -->")
    assert readme[start:end].strip() == markdown_table().strip()
