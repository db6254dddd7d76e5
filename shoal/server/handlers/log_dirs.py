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
from typing import Any

from ...errors import ErrorCode
from ...protocol.entities import has_field, make, sub
from ...security.authz import DESCRIBE, cluster_refusal
from ..dispatch import api


def _held(broker: Any) -> list[tuple[str, int]]:
    keys = [key for key, _ in broker.store.partitions()]
    if broker.replicas is None:
        return keys
    mine = set(broker.replicas.replicas)
    replicated = {name for name in (m.name for m in broker.store.topics())
                  if broker.cluster.partition(name, 0) is not None}
    return [k for k in keys if k in mine or k[0] not in replicated]


@api(35, 1, 4)
def handle_describe_log_dirs(ctx: Any, request: Any) -> Any:
    if (denied := cluster_refusal(ctx, DESCRIBE, results=())) is not None:
        return denied
    broker = ctx.broker
    cls = ctx.response_type
    rcls = sub(cls, "DescribeLogDirsResult")
    tcls = sub(cls, "DescribeLogDirsTopic")
    pcls = sub(cls, "DescribeLogDirsPartition")
    held = _held(broker)
    if request.topics is not None:
        wanted = {(t.topic, i) for t in request.topics for i in t.partitions}
        held = [k for k in held if k in wanted]
    by_topic: dict[str, list[Any]] = {}
    for topic, index in sorted(held):
        plog = broker.store.partition(topic, index)
        lag = broker.replicas.offset_lag(topic, index) if broker.replicas is not None else 0
        by_topic.setdefault(topic, []).append(
            make(pcls, partition_index=index, partition_size=plog.size_bytes, offset_lag=lag, is_future_key=False))
    data_dir = broker.store.data_dir.resolve()
    fields: dict[str, Any] = dict(error_code=ErrorCode.none, log_dir=str(data_dir),
                                  topics=tuple(make(tcls, name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
    if broker.replicas is not None and broker.replicas.dir_offline is not None:
        # an offline log directory (a write failed): named with the error and no partitions, as Kafka does
        fields.update(error_code=ErrorCode.kafka_storage_error, topics=())
    if has_field(rcls, "total_bytes"):
        usage = shutil.disk_usage(data_dir)
        fields.update(total_bytes=usage.total, usable_bytes=usage.free)
    result = make(rcls, **fields)
    top: dict[str, Any] = dict(throttle_time=0, results=(result,))
    if has_field(cls, "error_code"):
        top["error_code"] = ErrorCode.none
    return make(cls, **top)
