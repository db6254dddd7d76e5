"""The typed message views: a request read through its view, an answer built as one."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4.request import FetchPartition as FetchPartitionV4
from kio.schema.fetch.v4.request import FetchRequest as FetchV4
from kio.schema.fetch.v4.request import FetchTopic as FetchTopicV4
from kio.schema.produce.v3.response import ProduceResponse as ProduceV3
from kio.schema.produce.v12.response import LeaderIdAndEpoch as LeaderV12
from kio.schema.produce.v12.response import ProduceResponse as ProduceV12

from shoal.protocol import messages_gen
from shoal.protocol.codec import codec_for, decode_body, encode_body
from shoal.protocol.messages.fetch_request import FetchRequest
from shoal.protocol.messages.produce_response import (
    LeaderIdAndEpoch,
    PartitionProduceResponse,
    ProduceResponse,
    TopicProduceResponse,
)
from shoal.protocol.views import to_entity


def test_the_generated_views_are_current() -> None:
    assert messages_gen.main(["--check"]) == 0


def test_a_field_the_version_lacks_reads_as_its_default() -> None:
    codec_for(1, 4)  # the codec of a version fills in its classes' absent fields
    req = FetchV4(replica_id=-1, max_wait=datetime.timedelta(milliseconds=500), min_bytes=1,
                  max_bytes=1024, isolation_level=1, topics=(FetchTopicV4(topic="t", partitions=(
                      FetchPartitionV4(partition=0, fetch_offset=7, partition_max_bytes=100),)),))
    view: FetchRequest = req
    assert view.isolation_level == 1
    assert view.session_id == 0 and view.session_epoch == -1  # version 7 and later: kio's defaults
    assert view.forgotten_topics_data == ()
    assert view.topics[0].partitions[0].current_leader_epoch == -1  # version 9 and later
    assert view.topics[0].topic_id is None  # version 13 and later
    assert view.replica_state.replica_epoch == -1  # a nested entity of version 15 and later
    assert view.topics[0].partitions[0].fetch_offset == 7


def _answer() -> ProduceResponse:
    return ProduceResponse(throttle_time=25, responses=(TopicProduceResponse(name="t", partition_responses=(
        PartitionProduceResponse(index=2, error_code=ErrorCode.not_leader_or_follower, base_offset=-1,
                                 current_leader=LeaderIdAndEpoch(leader_id=3, leader_epoch=9)),)),))


def test_an_answer_becomes_the_versions_entity_without_the_fields_it_lacks() -> None:
    old = to_entity(_answer(), ProduceV3)
    assert type(old) is ProduceV3
    assert old.throttle_time == datetime.timedelta(milliseconds=25)
    p = old.responses[0].partition_responses[0]
    assert (p.index, p.error_code, p.base_offset) == (2, ErrorCode.not_leader_or_follower, -1)
    assert not hasattr(type(p), "current_leader")  # version 10 and later
    assert decode_body(ProduceV3, encode_body(old)) == old

    new = to_entity(_answer(), ProduceV12)
    assert new.responses[0].partition_responses[0].current_leader == LeaderV12(leader_id=3, leader_epoch=9)
    assert decode_body(ProduceV12, encode_body(new)) == new


def test_an_entity_of_the_version_passes_as_it_is() -> None:
    entity = to_entity(_answer(), ProduceV12)
    assert to_entity(entity, ProduceV12) is entity


def test_a_null_array_of_entities_stays_null() -> None:
    from kio.schema.fetch.v4.response import FetchResponse as FetchResponseV4

    from shoal.protocol.messages.fetch_response import (
        AbortedTransaction,
        FetchableTopicResponse,
        FetchResponse,
        PartitionData,
    )

    def answer(aborted: tuple[AbortedTransaction, ...] | None) -> FetchResponse:
        return FetchResponse(responses=(FetchableTopicResponse(topic="t", partitions=(
            PartitionData(partition_index=0, records=b"", aborted_transactions=aborted),)),))

    (p,) = to_entity(answer(None), FetchResponseV4).responses[0].partitions
    assert p.aborted_transactions is None  # read_uncommitted: null, not an empty array
    (p,) = to_entity(answer((AbortedTransaction(producer_id=7, first_offset=3),)), FetchResponseV4).responses[0].partitions
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(7, 3)]


def test_a_null_array_stays_null() -> None:
    from kio.schema.describe_client_quotas.v0.response import DescribeClientQuotasResponse as QuotasV0
    from kio.schema.describe_client_quotas.v1.response import DescribeClientQuotasResponse as QuotasV1

    from shoal.protocol.messages.describe_client_quotas_response import DescribeClientQuotasResponse

    refused = DescribeClientQuotasResponse(error_code=ErrorCode.invalid_request, error_message="bad filter")
    assert refused.entries is None  # a nullable array: null when the request was refused
    for cls in (QuotasV0, QuotasV1):
        entity = to_entity(refused, cls)
        assert type(entity) is cls and entity.entries is None
        assert decode_body(cls, encode_body(entity)) == entity
