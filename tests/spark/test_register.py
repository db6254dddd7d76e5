"""``shoal.spark.register`` makes Spark's Python workers run this interpreter unless told otherwise."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

import shoal.spark


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Sources:
    def __init__(self) -> None:
        self.registered: list[type] = []

    def register(self, cls: type) -> None:
        self.registered.append(cls)


class _Context:
    def __init__(self, python_exec: str) -> None:
        self.pythonExec = python_exec


class _Session:
    """The parts of a SparkSession that register() touches; pythonExec is what a fresh
    SparkContext takes from PYSPARK_PYTHON, or ``python3`` when it is unset."""

    def __init__(self, conf: dict[str, str] | None = None, python_exec: str = "python3") -> None:
        self.conf = _Conf(conf or {})
        self.dataSource = _Sources()
        self.sparkContext = _Context(python_exec)


def test_workers_run_this_interpreter_when_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    s = _Session()
    shoal.spark.register(s)
    assert s.sparkContext.pythonExec == sys.executable
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert [c.__name__ for c in s.dataSource.registered] == ["ShoalDataSource"]
    assert s.conf.values["spark.sql.python.filterPushdown.enabled"] == "true"


def test_an_explicit_choice_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python/bin/python3")
    s = _Session(python_exec="/opt/python/bin/python3")
    shoal.spark.register(s)
    assert s.sparkContext.pythonExec == "/opt/python/bin/python3"

    monkeypatch.delenv("PYSPARK_PYTHON")
    s = _Session({"spark.pyspark.python": "/opt/other/python"})
    shoal.spark.register(s)
    assert s.sparkContext.pythonExec == "/opt/other/python"
