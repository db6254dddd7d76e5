#!/usr/bin/env bash
# Set up everything the tests need in ./.venv and run the whole suite (unit, property,
# integration with real clients, Apache Kafka's Java clients and tools, Spark with shoal's data
# source and with Spark's own Kafka connector). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
if ! command -v kcat >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat) >/dev/null 2>&1 || true
    fi
fi
if ! command -v kcat >/dev/null 2>&1; then
    echo "warning: kcat could not be installed; its tests are skipped (SHOAL_SKIP_KCAT=1)" >&2
    export SHOAL_SKIP_KCAT=1
fi
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 || true
    fi
fi
if ! command -v chromium >/dev/null 2>&1; then
    echo "warning: chromium could not be installed; the queue view's browser test is skipped (SHOAL_SKIP_BROWSER=1)" >&2
    export SHOAL_SKIP_BROWSER=1
fi
# Apache Kafka's released jars (its broker, tools and Java clients) for tests/reference, and
# Spark's own Kafka connector (spark-sql-kafka-0-10 for the installed pyspark) for
# tests/spark/test_kafka_connector.py: fetched with Maven into ~/.m2 once, then cached. No
# Maven or no network is an error, not a skip.
if ! command -v mvn >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven openjdk-17-jdk-headless) >/dev/null 2>&1 || true
    fi
fi
bash reference/kafka/kit.sh fetch
.venv/bin/python reference/spark/fetch.py >/dev/null
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
# The typed message views are what kio's schemas give (shoal/protocol/messages is generated).
.venv/bin/python -m shoal.protocol.messages_gen --check
# The pure core and shoal/server type-check clean ([tool.mypy] in pyproject.toml lists them),
# and shoal lints clean ([tool.ruff]).
.venv/bin/python -m mypy
.venv/bin/python -m ruff check shoal
# Two workers (tests/conftest.py keeps Spark, the Kafka reference tests and each integration
# module on one worker each); the slowest tests are listed at the end.
exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=15 "$@"
