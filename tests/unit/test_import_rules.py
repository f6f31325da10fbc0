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

# Modules that still load rocksdict today, and why. The restructure (issue 13) moves or cuts these
# imports; the list may only shrink: a module here that has become clean fails the test until it is
# removed from the list, and a module not here that loads rocksdict fails it too.
LOADS_ROCKSDICT = {
    "mqtt_proxy.native.service": "wiring: builds lightqueue's NativeEngine on a store.kv DurableKV",
}

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


def test_the_known_list_names_real_modules():
    """Every module listed as loading rocksdict exists (a moved or renamed module leaves the list)."""
    assert set(LOADS_ROCKSDICT) <= set(_mqtt_proxy_modules())


def test_mqtt_proxy_modules_do_not_load_rocksdict():
    """Importing every mqtt_proxy module outside the known list, all together, leaves rocksdict unloaded."""
    clean = [m for m in _mqtt_proxy_modules() if m not in LOADS_ROCKSDICT]
    assert len(clean) > 20  # the walk found the package (a broken walk must not pass as clean)
    culprit = _first_loading_rocksdict(clean)
    assert culprit is None, (f"importing {culprit} loads rocksdict: mqtt_proxy may import only store's "
                             f"interface modules and lightqueue's topic rules")


def test_the_known_list_only_shrinks():
    """Each module on the known list still loads rocksdict; once it does not, it must leave the list."""
    for name in sorted(LOADS_ROCKSDICT):
        loader = _first_loading_rocksdict([name])
        assert loader == name, f"{name} no longer loads rocksdict: remove it from LOADS_ROCKSDICT"


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
