"""Fixtures for the Spark tests: one local SparkSession and one ``shoal serve`` for the whole run.

The session runs ``local[4,3]``: four task slots and up to three attempts per task, so a
test can kill a task and see it retried (plain ``local[N]`` never retries). Workers run
this interpreter (``PYSPARK_PYTHON``), which has shoal installed. Spark's own Kafka
connector is on the session's classpath (``spark.jars``) once reference/spark/fetch.py
has fetched it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark  # noqa: F401  (the "test" extra installs it: without it these tests fail, not vanish)
import pytest

from tests.support.broker import BrokerProcess
from tests.support.spark_kafka import connector_jars


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data",
                      {"group.share.record.lock.duration.ms": "15000",
                       "group.share.min.record.lock.duration.ms": "1000"})  # a test's group may lock for less
    b.start()
    yield b
    b.stop(check=False)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import shoal.spark

    builder = SparkSession.builder
    jars = connector_jars()  # Spark's Kafka connector, for test_kafka_connector.py (when fetched)
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    session = (builder.master("local[4,3]").appName("shoal-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    shoal.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic of the test's own on the shared broker: its module and name (two modules may
    have tests of the same name)."""
    module = request.node.module.__name__.rpartition(".")[2].removeprefix("test_")
    return re.sub(r"[^a-zA-Z0-9._-]", "-", f"{module}.{request.node.name}")[:200]


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    return str(tmp_path / "share-state")
