"""The Produce error for a partition the transaction coordinator did not verify (KIP-890),
per Produce version, as Kafka's ReplicaManager and AddPartitionsToTxnManager map them."""

from __future__ import annotations

import pytest

from shoal.errors import ErrorCode
from shoal.server.txn_service import verification_error


def code(c: ErrorCode, version: int) -> ErrorCode | None:
    e = verification_error(c, version)
    return None if e is None else e.error_code


def test_a_verified_partition_is_appended() -> None:
    assert verification_error(ErrorCode.none, 9) is None


@pytest.mark.parametrize("version", [3, 9, 10])
def test_older_produce_versions_get_invalid_txn_state(version: int) -> None:
    assert code(ErrorCode.transaction_abortable, version) == ErrorCode.invalid_txn_state
    assert code(ErrorCode.invalid_txn_state, version) == ErrorCode.invalid_txn_state


@pytest.mark.parametrize("version", [11, 12])
def test_produce_v11_and_later_get_transaction_abortable(version: int) -> None:
    assert code(ErrorCode.transaction_abortable, version) == ErrorCode.transaction_abortable


def test_fenced_and_unknown_producers() -> None:
    assert code(ErrorCode.producer_fenced, 11) == ErrorCode.invalid_producer_epoch
    assert code(ErrorCode.invalid_producer_id_mapping, 11) == ErrorCode.invalid_producer_id_mapping


@pytest.mark.parametrize("c", [ErrorCode.concurrent_transactions, ErrorCode.network_exception,
                               ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
                               ErrorCode.not_coordinator])
def test_a_coordinator_that_cannot_answer_is_retried_as_not_enough_replicas(c: ErrorCode) -> None:
    e = verification_error(c, 9)
    assert e is not None and e.error_code == ErrorCode.not_enough_replicas and c.name.upper() in e.message
