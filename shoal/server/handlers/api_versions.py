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


TRANSACTION_VERSION = 2
"""The ``transaction.version`` feature level shoal supports and finalizes (KIP-890 part 2:
a client that sees 2 ends each transaction with EndTxn v5 and lets the partition leaders
and the group coordinator add the transaction's partitions)."""
FINALIZED_FEATURES_EPOCH = 1
"""Fixed: shoal's finalized features never change while it runs."""


@api(18, 0, 4)
def handle_api_versions(ctx: Any, request: Any) -> Any:
    """v3+ also carries the features (Kafka's supported and finalized levels): only
    ``transaction.version``, supported 0..2 and finalized at 2."""
    cls = ctx.response_type
    features: dict[str, Any] = {}
    if ctx.api_version >= 3:
        features = {
            "supported_features": (make(sub(cls, "SupportedFeatureKey"), name="transaction.version",
                                        min_version=0, max_version=TRANSACTION_VERSION),),
            "finalized_features_epoch": FINALIZED_FEATURES_EPOCH,
            "finalized_features": (make(sub(cls, "FinalizedFeatureKey"), name="transaction.version",
                                        min_version_level=TRANSACTION_VERSION,
                                        max_version_level=TRANSACTION_VERSION),),
        }
    return make(cls, error_code=ErrorCode.none, api_keys=_keys(ctx.broker, sub(cls, "ApiVersion")), throttle_time=0,
                **features)


def unsupported_version_response(broker: Any) -> Any:
    """The v0-format reply to an ApiVersions version we do not serve (KIP-511)."""
    return ApiVersionsResponseV0(error_code=ErrorCode.unsupported_version, api_keys=_keys(broker, ApiVersionV0))
