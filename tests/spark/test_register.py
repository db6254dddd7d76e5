"""``shoal.spark.register`` makes Spark's Python workers run this interpreter unless told otherwise."""

from __future__ import annotations

import json
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


class _Streams:
    def __init__(self) -> None:
        self.listeners: list[Any] = []

    def addListener(self, listener: Any) -> None:  # noqa: N802 - pyspark's name
        self.listeners.append(listener)


def test_the_commit_listener_is_added_once_per_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from shoal.spark.share import _committed_marker, _read_committed

    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    s = _Session(python_exec=sys.executable)
    s.streams = _Streams()  # type: ignore[attr-defined]
    shoal.spark.register(s)
    shoal.spark.register(s)
    assert [type(x).__name__ for x in s.streams.listeners] == ["CommitListener"]  # type: ignore[attr-defined]

    # a progress event carrying the share source's end offset notes that batch as committed
    offset = {"batch": 3, "reader": "r1", "group": "g", "stateDir": str(tmp_path)}

    class _Source:
        endOffset = json.dumps(offset)

    class _Progress:
        sources = [_Source(), type("Other", (), {"endOffset": '{"t": {"0": 5}}'})()]

    class _Event:
        progress = _Progress()

    listener = s.streams.listeners[0]  # type: ignore[attr-defined]
    listener.onQueryProgress(_Event())
    assert _read_committed(_committed_marker(str(tmp_path), "g", "r1")) == 3
    offset["batch"] = 2  # an older batch never moves the note back
    _Source.endOffset = json.dumps(offset)
    listener.onQueryProgress(_Event())
    assert _read_committed(_committed_marker(str(tmp_path), "g", "r1")) == 3
