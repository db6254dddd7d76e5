"""Spark's own Kafka connector (spark-sql-kafka-0-10) for the Spark tests.

``reference/spark/fetch.py`` fetches it with Maven (``scripts/test.sh`` runs it); this module
only reads what that fetch recorded, so it never starts Maven nor touches the network:

    connector_jars()            # the jars for spark.jars, [] when not fetched (or stale)
    require_connector(spark)    # fail the test, saying what to run, unless format("kafka") loads

The jars must be on the classpath when the session's JVM starts (``spark.jars`` in the
builder): the Spark tests share one session, which tests/spark/conftest.py builds with them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

__all__ = ["FETCH", "PROVIDER", "connector_jars", "connector_state", "require_connector"]

ROOT = Path(__file__).resolve().parents[2]
FETCH = ROOT / "reference" / "spark" / "fetch.py"
PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def _fetch_module() -> Any:
    spec = importlib.util.spec_from_file_location("shoal_reference_spark_fetch", FETCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def connector_state() -> dict | None:
    """What fetch.py recorded (versions, jars), if still valid for this pyspark and pom.xml."""
    return _fetch_module().cached()


def connector_jars() -> list[str]:
    state = connector_state()
    return list(state["jars"]) if state else []


def require_connector(spark: Any) -> dict:
    """The fetch record; fails the calling test when the connector is not usable in ``spark``."""
    state = connector_state()
    if state is None:
        pytest.fail(f"Spark's Kafka connector is not fetched: run `python {FETCH.relative_to(ROOT)}` "
                    f"(scripts/test.sh does) and run the tests again", pytrace=False)
    from py4j.protocol import Py4JJavaError

    jvm = spark.sparkContext._jvm
    loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    try:
        jvm.java.lang.Class.forName(PROVIDER, False, loader)
    except Py4JJavaError as e:
        pytest.fail(f"{PROVIDER} is not on the Spark session's classpath although fetch.py fetched "
                    f"it ({state['jars'][0]}): the session must be built with spark.jars set from "
                    f"connector_jars() before its JVM starts ({type(e).__name__})", pytrace=False)
    return state
