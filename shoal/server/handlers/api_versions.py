"""ApiVersions (key 18), v0-v4: the served table, straight from the dispatch table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ErrorCode
from ...protocol.messages.api_versions_request import ApiVersionsRequest
from ...protocol.messages.api_versions_response import (
    ApiVersion,
    ApiVersionsResponse,
    FinalizedFeatureKey,
    SupportedFeatureKey,
)
from ..context import RequestContext
from ..dispatch import api

if TYPE_CHECKING:
    from ..broker import Broker


def _keys(broker: Broker) -> tuple[ApiVersion, ...]:
    return tuple(
        ApiVersion(api_key=r.api_key, min_version=r.min_version, max_version=r.max_version)
        for r in sorted(broker.routes.values(), key=lambda r: r.api_key)
    )


TRANSACTION_VERSION = 2
"""The ``transaction.version`` feature level shoal supports and finalizes (KIP-890 part 2:
a client that sees 2 ends each transaction with EndTxn v5 and lets the partition leaders
and the group coordinator add the transaction's partitions)."""
FINALIZED_FEATURES_EPOCH = 1
"""Fixed: shoal's finalized features never change while it runs."""

_SUPPORTED = (SupportedFeatureKey(name="transaction.version", min_version=0, max_version=TRANSACTION_VERSION),)
_FINALIZED = (FinalizedFeatureKey(name="transaction.version", min_version_level=TRANSACTION_VERSION,
                                  max_version_level=TRANSACTION_VERSION),)


@api(18, 0, 4)
def handle_api_versions(ctx: RequestContext, request: ApiVersionsRequest) -> ApiVersionsResponse:
    """v3+ also carries the features (Kafka's supported and finalized levels): only
    ``transaction.version``, supported 0..2 and finalized at 2 (v0-v2 have no such fields:
    the conversion to the request's version leaves them out)."""
    return ApiVersionsResponse(error_code=ErrorCode.none, api_keys=_keys(ctx.broker), throttle_time=0,
                               supported_features=_SUPPORTED, finalized_features_epoch=FINALIZED_FEATURES_EPOCH,
                               finalized_features=_FINALIZED)


def unsupported_version_response(broker: Broker) -> ApiVersionsResponse:
    """The v0-format reply to an ApiVersions version we do not serve (KIP-511)."""
    return ApiVersionsResponse(error_code=ErrorCode.unsupported_version, api_keys=_keys(broker))
