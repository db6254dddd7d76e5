"""The typed views of ``shoal.protocol.messages`` at run time.

A request is decoded into kio's class of the version received and handed to its handler
as it is; the handler is typed with the request's view (a ``Protocol`` with the fields of
every version). ``fill_absent`` makes that true at run time: once per version it gives
kio's classes the fields they lack, as class attributes holding the field's default, so
``request.isolation_level`` of a Fetch v3 reads 0 without a copy or a getattr.

A handler answers with the response's view (a dataclass with the fields of every version,
each defaulted, durations in milliseconds); ``to_entity`` turns it into kio's class of
the request's version when it is encoded. The conversion of each (view, version) pair is
compiled once into a function that builds the entity field by field: fields the version
does not have are left out, nested entities converted the same way.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import typing
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema

from .messages import MODULES

__all__ = ["fill_absent", "is_entity", "schema_versions", "to_entity"]

MAX_VERSION = 40
"""Above any API version kio has."""


def schema_versions(api_key: int, load: Callable[[int, int], type]) -> list[type]:
    """kio's classes of every version of an API, oldest first (``load``: kio's
    ``load_request_schema`` or ``load_response_schema``)."""
    found = []
    for v in range(MAX_VERSION):
        try:
            found.append(load(api_key, v))
        except (UnknownAPIKey, UnknownEntity):
            continue
    return found


def is_entity(tp: Any) -> bool:
    """Whether ``tp`` is a kio entity class (or a view's dataclass)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _nested(tp: Any) -> tuple[type | None, bool]:
    """The entity class a field holds, and whether it holds a tuple of them."""
    if is_entity(tp):
        return tp, False
    origin = typing.get_origin(tp)
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        if is_entity(inner):
            return inner, True
        return None, False
    for a in typing.get_args(tp):
        cls, many = _nested(a)
        if cls is not None:
            return cls, many
    return None, False


def _entities(cls: type, seen: dict[str, type]) -> dict[str, type]:
    seen[cls.__name__] = cls
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner, _ = _nested(hints[f.name])
        if inner is not None and inner.__name__ not in seen:
            _entities(inner, seen)
    return seen


@cache
def fill_absent(request_type: type) -> None:
    """Give ``request_type`` and its nested classes every field of the request's view."""
    api_key = int(request_type.__api_key__)  # type: ignore[attr-defined]
    stem = MODULES.get(api_key)
    if stem is None:
        return
    defaults: dict[str, dict[str, object]] = importlib.import_module(f"{__package__}.messages.{stem}_request").DEFAULTS
    for name, cls in _entities(request_type, {}).items():
        have = {f.name for f in dataclasses.fields(cls)}
        for field, value in defaults.get(name, {}).items():
            if field not in have:
                setattr(cls, field, _entity_default(api_key, name, field) if value is ... else value)


def _entity_default(api_key: int, owner: str, field: str) -> object:
    """A nested entity's default (``...`` in DEFAULTS): kio's, from a version that has the field."""
    for cls in reversed(schema_versions(api_key, load_request_schema)):
        entity = _entities(cls, {}).get(owner)
        if entity is None:
            continue
        for f in dataclasses.fields(entity):
            if f.name == field:
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
                inner, _ = _nested(typing.get_type_hints(entity)[field])
                if inner is not None:
                    return inner()
    raise LookupError(f"no default for {owner}.{field} of API {api_key}")


def _ms(value: int | datetime.timedelta) -> datetime.timedelta:
    return value if type(value) is datetime.timedelta else datetime.timedelta(milliseconds=value)  # type: ignore[arg-type]


@cache
def _converter(kio_type: type) -> Callable[[Any], Any]:
    hints = typing.get_type_hints(kio_type)
    env: dict[str, Any] = {"K": kio_type, "_ms": _ms}
    args = []
    for i, f in enumerate(dataclasses.fields(kio_type)):
        inner, many = _nested(hints[f.name])
        kafka_type = f.metadata.get("kafka_type", "")
        if inner is not None:
            env[f"c{i}"] = _converter(inner)
            if many and type(None) in typing.get_args(hints[f.name]):  # a nullable array
                args.append(f"{f.name}=(None if v.{f.name} is None else tuple([c{i}(x) for x in v.{f.name}]))")
            elif many:
                args.append(f"{f.name}=tuple([c{i}(x) for x in v.{f.name}])")
            else:
                args.append(f"{f.name}=(None if v.{f.name} is None else c{i}(v.{f.name}))")
        elif kafka_type.startswith("timedelta"):
            args.append(f"{f.name}=_ms(v.{f.name})")
        else:
            args.append(f"{f.name}=v.{f.name}")
    source = (f"def convert(v):\n"
              f"    if type(v) is K:\n"
              f"        return v\n"
              f"    return K({', '.join(args)})\n")
    # The source is built above from kio's field names only: no outside input reaches it.
    exec(compile(source, f"<view to {kio_type.__module__}.{kio_type.__name__}>", "exec"), env)  # noqa: S102
    fn: Callable[[Any], Any] = env["convert"]
    return fn


def to_entity(view: Any, kio_type: type) -> Any:
    """``view`` (a response view, or already a ``kio_type``) as an entity of ``kio_type``."""
    return _converter(kio_type)(view)

