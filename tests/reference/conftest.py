"""Fixtures for the tests that run Apache Kafka's own software against shoal.

Kafka's released jars come from reference/kafka (fetched by Maven once, then cached; see
tests/support/kafka_ref.py). A machine that cannot fetch them fails these tests: they are
not skipped.

* ``kafka_classpath``: the jars (session; fetches them on the first run of a fresh machine).
* ``shoal``: one ``shoal serve`` per test module with short group and lock timeouts, so
  the Java clients' scenarios run quickly; tests use their own topics and groups.
* ``java(name)``: a Java program from tests/reference/java, compiled against kafka-clients
  (once per source version).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.kafka_ref import JavaProgram, classpath

JAVA_DIR = Path(__file__).parent / "java"

# Short timeouts (within shoal's bounds) so that lock expiry and member expiry are quick.
SHOAL_OVERRIDES = {
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.min.session.timeout.ms": "6000",
    "group.share.session.timeout.ms": "10000",
    "group.share.heartbeat.interval.ms": "1000",
    "group.share.min.heartbeat.interval.ms": "1000",
    "group.consumer.session.timeout.ms": "10000",
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
}

_brokers: dict[str, BrokerProcess] = {}


@pytest.fixture(scope="session")
def kafka_classpath() -> str:
    return classpath()


@pytest.fixture(scope="session")
def java(kafka_classpath: str) -> Callable[[str], JavaProgram]:
    programs: dict[str, JavaProgram] = {}

    def get(name: str) -> JavaProgram:
        if name not in programs:
            programs[name] = JavaProgram(JAVA_DIR / f"{name}.java")
            programs[name].compile()
        return programs[name]

    return get


@pytest.fixture(scope="module")
def shoal(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          kafka_classpath: str) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("shoal") / "data", SHOAL_OVERRIDES)
    _brokers[request.module.__name__] = b
    b.start()
    yield b
    try:
        b.stop()
    finally:
        _brokers.pop(request.module.__name__, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and getattr(item, "module", None) is not None:
        b = _brokers.get(item.module.__name__)
        if b is not None:
            rep.sections.append((f"shoal stderr {b.stderr_path.name}", b.stderr_tail(60)))
