"""A pytest plugin for ``test_coverage_map.py``: after collection, print each item's
node id and whether a skip marker (a long-run tier's, say) keeps it out of this run."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        skipped = any(m.name == "skip" or (m.name == "skipif" and m.args and m.args[0] is True)
                      for m in item.iter_markers())
        print(f"COVERAGE-PROBE {'skipped' if skipped else 'runs'} {item.nodeid}")
