"""Integration-test hooks: the ``interop`` marker and the interoperability table it feeds.

A test marked ``@pytest.mark.interop(client=..., feature=...)`` (one or more
times) fills those cells of the table in tests/interop_table.py: ✅ when its
body ran to the end, ❌ when it raised (an ``xfail`` for a known broker bug is
❌ too: the feature does not work with that client yet), — when skipped. At the
end of a session that ran any of them, docs/interop.md (and the README block
between the interop markers, if present) is rewritten from these results merged
over the previous ones, so a partial run (``-k``) only updates the cells it ran.
"""

from __future__ import annotations

import datetime

import pytest

from tests import interop_table

_RESULTS = pytest.StashKey[dict]()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "interop(client, feature): the test shows that feature working with that client; its outcome "
        "fills that cell of the generated interoperability table (docs/interop.md, README)")
    config.stash[_RESULTS] = {}


def _reason(item, excinfo) -> str:
    mark = item.get_closest_marker("xfail")
    if mark is not None and mark.kwargs.get("reason"):
        return mark.kwargs["reason"]
    text = excinfo.exconly().strip().splitlines()[0] if excinfo else ""
    return text[:200]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    marks = list(item.iter_markers("interop"))
    if not marks or call.when == "teardown":
        return report
    results = item.config.stash[_RESULTS]
    if call.when == "setup" and call.excinfo is None:
        return report
    if call.excinfo is None:
        outcome = "pass"
    elif call.excinfo.errisinstance(pytest.skip.Exception):
        outcome = "skip"
    else:
        outcome = "fail"
    results[item.nodeid] = {
        "cells": [[m.kwargs["client"], m.kwargs["feature"]] for m in marks],
        "outcome": outcome,
        "reason": _reason(item, call.excinfo) if outcome == "fail" else "",
    }
    return report


def pytest_sessionfinish(session, exitstatus):
    current = session.config.stash.get(_RESULTS, {})
    if not current or hasattr(session.config, "workerinput"):
        return
    previous, _ = interop_table.load()
    results = interop_table.merge(previous, current)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    interop_table.write(results, meta)
