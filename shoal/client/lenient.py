"""Response types that read a field more leniently than kio does.

kio reads a ``datetime_i64`` field (a timestamp in milliseconds) into an aware datetime
and refuses a negative value, but Kafka sends -1 for "none" in some of them:
DescribeTransactions' ``TransactionStartTimeMs`` of a transactional id with no
transaction open. :func:`lenient_response` builds a copy of a kio response entity whose
named fields are read as plain ``int64`` milliseconds instead, so a tool can decode what
a broker (shoal or Kafka) sends and decide itself what -1 means. Only for reading: the
copies are not registered anywhere and are never written.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from kio.static.primitive import i64

from ..protocol.codec import codec_for

__all__ = ["LENIENT_TIMESTAMPS", "lenient_response"]

_CLASS_ATTRS = ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__")

LENIENT_TIMESTAMPS: dict[int, frozenset[str]] = {65: frozenset({"transaction_start_time"})}
"""API key -> names of ``datetime_i64`` fields read as int64 milliseconds (DescribeTransactions)."""


def _entity_of(annotation: Any) -> type | None:
    """The entity class of a ``tuple[Entity, ...]`` or ``Entity`` field, else None."""
    args = typing.get_args(annotation)
    candidate = args[0] if typing.get_origin(annotation) is tuple and args else annotation
    return candidate if dataclasses.is_dataclass(candidate) else None


def _copy(cls: type, names: frozenset[str]) -> tuple[type, bool]:
    fields: list[tuple[str, Any, Any]] = []
    changed = False
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        ftype, meta = f.type, dict(f.metadata)
        nested = _entity_of(ftype)
        if f.name in names and meta.get("kafka_type") == "datetime_i64":
            ftype, meta, changed = i64, {**meta, "kafka_type": "int64"}, True
        elif nested is not None:
            copy, nested_changed = _copy(nested, names)
            if nested_changed:
                ftype = tuple[copy, ...] if typing.get_origin(f.type) is tuple else copy  # type: ignore[valid-type]
                changed = True
        fields.append((f.name, ftype, dataclasses.field(metadata=meta)))
    if not changed:
        return cls, False
    namespace = {k: getattr(cls, k) for k in _CLASS_ATTRS if hasattr(cls, k)}
    return dataclasses.make_dataclass(cls.__name__, fields, frozen=True, slots=True, namespace=namespace), True


@functools.cache
def lenient_response(api_key: int, version: int) -> type:
    """The response entity of ``api_key`` v``version``, with the fields named in
    :data:`LENIENT_TIMESTAMPS` read as int64 milliseconds (-1 stays -1)."""
    codec = codec_for(api_key, version)
    if codec is None:
        raise ValueError(f"kio has no API {api_key} v{version}")
    return _copy(codec.response_type, LENIENT_TIMESTAMPS.get(api_key, frozenset()))[0]
