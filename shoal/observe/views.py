"""Read-only snapshots of the live broker state, for the metrics and the queue view.

Each function reads the objects the handlers change (share-partitions, group shards,
committed offsets, partition logs) and returns plain values (dicts, lists, ints), so
the same numbers go to the Prometheus collector and to the JSON API of the queue view.
Called on the event loop (from a scrape or an HTTP request), never concurrently with a
handler. Nothing here changes state.
"""

from __future__ import annotations

from typing import Any

from .metrics import DELIVERY_COUNT_BUCKETS

__all__ = [
    "consumer_group_lags",
    "consumer_group_views",
    "group_counts",
    "purgatory_sizes",
    "share_group_views",
    "share_partition_views",
]

_STATE_NAMES = {0: "available", 1: "acquired", 2: "acknowledged", 4: "archived"}


def _high_watermark(broker: Any, topic: str, partition: int) -> int | None:
    store = broker.store
    if store is None or store.get_topic(topic) is None:
        return None
    try:
        return int(store.partition(topic, partition).high_watermark)
    except Exception:  # the partition is not here (cluster mode: led elsewhere) or was just deleted
        return None


def _batch_timestamp(broker: Any, topic: str, partition: int, offset: int) -> int | None:
    """The first timestamp of the batch holding ``offset`` (None when it is not here)."""
    try:
        for header, _data in broker.store.partition(topic, partition).read_batches(offset):
            return int(header.base_timestamp)
    except Exception:  # led elsewhere, deleted, or unreadable: no age rather than no page
        return None
    return None


def share_partition_views(broker: Any, group_id: str | None = None) -> list[dict[str, Any]]:
    """One dict per loaded share-partition (of ``group_id``, or all), sorted by group, topic, partition.

    Keys: group, topic, partition, start_offset (SPSO), end_offset (SPEO), high_watermark,
    states ({available, acquired, acknowledged, archived: in-flight record counts}),
    not_fetched (records from SPEO to the high watermark, never delivered), lag (records
    not yet acknowledged or archived), ranges (in-flight state ranges), delivery_counts
    (histogram of the delivery counts of in-flight records that are not done, one count
    per bound of ``DELIVERY_COUNT_BUCKETS`` plus one above), delivery_count_sum,
    lock_timeouts (records whose acquisition lock timed out since the broker started),
    oldest_available_offset and oldest_available_age_ms (the first record a consumer
    would be given next, in flight or not yet fetched, and how old it is by its batch's
    first timestamp; None when there is none).
    """
    svc = broker.extensions.get("share")
    if svc is None or broker.store is None:
        return []
    metrics = getattr(broker, "metrics", None)
    timeouts = metrics.lock_timeouts if metrics is not None else {}
    now_ms = broker.clock.now_ms()
    out = []
    for (g, topic_id, partition), sp in list(svc.partitions.items()):
        if group_id is not None and g != group_id:
            continue
        meta = broker.store.topic_by_id(topic_id)
        if meta is None:
            continue
        states = {name: 0 for name in _STATE_NAMES.values()}
        hist = [0] * (len(DELIVERY_COUNT_BUCKETS) + 1)
        count_sum = 0
        ranges = sp.describe()
        oldest: int | None = None
        for first, last, state, delivery_count in ranges:
            n = last - first + 1
            name = _STATE_NAMES.get(int(state), "available")
            states[name] += n
            if name == "available" and oldest is None:
                oldest = first
            if name in ("available", "acquired"):
                i = 0
                while i < len(DELIVERY_COUNT_BUCKETS) and delivery_count > DELIVERY_COUNT_BUCKETS[i]:
                    i += 1
                hist[i] += n
                count_sum += delivery_count * n
        hw = _high_watermark(broker, meta.name, partition)
        end = int(sp.end_offset)
        start = int(sp.start_offset)
        high = max(hw if hw is not None else end, end)
        if oldest is None and high > end:
            oldest = end  # nothing available in flight: the first record never fetched
        ts = _batch_timestamp(broker, meta.name, int(partition), oldest) if oldest is not None else None
        out.append({
            "group": g,
            "topic": meta.name,
            "topic_id": str(topic_id),
            "partition": int(partition),
            "start_offset": start,
            "end_offset": end,
            "high_watermark": high,
            "states": states,
            "not_fetched": high - end,
            "lag": high - start - states["acknowledged"] - states["archived"],
            "ranges": len(ranges),
            "delivery_counts": hist,
            "delivery_count_sum": count_sum,
            "lock_timeouts": timeouts.get((g, meta.name, int(partition)), 0),
            "oldest_available_offset": oldest,
            "oldest_available_age_ms": max(0, now_ms - ts) if ts is not None and ts >= 0 else None,
        })
    out.sort(key=lambda v: (v["group"], v["topic"], v["partition"]))
    return out


def _group_kinds(broker: Any) -> list[tuple[Any, Any]]:
    gsvc = broker.extensions.get("groups")
    if gsvc is None:
        return []
    return list(gsvc.group_kinds())


def share_group_views(broker: Any) -> list[dict[str, Any]]:
    """Every share group: id, state, members (id, client, assignment), and its share-partitions."""
    partitions: dict[str, list[dict[str, Any]]] = {}
    for v in share_partition_views(broker):
        partitions.setdefault(v["group"], []).append(v)
    groups: dict[str, dict[str, Any]] = {}
    for _consumer, share in _group_kinds(broker):
        for group_id, g in share.groups.items():
            members = []
            for member_id, m in sorted(g.members.items()):
                assigned = []
                for topic_id, parts in sorted(m.assigned.items(), key=lambda kv: str(kv[0])):
                    name = g.topic_names.get(topic_id)
                    if name is None and broker.store is not None:
                        meta = broker.store.topic_by_id(topic_id)
                        name = meta.name if meta is not None else str(topic_id)
                    assigned.append({"topic": name, "partitions": sorted(int(p) for p in parts)})
                members.append({"member_id": member_id, "client_id": m.client_id, "client_host": m.client_host,
                                "member_epoch": m.member_epoch, "assignment": assigned})
            groups[group_id] = {"group": group_id, "state": g.state.value, "group_epoch": g.group_epoch,
                                "members": members, "partitions": partitions.pop(group_id, [])}
    for group_id, parts in partitions.items():  # loaded share-partitions of a group that is gone
        groups[group_id] = {"group": group_id, "state": "Dead", "group_epoch": -1, "members": [],
                            "partitions": parts}
    metrics = getattr(broker, "metrics", None)
    acquired: dict[str, int] = {}
    acknowledged: dict[str, dict[str, int]] = {}
    if metrics is not None:
        for (group_id, _topic), n in metrics.records_acquired.items():
            acquired[group_id] = acquired.get(group_id, 0) + n
        for (group_id, kind), n in metrics.record_acknowledgements.items():
            acknowledged.setdefault(group_id, {})[kind.lower()] = n
    for g in groups.values():
        g["lag"] = sum(p["lag"] for p in g["partitions"])
        g["lock_timeouts"] = sum(p["lock_timeouts"] for p in g["partitions"])
        g["records_acquired"] = acquired.get(g["group"], 0)
        acks = acknowledged.get(g["group"], {})
        g["records_acknowledged"] = {kind: acks.get(kind, 0) for kind in ("accept", "release", "reject")}
    return [groups[k] for k in sorted(groups)]


def consumer_group_views(broker: Any) -> list[dict[str, Any]]:
    """Every group with committed offsets: id, protocol, state, per-partition lag, total lag."""
    gsvc = broker.extensions.get("groups")
    if gsvc is None:
        return []
    out: dict[str, dict[str, Any]] = {}
    for shard in gsvc.runtime.shards:
        for group_id, topics in shard.offsets.offsets.items():
            g = shard.groups.get(group_id)
            view = out.setdefault(group_id, {
                "group": group_id,
                "protocol": getattr(g, "group_type", "classic") if g is not None else "classic",
                "state": getattr(g, "state_name", "Empty") if g is not None else "Empty",
                "partitions": [],
            })
            for topic, parts in topics.items():
                for partition, value in parts.items():
                    hw = _high_watermark(broker, topic, int(partition))
                    if hw is None:
                        continue
                    view["partitions"].append({"topic": topic, "partition": int(partition),
                                               "committed": int(value.offset), "high_watermark": hw,
                                               "lag": max(0, hw - int(value.offset))})
    for v in out.values():
        v["partitions"].sort(key=lambda p: (p["topic"], p["partition"]))
        v["lag"] = sum(p["lag"] for p in v["partitions"])
    return [out[k] for k in sorted(out)]


def consumer_group_lags(broker: Any) -> list[tuple[str, str, int, int]]:
    """(group, topic, partition, lag) of every committed offset of a partition this broker has."""
    return [(v["group"], p["topic"], p["partition"], p["lag"])
            for v in consumer_group_views(broker) for p in v["partitions"]]


def group_counts(broker: Any) -> dict[tuple[str, str], int]:
    """(protocol, state) -> number of groups, over every group the coordinator holds."""
    gsvc = broker.extensions.get("groups")
    counts: dict[tuple[str, str], int] = {}
    if gsvc is None:
        return counts
    for shard in gsvc.runtime.shards:
        for g in shard.groups.values():
            key = (str(getattr(g, "group_type", "classic")), str(getattr(g, "state_name", "")))
            counts[key] = counts.get(key, 0) + 1
    return counts


def purgatory_sizes(broker: Any) -> dict[str, int]:
    """Parked requests: "Produce" (waiting for an fsync) and "Fetch" (Fetch and ShareFetch long polls)."""
    return {"Produce": broker.flusher.waiting(), "Fetch": broker.append_waiters.parked()}
