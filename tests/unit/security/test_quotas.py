"""Client quotas: Kafka's precedence, checks, filters, sampled rate and throttle time (pure)."""

from __future__ import annotations

import datetime

import pytest

from shoal.protocol.codec import EncodedBody, codec_for, decode_body
from shoal.protocol.produce_response import write_produce_response
from shoal.security.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    QuotaManager,
    QuotaRequestError,
    Rate,
    describe,
    entity_of,
    resolve,
    validate_alteration,
)
from shoal.server.throttle import with_throttle

D = None  # the default name


def ent(**names: str | None) -> tuple:
    return entity_of((USER if k == "user" else CLIENT_ID, v) for k, v in names.items())


def test_precedence_is_kafkas_eight_levels_per_key() -> None:
    levels = [
        (ent(user="alice", client="app"), ("alice", "app")),
        (ent(user="alice", client=D), ("alice", "app")),
        (ent(user="alice"), ("alice", "")),
        (ent(user=D, client="app"), ("alice", "app")),
        (ent(user=D, client=D), ("alice", "app")),
        (ent(user=D), ("alice", "")),
        (ent(client="app"), ("", "app")),
        (ent(client=D), ("", "app")),
    ]
    quotas = {e: {PRODUCER_BYTE_RATE: float(i + 1)} for i, (e, _) in enumerate(levels)}
    for i, (entity, tags) in enumerate(levels):
        assert resolve(quotas, "alice", "app", PRODUCER_BYTE_RATE) == (float(i + 1), tags)
        del quotas[entity]
    assert resolve(quotas, "alice", "app", PRODUCER_BYTE_RATE) is None
    # each key on its own: a user quota on one key does not hide a client-id quota on another
    quotas = {ent(user="alice"): {PRODUCER_BYTE_RATE: 5.0}, ent(client="app"): {CONSUMER_BYTE_RATE: 7.0}}
    assert resolve(quotas, "alice", "app", CONSUMER_BYTE_RATE) == (7.0, ("", "app"))
    assert resolve(quotas, "bob", "app", PRODUCER_BYTE_RATE) is None


def test_alterations_refused_as_kafka_refuses_them() -> None:
    def code(fn, *a) -> str:
        with pytest.raises(QuotaRequestError) as e:
            fn(*a)
        return f"{e.value.code}: {e.value.message}"

    assert "duplicate entity entry user" in code(entity_of, [(USER, "a"), (USER, "b")])
    assert code(entity_of, [("topic", "t")]) == "invalid_request: Unhandled client quota entity type: topic"
    assert code(entity_of, [(USER, "")]) == "invalid_request: Empty user not supported"
    assert code(entity_of, []) == "invalid_request: Invalid empty client quota entity"
    assert code(validate_alteration, [("bogus", 1.0, False)]) == "invalid_request: Invalid configuration key bogus"
    assert code(validate_alteration, [(PRODUCER_BYTE_RATE, 0.0, False)]).endswith("must be greater than 0")
    assert code(validate_alteration, [(PRODUCER_BYTE_RATE, -5.0, False)]).endswith("must be greater than 0")
    assert "fractional" in code(validate_alteration, [(CONSUMER_BYTE_RATE, 1.5, False)])
    assert validate_alteration([(REQUEST_PERCENTAGE, 12.5, False), (PRODUCER_BYTE_RATE, 0.0, True)]) == {
        REQUEST_PERCENTAGE: 12.5, PRODUCER_BYTE_RATE: None}
    assert ent(client="x", user="u") == (("client-id", "x"), ("user", "u"))


def test_describe_filters_match_kafkas_image() -> None:
    quotas = {ent(user="alice"): {PRODUCER_BYTE_RATE: 1.0}, ent(user=D): {PRODUCER_BYTE_RATE: 2.0},
              ent(user="alice", client="app"): {CONSUMER_BYTE_RATE: 3.0}, ent(client="app"): {REQUEST_PERCENTAGE: 4.0}}

    def names(components, strict=False) -> list:
        return [e for e, _ in describe(quotas, components, strict)]

    assert names([]) == sorted(quotas, key=lambda e: [(t, n is not None, n or "") for t, n in e])
    assert names([(USER, 0, "alice")]) == [ent(user="alice", client="app"), ent(user="alice")]
    assert names([(USER, 0, "alice")], strict=True) == [ent(user="alice")]
    assert names([(USER, 1, None)]) == [ent(user=D)]
    assert names([(USER, 2, None)], strict=True) == [ent(user=D), ent(user="alice")]
    assert set(names([(CLIENT_ID, 2, None)])) == {ent(user="alice", client="app"), ent(client="app")}
    for bad, message in [([(USER, 0, None)], "MATCH_TYPE_EXACT, but set match string to null"),
                         ([(USER, 1, "x")], "MATCH_TYPE_DEFAULT, but also specified"),
                         ([(USER, 2, None), (USER, 0, "x")], "cannot appear more than once"),
                         ([("", 2, None)], "Invalid empty entity type"),
                         ([("ip", 2, None), (USER, 2, None)], "IP filter component should not be used")]:
        with pytest.raises(QuotaRequestError, match=message) as e:
            describe(quotas, bad, False)
        assert e.value.code == "invalid_request"
    with pytest.raises(QuotaRequestError) as e:
        describe(quotas, [("topic", 2, None)], False)
    assert e.value.code == "unsupported_version"


def test_rate_counts_at_least_ten_windows_and_forgets_old_samples() -> None:
    r = Rate(11, 1000)
    r.record(20_000, 0)
    assert r.window_size_ms(0) == 10_000 and r.rate(0) == 2000
    r.record(10_000, 5_500)
    assert r.window_size_ms(5_500) == 10_500 and r.rate(5_500) == 30_000 / 10.5  # 5.5 s + 5 padding windows
    assert r.total(11_000) == 10_000  # the first sample is older than all eleven windows: forgotten
    for t in range(6_500, 16_500, 1000):
        r.record(1000, t)
    assert r.window_size_ms(16_000) == 10_500  # eleven samples, the oldest from 5.5 s
    assert r.rate(16_000) == 20_000 / 10.5


def test_throttle_time_is_kafkas_formula() -> None:
    m = QuotaManager(11, 1000)
    tags = ("", "app")
    assert m.record(PRODUCER_BYTE_RATE, 1000.0, tags, 10_000, 0) == 0  # 1000 B/s: at the quota
    # 15000 bytes over the ten windows: 1500 B/s, half above the quota -> half of the 10 s window
    assert m.record(PRODUCER_BYTE_RATE, 1000.0, tags, 5_000, 0) == 5_000
    m.unrecord(PRODUCER_BYTE_RATE, tags, 5_000, 0)
    assert m.measured(PRODUCER_BYTE_RATE, tags, 0) == 1000.0
    assert m.max_in_window(1000.0) == 10_000.0


@pytest.mark.parametrize(("quota", "size"), [(1_000_000.0, 16384), (1_000_000.0, 65536), (1_000_000.0, 262144),
                                             (250_000.0, 16384)])
def test_a_client_honouring_throttle_times_gets_its_quota(quota: float, size: int) -> None:
    """A producer sending requests of ``size`` bytes as fast as it may, waiting out each
    throttle time, moves the quota's worth of bytes over 30 s within 20%. (As in Kafka, a
    client may send the quota's worth of the ten padded windows at once when its rate is
    measured afresh, so it runs ahead by up to about a tenth.)"""
    m = QuotaManager(11, 1000)
    now, sent = 0, 0
    while now < 30_000:
        sent += size
        now += max(m.record(PRODUCER_BYTE_RATE, quota, ("", "app"), size, now), 2)
    assert 1.0 <= sent / 30 / quota < 1.2


@pytest.mark.parametrize("version", range(3, 12))
def test_throttle_time_written_into_a_produce_answer_encoded_without_kio(version: int) -> None:
    body = write_produce_response(version, [("t", [(0, 0, 5, -1, 0, None, [])])])
    patched = with_throttle(0, version, EncodedBody(body), 1234)
    decoded = decode_body(codec_for(0, version).response_type, patched.body)
    assert decoded.throttle_time == datetime.timedelta(milliseconds=1234)
    assert decoded.responses[0].partition_responses[0].base_offset == 5
