"""Group limits explain themselves: a refusal (GROUP_MAX_SIZE_REACHED, as in Kafka) names
the config and the fix, in the response's error message and in the tools' one line, and
the broker logs it once however often the client retries."""

from __future__ import annotations

import datetime
import uuid
from pathlib import Path

import pytest
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.schema.errors import ErrorCode
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from kio.static.primitive import i32, i32Timedelta

from tests.integration.test_tools import ok, tool
from tests.support.broker import BrokerProcess
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _warnings(b: BrokerProcess, config: str) -> list[str]:
    return [line for line in b.stderr_path.read_text().splitlines() if " WARNING " in line and config in line]


def _share_join(conn: RawConnection, group: str, n: int = 1) -> object:
    return conn.request(ShareGroupHeartbeatRequest(group_id=group, member_id=str(uuid.uuid4()), member_epoch=i32(0),
                                                   subscribed_topic_names=("limits",)), n)


def test_the_share_group_past_group_share_max_groups_is_refused_with_the_fix(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", {"group.share.max.groups": "1"}) as b:
        bs = b.bootstrap
        ok(bs, "topics", "--create", "--topic", "limits")
        ok(bs, "share-consume", "--topic", "limits", "--group", "first", "--timeout-ms", "1000")
        for _ in range(2):  # the client retrying: logged once
            r = tool(bs, "share-consume", "--topic", "limits", "--group", "second", "--timeout-ms", "1000")
            assert r.returncode == 1
            errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
            assert len(errors) == 1, r.stderr
            assert "group.share.max.groups" in errors[0] and "shoal share-groups --delete" in errors[0], r.stderr
            assert "KafkaError{" not in r.stderr and "%0|" not in r.stderr, r.stderr
        with RawConnection(bs) as conn:
            resp = _share_join(conn, "third")
        assert resp.error_code == ErrorCode.group_max_size_reached
        assert "group.share.max.groups=1" in resp.error_message and "--delete" in resp.error_message
        logged = _warnings(b, "group.share.max.groups")
        assert len(logged) == 2 and "second" in logged[0] and "third" in logged[1], logged


def test_the_member_past_group_share_max_size_is_refused_with_the_fix(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", {"group.share.max.size": "10"}) as b:
        ok(b.bootstrap, "topics", "--create", "--topic", "limits")
        with RawConnection(b.bootstrap) as conn:
            for n in range(10):
                assert _share_join(conn, "full", n).error_code == ErrorCode.none
            for n in range(3):
                resp = _share_join(conn, "full", 20 + n)
                assert resp.error_code == ErrorCode.group_max_size_reached
        assert "group.share.max.size=10" in resp.error_message, resp.error_message
        assert len(_warnings(b, "group.share.max.size")) == 1
        r = tool(b.bootstrap, "share-consume", "--topic", "limits", "--group", "full", "--timeout-ms", "1000")
        assert r.returncode == 1 and "group.share.max.size" in r.stderr and "KafkaError{" not in r.stderr, r.stderr


def test_the_member_past_group_consumer_max_size_is_refused_with_the_fix(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", {"group.consumer.max.size": "1"}) as b:
        ok(b.bootstrap, "topics", "--create", "--topic", "limits")
        with RawConnection(b.bootstrap) as conn:
            responses = [conn.request(ConsumerGroupHeartbeatRequest(
                group_id="small", member_id=str(uuid.uuid4()), member_epoch=i32(0), instance_id=None,
                rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                subscribed_topic_names=("limits",), subscribed_topic_regex=None, server_assignor=None,
                topic_partitions=()), n) for n in range(3)]
        assert [r.error_code for r in responses] == [ErrorCode.none] + [ErrorCode.group_max_size_reached] * 2
        assert "group.consumer.max.size=1" in responses[1].error_message, responses[1].error_message
        assert len(_warnings(b, "group.consumer.max.size")) == 1
        r = tool(b.bootstrap, "consume", "--topic", "limits", "--group", "small", "--timeout-ms", "3000",
                 "--consumer-property", "group.protocol=consumer")
        assert r.returncode == 1 and "group.consumer.max.size" in r.stderr and "KafkaError{" not in r.stderr, r.stderr
