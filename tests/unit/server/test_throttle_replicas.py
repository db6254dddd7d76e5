"""Quotas never charge a follower's Fetch: ReplicaId up to v14, ReplicaState's from v15."""

from __future__ import annotations

import datetime
import importlib

import pytest
from kio.index import load_request_schema

from shoal.protocol.codec import codec_for
from shoal.security.quotas import REQUEST_PERCENTAGE, QuotaManager
from shoal.server.throttle import RequestQuota

LIMITS = {REQUEST_PERCENTAGE: (10.0, ("u", "c"))}


def fetch(version: int, replica: int) -> object:
    codec_for(1, version)  # as the broker loads it: the fields a version lacks read as defaults
    cls = load_request_schema(1, version)
    fields = {"max_wait": datetime.timedelta(milliseconds=500), "min_bytes": 1, "max_bytes": 1024,
              "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": (), "forgotten_topics_data": (),
              "rack_id": ""}
    if version >= 15:
        state_cls = vars(importlib.import_module(cls.__module__))["ReplicaState"]
        fields["replica_state"] = state_cls(replica_id=replica, replica_epoch=1)
    else:
        fields["replica_id"] = replica
    if version >= 12:
        fields["cluster_id"] = None
    return cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})


@pytest.mark.parametrize("version", [12, 14, 15, 17])
def test_a_followers_fetch_is_not_charged_and_a_consumers_is(version: int) -> None:
    manager = QuotaManager()
    follower = fetch(version, replica=2)
    consumer = fetch(version, replica=-1)
    assert RequestQuota.begin(manager, LIMITS, 1, b"", follower, 0)[0] is None
    assert RequestQuota.begin(manager, LIMITS, 1, b"", consumer, 0)[0] is not None
