"""reference/spark/fetch.py: which connector version it takes and which jars it keeps (no Maven run)."""

from __future__ import annotations

from tests.support.spark_kafka import _fetch_module

fetch = _fetch_module()


def test_pysparks_own_version_when_published_else_the_newest_earlier_release() -> None:
    published = ["3.5.9", "4.0.0-preview1", "4.0.0", "4.1.3", "4.2.0-preview5", "4.2.0", "4.3.0-preview1", "5.0.0"]
    assert fetch.newest_release(published, "4.3.0") == "4.2.0"  # previews and 5.x never taken
    assert fetch.newest_release(published + ["4.3.0"], "4.3.0") == "4.3.0"
    assert fetch.newest_release(published, "4.1.9") == "4.1.3"
    assert fetch.newest_release(["3.5.9"], "4.3.0") is None
    assert fetch.newest_release(["4.1.0", "4.10.0"], "4.12.1") == "4.10.0"  # compared as numbers


def test_jars_pyspark_ships_are_recognised_by_artifact() -> None:
    assert fetch.artifact_of_jar_name("kafka-clients-3.9.2.jar") == "kafka-clients"
    assert fetch.artifact_of_jar_name("zstd-jni-1.5.7-7.jar") == "zstd-jni"
    assert fetch.artifact_of_jar_name("spark-tags_2.13-4.3.0.jar") == "spark-tags_2.13"
    assert fetch.artifact_of_jar_name("log4j-slf4j2-impl-2.25.4.jar") == "log4j-slf4j2-impl"


def test_only_a_missing_connector_leads_to_the_fallback() -> None:
    missing = ("[ERROR] Failed to execute goal on project x: Could not resolve dependencies for project x: "
               "Could not find artifact org.apache.spark:spark-sql-kafka-0-10_2.13:jar:4.3.0 in central")
    cached_miss = ("Could not resolve dependencies for project x: org.apache.spark:spark-sql-kafka-0-10_2.13:"
                   "jar:4.3.0 was not found in https://repo.maven.apache.org/maven2 during a previous attempt.")
    offline = ("Could not transfer artifact org.apache.spark:spark-sql-kafka-0-10_2.13:pom:4.3.0 from/to central: "
               "Unknown host repo.maven.apache.org")
    assert fetch._not_published(missing) and fetch._not_published(cached_miss)
    assert not fetch._not_published(offline)
