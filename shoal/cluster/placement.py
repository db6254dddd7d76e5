"""Replica placement for new topics and partitions (pure).

Rack-unaware: partition ``p``'s first replica (its preferred leader) is broker
``(start + p) mod n`` of the sorted broker list, and its followers are the next brokers,
shifted by one more position every ``n`` partitions, so leaders and follower pairs both
spread evenly (the idea of Kafka's ``assignReplicasToBrokersRackUnaware``).

Rack-aware (every broker has a rack): the brokers are first interleaved by rack
(``r1-a, r2-a, r3-a, r1-b, ...``), then each partition takes its leader from that list in
turn and its followers walking forward, skipping a broker whose rack the partition
already has until every rack is used. Replicas of one partition therefore land on as
many racks as possible.
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.errors import ApiError, ErrorCode

__all__ = ["assign_replicas"]


def _rack_alternated(brokers: Mapping[int, str | None]) -> list[int]:
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers):
        by_rack.setdefault(str(brokers[b]), []).append(b)
    racks = sorted(by_rack)
    out: list[int] = []
    i = 0
    while len(out) < len(brokers):
        for rack in racks:
            if i < len(by_rack[rack]):
                out.append(by_rack[rack][i])
        i += 1
    return out


def assign_replicas(brokers: Mapping[int, str | None], num_partitions: int, replication_factor: int, *,
                    start: int = 0, first_partition: int = 0) -> list[list[int]]:
    """Replica lists for partitions ``first_partition .. first_partition + num_partitions - 1``.

    ``brokers`` maps each live broker id to its rack (None when unset). Raises
    ApiError(invalid_replication_factor) when there are fewer brokers than replicas,
    ApiError(invalid_partitions) for fewer than one partition.
    """
    if num_partitions < 1:
        raise ApiError(ErrorCode.invalid_partitions, "the number of partitions must be at least 1")
    n = len(brokers)
    if replication_factor < 1 or replication_factor > n:
        raise ApiError(ErrorCode.invalid_replication_factor,
                       f"replication factor {replication_factor} larger than available brokers: {n}")
    racked = n > 0 and all(r is not None for r in brokers.values())
    order = _rack_alternated(brokers) if racked else sorted(brokers)
    out: list[list[int]] = []
    for p in range(first_partition, first_partition + num_partitions):
        first = (start + p) % n
        if not racked:
            shift = 1 + (p // n) % max(1, n - 1) if n > 1 else 0
            replicas = [order[first]]
            for j in range(replication_factor - 1):
                replicas.append(order[(first + shift + j) % n])
            # the shift can wrap onto a broker already chosen when n is small: fill in order
            seen: list[int] = []
            for b in replicas:
                if b not in seen:
                    seen.append(b)
            k = first
            while len(seen) < replication_factor:
                k = (k + 1) % n
                if order[k] not in seen:
                    seen.append(order[k])
            out.append(seen)
            continue
        replicas = [order[first]]
        racks_used = {brokers[order[first]]}
        all_racks = set(brokers.values())
        k = first
        skipped: list[int] = []
        while len(replicas) < replication_factor:
            k = (k + 1) % n
            if k == first:  # walked all the way round: take the skipped ones
                for b in skipped:
                    if len(replicas) < replication_factor:
                        replicas.append(b)
                break
            b = order[k]
            if brokers[b] in racks_used and len(racks_used) < len(all_racks):
                skipped.append(b)
                continue
            replicas.append(b)
            racks_used.add(brokers[b])
            if len(racks_used) == len(all_racks):
                racks_used = set()
        out.append(replicas)
    return out
