"""Import rules the package table implies: the client side loads no RocksDB.

``mqtt_proxy`` may import ``lightqueue``'s topic rules and ``store``'s interface
modules, and importing them must not load ``rocksdict`` (the broker side's
storage). Each check runs in a fresh interpreter, so nothing this test process
imported before can hide or cause a load.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import mqtt_proxy

# Imports the modules one by one and names the first one whose import brought rocksdict in.
_PROBE = """
import importlib, json, sys
culprit = None
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
    if culprit is None and "rocksdict" in sys.modules:
        culprit = name
print(json.dumps(culprit))
"""


def _first_loading_rocksdict(modules: list[str]) -> str | None:
    """Import ``modules`` in order in a fresh interpreter; the first that loaded rocksdict, or None."""
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(modules)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


def _mqtt_proxy_modules() -> list[str]:
    return ["mqtt_proxy"] + sorted(m.name for m in pkgutil.walk_packages(mqtt_proxy.__path__, "mqtt_proxy."))


def test_mqtt_proxy_modules_do_not_load_rocksdict():
    """Importing every mqtt_proxy module, all together in a fresh interpreter, leaves rocksdict unloaded."""
    clean = _mqtt_proxy_modules()
    assert len(clean) > 20  # the walk found the package (a broken walk must not pass as clean)
    culprit = _first_loading_rocksdict(clean)
    assert culprit is None, (f"importing {culprit} loads rocksdict: mqtt_proxy may import only store's "
                             f"interface modules and lightqueue's topic rules")


def test_topic_rules_and_native_client_load_no_rocksdict():
    """What spark and push import from other packages (topic rules, native client) loads no rocksdict."""
    assert _first_loading_rocksdict(["lightqueue.topic", "lightqueue.topic_trie", "lightqueue.names",
                                     "mqtt_proxy.native.client", "store.api", "store.config"]) is None


def test_package_table_contracts_hold():
    """import-linter's contracts (.importlinter, DESIGN.md's package table) are all kept."""
    import os
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([lint, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
