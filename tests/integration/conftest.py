"""Fixtures for integration tests: real ``shoal serve`` processes, driven by real clients.

* ``broker``: a fresh broker per test (own data dir, free port), stopped with SIGTERM at
  the end; the test fails if the broker crashed or did not exit cleanly.
* ``shared_broker``: one broker per test module, for tests that only need some topics;
  give each test its own topic (``topic_name``).
* ``start_broker(**overrides)``: a factory for brokers with ``-o key=value`` overrides;
  every broker it starts is stopped at the end.
* ``topic_name``: a topic name unique to the test.
* ``running_cluster(tmp_path, request, overrides)``: a context manager for a LocalCluster
  (etcd and three brokers), stopped on exit; its brokers' stderr goes into a failure's report.

Client helpers (quiet librdkafka clients, ``create_topic``, ``produce_all``,
``consume_exact``, ``wait_until``) live in ``tests/support/clients.py``. When a test
fails, the tail of each of its brokers' stderr is printed in the report.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.cluster import LocalCluster

_started: dict[str, list[BrokerProcess]] = {}


@contextmanager
def running_cluster(tmp_path: Path, request: pytest.FixtureRequest,
                    overrides: dict[str, str]) -> Iterator[LocalCluster]:
    """etcd and three brokers with ``overrides``, stopped on exit, also when the test fails."""
    c = LocalCluster(tmp_path, 3, overrides)
    _started[request.node.nodeid] = c.brokers  # their stderr goes into the report of a failure
    c.start()
    try:
        yield c
    finally:
        c.stop()
        _started.pop(request.node.nodeid, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for b in _started.get(item.nodeid, []) + _started.get(_module_key(item), []):
            rep.sections.append((f"broker stderr {b.stderr_path.name}", b.stderr_tail(60)))


def _module_key(item: pytest.Item) -> str:
    return f"module:{item.module.__name__}" if hasattr(item, "module") and item.module else ""


@pytest.fixture
def start_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    brokers: list[BrokerProcess] = []
    _started[request.node.nodeid] = brokers

    def start(overrides: dict[str, str] | None = None, **kw_overrides: str) -> BrokerProcess:
        settings = dict(overrides or {})
        settings.update({k.replace("_", "."): v for k, v in kw_overrides.items()})
        b = BrokerProcess(tmp_path / f"broker{len(brokers)}", settings)
        brokers.append(b)
        return b.start()

    yield start
    try:
        errors = []
        for b in brokers:
            try:
                b.stop()
            except Exception as e:  # report every broker, not just the first
                errors.append(e)
        if errors:
            raise errors[0]
    finally:
        _started.pop(request.node.nodeid, None)


@pytest.fixture
def broker(start_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """A fresh broker with default settings, for this test only."""
    return start_broker()


@pytest.fixture(scope="module")
def shared_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a whole module; tests must use their own topics."""
    key = f"module:{request.module.__name__}"
    b = BrokerProcess(tmp_path_factory.mktemp("shared") / "data")
    _started[key] = [b]
    b.start()
    yield b
    try:
        b.stop()
    finally:
        _started.pop(key, None)


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A legal topic name unique to this test."""
    return re.sub(r"[^a-zA-Z0-9._-]", "-", request.node.name)[:200]
