"""Building kio entities of any version from one set of keyword arguments.

Response classes differ between versions of an API only by the fields they carry. A
handler written once for all versions calls ``make(cls, **fields)``: fields the class
lacks are dropped, required fields not given get their Kafka zero value (0, "", empty
array, ErrorCode.none, zero UUID, null where nullable), and milliseconds given as int
for a duration field become timedeltas. ``sub(cls, "Name")`` finds the nested class of
the same version (``MetadataResponseTopic`` next to ``MetadataResponse``). Pure.
"""

from __future__ import annotations

import datetime
import sys
import types
import typing
import uuid
from dataclasses import MISSING, fields
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode

__all__ = ["ZERO_UUID", "has_field", "make", "ms", "sub"]

ZERO_UUID = uuid.UUID(int=0)
_DURATION_TYPES = {"timedelta_i32", "timedelta_i64"}
_INT_TYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float64"}


def ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def _nullable(tp: Any) -> bool:
    return isinstance(tp, types.UnionType) and type(None) in typing.get_args(tp) or (
        typing.get_origin(tp) is typing.Union and type(None) in typing.get_args(tp)
    )


def _zero(kafka_type: str | None, tp: Any) -> Any:
    if _nullable(tp) and kafka_type not in ("string",):
        return None
    if kafka_type is None:
        if typing.get_origin(tp) is tuple:
            return ()
        return None
    if kafka_type in _INT_TYPES:
        return 0
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type == "string":
        return None if _nullable(tp) else ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return ZERO_UUID
    if kafka_type in _DURATION_TYPES:
        return datetime.timedelta(0)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(0, datetime.UTC)
    if typing.get_origin(tp) is tuple:
        return ()
    return None


@cache
def _plan(cls: type) -> tuple[frozenset[str], tuple[tuple[str, Any], ...], frozenset[str]]:
    names = []
    zeros = []
    durations = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        names.append(f.name)
        kt = f.metadata.get("kafka_type")
        if kt in _DURATION_TYPES:
            durations.append(f.name)
        if f.default is MISSING and f.default_factory is MISSING:
            zeros.append((f.name, _zero(kt, hints.get(f.name))))
    return frozenset(names), tuple(zeros), frozenset(durations)


def make(cls: type, /, **values: Any) -> Any:
    names, zeros, durations = _plan(cls)
    kw = {k: v for k, v in values.items() if k in names}
    for name, zero in zeros:
        if name not in kw:
            kw[name] = zero
    for name in durations:
        v = kw.get(name)
        if isinstance(v, int):
            kw[name] = datetime.timedelta(milliseconds=v)
    return cls(**kw)


def has_field(cls: type, name: str) -> bool:
    return name in _plan(cls)[0]


@cache
def sub(cls: type, name: str) -> type:
    """The class called ``name`` defined next to ``cls`` (same API, version, direction)."""
    return getattr(sys.modules[cls.__module__], name)
