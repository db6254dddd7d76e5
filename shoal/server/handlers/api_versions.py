"""ApiVersions (key 18), v0-v4: the served table, straight from the dispatch table."""

from __future__ import annotations

from typing import Any

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0

from ...errors import ErrorCode
from ...protocol.entities import make, sub
from ..dispatch import api


def _keys(broker: Any, cls: type) -> tuple[Any, ...]:
    return tuple(
        cls(api_key=r.api_key, min_version=r.min_version, max_version=r.max_version)
        for r in sorted(broker.routes.values(), key=lambda r: r.api_key)
    )


@api(18, 0, 4)
def handle_api_versions(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    return make(cls, error_code=ErrorCode.none, api_keys=_keys(ctx.broker, sub(cls, "ApiVersion")), throttle_time=0)


def unsupported_version_response(broker: Any) -> Any:
    """The v0-format reply to an ApiVersions version we do not serve (KIP-511)."""
    return ApiVersionsResponseV0(error_code=ErrorCode.unsupported_version, api_keys=_keys(broker, ApiVersionV0))
