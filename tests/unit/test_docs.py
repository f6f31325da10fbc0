"""The documented configuration matches the config dataclasses, so the docs cannot drift."""

from __future__ import annotations

import os

from cluster.runtime.config import DEFAULT_CONFIG, load_config
from cluster.runtime.config_doc import markdown_table, toml_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_conf_file_documents_every_key_with_its_default():
    """conf/twistmq.toml is exactly what the generator prints (python -m cluster.runtime.config_doc toml)."""
    with open(DEFAULT_CONFIG) as f:
        assert f.read().strip() == toml_text().strip()


def test_conf_file_loads():
    """The shipped config file is valid."""
    assert load_config(None).node.mqtt == ("tcp:1883:interface=127.0.0.1",)


def test_readme_lists_every_config_key():
    """The README's key table is the generated one (python -m cluster.runtime.config_doc markdown)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    start = readme.index("<!-- config:start -->") + len("<!-- config:start -->")
    end = readme.index("<!-- config:end -->")
    assert readme[start:end].strip() == markdown_table().strip()
