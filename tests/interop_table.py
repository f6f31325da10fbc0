"""The client x feature interoperability table, generated from tests/integration/test_interop_*.py results.

Each interop test carries ``@pytest.mark.interop(client=..., feature=...)``; the
hook in ``tests/integration/conftest.py`` records every such test's outcome and,
at the end of a session that ran any of them, writes ``docs/interop.md`` (the
table plus the raw results as a JSON comment) and refreshes README.md between
``<!-- interop:start -->`` and ``<!-- interop:end -->`` when both markers exist.

``python -m tests.interop_table`` prints the table from the last results, to
paste by hand; ``--write`` rewrites docs/interop.md and the README block from
them.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "interop.md")
README = os.path.join(ROOT, "README.md")
TEST_DIR = os.path.join(ROOT, "tests", "integration")
TEST_GLOB = "test_interop_*.py"
START, END = "<!-- interop:start -->", "<!-- interop:end -->"
RESULTS_TAG = "interop-results"

# Columns, in order.
PAHO_311 = "paho-mqtt 3.1.1"
PAHO_5 = "paho-mqtt 5"
AMQTT = "amqtt 3.1.1"
MOSQUITTO = "mosquitto_pub/sub"
CLIENTS = [PAHO_311, PAHO_5, AMQTT, MOSQUITTO]

# Rows, in order; a feature a test uses that is not listed here goes at the end.
FEATURES = [
    "connect",
    "QoS 0",
    "QoS 1",
    "QoS 2",
    "cross-client delivery (to all four clients)",
    "wildcards + and #",
    "retained: set, wildcard match, clear",
    "persistent session (offline messages)",
    "will on abnormal disconnect",
    "no will on DISCONNECT",
    "will on keep-alive expiry (1.5x)",
    "will delay",
    "session takeover",
    "shared subscriptions",
    "topic alias (client to broker)",
    "topic alias (broker to client)",
    "message expiry",
    "user properties, content type, payload format, response topic, correlation data",
    "subscription identifiers",
    "no local",
    "retain handling 0/1/2",
    "retain as published",
    "assigned client identifier",
    "server keep alive",
    "$SYS/broker/uptime",
    "# does not match $SYS",
]

PASS, FAIL, NONE = "✅", "❌", "—"
_RANK = {"skip": 0, "pass": 1, "fail": 2}


def cells(results: dict) -> dict[tuple[str, str], str]:
    """(client, feature) -> outcome; a failing test wins over a passing one, a run test over a skipped one."""
    out: dict[tuple[str, str], str] = {}
    for entry in results.values():
        for client, feature in entry["cells"]:
            key = (client, feature)
            if key not in out or _RANK[entry["outcome"]] > _RANK[out[key]]:
                out[key] = entry["outcome"]
    return out


def render(results: dict) -> str:
    """The markdown table (rows features, columns clients) and the list of failing tests."""
    table = cells(results)
    features = list(FEATURES) + sorted({f for _, f in table} - set(FEATURES))
    clients = list(CLIENTS) + sorted({c for c, _ in table} - set(CLIENTS))
    lines = ["| feature | " + " | ".join(clients) + " |", "| --- |" + " :---: |" * len(clients)]
    for feature in features:
        row = []
        for client in clients:
            outcome = table.get((client, feature))
            row.append(PASS if outcome == "pass" else FAIL if outcome == "fail" else NONE)
        if any(c != NONE for c in row) or feature in FEATURES:
            lines.append(f"| {feature} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append(f"{PASS} passes, {FAIL} fails, {NONE} not applicable to that client (or not run). "
                 "Generated from `tests/integration/test_interop_*.py` by its pytest hook "
                 "(`python -m tests.interop_table` prints it again).")
    failing = sorted((nodeid, e) for nodeid, e in results.items() if e["outcome"] == "fail")
    if failing:
        lines.append("")
        lines.append("Failing:")
        lines.append("")
        for nodeid, e in failing:
            why = f": {e['reason']}" if e.get("reason") else ""
            lines.append(f"- `{nodeid.split('::', 1)[-1]}`{why}")
    return "\n".join(lines) + "\n"


def load(path: str = DOC) -> tuple[dict, dict]:
    """(results, meta) from the JSON comment in docs/interop.md; empty when there is none."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}, {}
    m = re.search(r"<!-- " + RESULTS_TAG + r"\n(.*?)\n-->", text, re.S)
    if not m:
        return {}, {}
    data = json.loads(m.group(1))
    return data.get("results", {}), data.get("meta", {})


def _existing_tests() -> set[tuple[str, str]] | None:
    """(module file name, test function) of every interop test there is now; None if there are none."""
    found = set()
    for path in glob.glob(os.path.join(TEST_DIR, TEST_GLOB)):
        with open(path, encoding="utf-8") as f:
            found.update((os.path.basename(path), name) for name in re.findall(r"^def (test_\w+)\(", f.read(), re.M))
    return found or None


def merge(previous: dict, current: dict) -> dict:
    """This run's results over the previous ones; drop previous entries whose test (module and function) is gone."""
    names = _existing_tests()
    merged = {}
    for nodeid, entry in previous.items():
        module, _, rest = nodeid.partition("::")
        name = rest.split("::")[-1].split("[")[0]
        if names is None or (os.path.basename(module), name) in names:
            merged[nodeid] = entry
    merged.update(current)
    return merged


def write(results: dict, meta: dict, doc: str = DOC, readme: str = README) -> str:
    """Write docs/interop.md and, if it has both markers, the README block; returns the table.

    Nothing is rewritten when the results are the ones already on file, so a run that changes nothing
    leaves the working tree alone (``meta``, the run date, is kept only in the JSON comment).
    """
    table = render(results)
    previous, _ = load(doc)
    if previous == results and os.path.exists(doc):
        _update_readme(readme, table)
        return table
    blob = json.dumps({"meta": meta, "results": dict(sorted(results.items()))}, indent=1, ensure_ascii=False)
    os.makedirs(os.path.dirname(doc), exist_ok=True)
    with open(doc, "w", encoding="utf-8") as f:
        f.write("# Interoperability\n\n"
                "Which MQTT clients work with twistmq, feature by feature. This file is written by the\n"
                "pytest hook in `tests/integration/conftest.py` after a run of\n"
                "`tests/integration/test_interop_*.py`; do not edit it by hand.\n\n")
        f.write(table)
        f.write(f"\n<!-- {RESULTS_TAG}\n{blob}\n-->\n")
    _update_readme(readme, table)
    return table


def _update_readme(readme: str, table: str) -> None:
    try:
        with open(readme, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return
    if START in text and END in text and text.index(START) < text.index(END):
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        new = f"{head}{START}\n{table}{END}{tail}"
        if new != text:
            with open(readme, "w", encoding="utf-8") as f:
                f.write(new)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    results, meta = load()
    if not results:
        print(f"no interop results in {os.path.relpath(DOC, ROOT)}; run "
              "`.venv/bin/python -m pytest tests/integration/test_interop_*.py`", file=sys.stderr)
        return 1
    if "--write" in argv:
        write(results, meta)
    sys.stdout.write(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
