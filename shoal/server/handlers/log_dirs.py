"""DescribeLogDirs (35), v1-v4: this broker's one log directory and the partitions in it.

Each broker answers for its own data directory (admin clients ask every broker). The
partitions listed are the ones this broker holds: every partition on one broker; in
cluster mode the partitions it is a replica of (every broker keeps an empty log for the
others, which is not listed) and the topics only it has (``__share_group_state``).
Per partition: the size of its segments, and the offset lag: 0 on a leader, on a
follower the leader's high watermark (from its last Fetch answer) minus its log end
offset. ``total_bytes``/``usable_bytes`` are the volume's size and free space. In
cluster mode a log directory taken offline by a failed write is answered with
KAFKA_STORAGE_ERROR and no partitions.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from ...errors import ErrorCode
from ...protocol.messages.describe_log_dirs_request import DescribeLogDirsRequest
from ...protocol.messages.describe_log_dirs_response import (
    DescribeLogDirsPartition,
    DescribeLogDirsResponse,
    DescribeLogDirsResult,
    DescribeLogDirsTopic,
)
from ...security.authz import CLUSTER, CLUSTER_RESOURCE, DESCRIBE, allowed
from ..context import RequestContext
from ..dispatch import api
from .metadata import log_store

if TYPE_CHECKING:
    from ..broker import Broker


def _held(broker: Broker) -> list[tuple[str, int]]:
    keys = [key for key, _ in log_store(broker).partitions()]
    if broker.replicas is None:
        return keys
    mine = set(broker.replicas.replicas)
    replicated = {name for name in (m.name for m in log_store(broker).topics())
                  if broker.cluster.partition(name, 0) is not None}
    return [k for k in keys if k in mine or k[0] not in replicated]


@api(35, 1, 4)
def handle_describe_log_dirs(ctx: RequestContext, request: DescribeLogDirsRequest) -> DescribeLogDirsResponse:
    broker = ctx.broker
    if broker.authorizer is not None and not allowed(ctx, DESCRIBE, CLUSTER, CLUSTER_RESOURCE):
        # v1-v2 have no error code: their refusal is an empty result list
        return DescribeLogDirsResponse(throttle_time=0, error_code=ErrorCode.cluster_authorization_failed)
    store = log_store(broker)
    held = _held(broker)
    if request.topics is not None:
        wanted = {(t.topic, i) for t in request.topics for i in t.partitions}
        held = [k for k in held if k in wanted]
    by_topic: dict[str, list[DescribeLogDirsPartition]] = {}
    for topic, index in sorted(held):
        plog = store.partition(topic, index)
        lag: int = broker.replicas.offset_lag(topic, index) if broker.replicas is not None else 0
        by_topic.setdefault(topic, []).append(DescribeLogDirsPartition(
            partition_index=index, partition_size=plog.size_bytes, offset_lag=lag, is_future_key=False))
    data_dir = store.data_dir.resolve()
    code, topics = ErrorCode.none, tuple(DescribeLogDirsTopic(name=t, partitions=tuple(ps))
                                         for t, ps in by_topic.items())
    if broker.replicas is not None and broker.replicas.dir_offline is not None:
        # an offline log directory (a write failed): named with the error and no partitions, as Kafka does
        code, topics = ErrorCode.kafka_storage_error, ()
    total = usable = -1
    if ctx.api_version >= 4:  # the volume's size and free space: fields of v4 on
        usage = shutil.disk_usage(data_dir)
        total, usable = usage.total, usage.free
    result = DescribeLogDirsResult(error_code=code, log_dir=str(data_dir), topics=topics,
                                   total_bytes=total, usable_bytes=usable)
    return DescribeLogDirsResponse(throttle_time=0, results=(result,), error_code=ErrorCode.none)
