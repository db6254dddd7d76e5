"""How the suite splits over pytest-xdist workers (``scripts/test.sh`` runs ``-n 2 --dist loadgroup``).

Tests that share something expensive run on one worker: every Spark test (one Spark
session per worker would double the JVMs), every Apache Kafka reference test (its Kafka
broker and Java programs), and each integration module (a module-scoped broker). Unit and
property tests spread freely. Without xdist the markers change nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_ONE_WORKER = {"spark": "spark", "reference": "kafka-reference"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(item.path).resolve().relative_to(_TESTS).parts
        if not parts:
            continue
        if parts[0] in _ONE_WORKER:
            item.add_marker(pytest.mark.xdist_group(_ONE_WORKER[parts[0]]))
        elif parts[0] == "integration":
            item.add_marker(pytest.mark.xdist_group("/".join(parts)))
