"""In cluster mode the transaction coordinator is not served, and its APIs are not
advertised: ApiVersions answers from the broker's routes, which leave them out."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from shoal.server.dispatch import routes
from shoal.server.txn_service import TRANSACTION_APIS, _start


def _broker(store: str) -> SimpleNamespace:
    return SimpleNamespace(config={"metadata.store": store}, routes=routes(), extensions={})


def test_cluster_mode_leaves_the_transaction_apis_out_of_the_routes():
    b = _broker("etcd://127.0.0.1:2379")
    asyncio.run(_start(b))
    assert "transactions" not in b.extensions
    assert not TRANSACTION_APIS & set(b.routes)
    assert {0, 1, 22, 61} <= set(b.routes)  # Produce, Fetch, InitProducerId (idempotence), DescribeProducers
    assert TRANSACTION_APIS <= set(routes())  # the dispatch table itself is unchanged
