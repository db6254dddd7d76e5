from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from shoal.server.fetch_session import FetchSessionCache, FetchSessionError, SessionPartition


def sp(offset: int) -> SessionPartition:
    return SessionPartition(offset, 1 << 20)


def test_full_fetch_without_session() -> None:
    cache = FetchSessionCache(10)
    session, incremental = cache.resolve(0, -1, {("t", 0): sp(0)}, [], 0)
    assert session is None and not incremental and len(cache) == 0


def test_open_then_incremental_updates_and_forgets() -> None:
    cache = FetchSessionCache(10)
    session, incremental = cache.resolve(0, 0, {("t", 0): sp(0), ("t", 1): sp(5)}, [], 0)
    assert session is not None and not incremental and session.epoch == 1
    sid = session.session_id
    same, incremental = cache.resolve(sid, 1, {("t", 1): sp(9), ("u", 0): sp(0)}, [("t", 0)], 1)
    assert same is session and incremental and session.epoch == 2
    assert {k: v.fetch_offset for k, v in session.partitions.items()} == {("t", 1): 9, ("u", 0): 0}


def test_incremental_response_sends_only_changes() -> None:
    cache = FetchSessionCache(10)
    session, _ = cache.resolve(0, 0, {("t", 0): sp(0)}, [], 0)
    assert session is not None
    assert session.must_send(("t", 0), 10, 0, has_data=True, has_error=False)
    assert not session.must_send(("t", 0), 10, 0, has_data=False, has_error=False)
    assert session.must_send(("t", 0), 11, 0, has_data=False, has_error=False)  # high watermark moved
    assert session.must_send(("t", 0), 11, 3, has_data=False, has_error=False)  # log start moved
    assert session.must_send(("t", 0), 11, 3, has_data=False, has_error=True)


@pytest.mark.parametrize(
    ("session_id", "epoch", "code"),
    [(12345, 1, ErrorCode.fetch_session_id_not_found), (0, 3, ErrorCode.invalid_fetch_session_epoch)],
)
def test_errors(session_id: int, epoch: int, code: ErrorCode) -> None:
    with pytest.raises(FetchSessionError) as e:
        FetchSessionCache(10).resolve(session_id, epoch, {}, [], 0)
    assert e.value.error_code is code


def test_wrong_epoch_and_close() -> None:
    cache = FetchSessionCache(10)
    session, _ = cache.resolve(0, 0, {("t", 0): sp(0)}, [], 0)
    assert session is not None
    with pytest.raises(FetchSessionError) as e:
        cache.resolve(session.session_id, 5, {}, [], 0)
    assert e.value.error_code is ErrorCode.invalid_fetch_session_epoch
    assert cache.resolve(session.session_id, -1, {}, [], 0) == (None, False)
    assert len(cache) == 0


def test_least_recently_used_session_is_evicted() -> None:
    cache = FetchSessionCache(2)
    a, _ = cache.resolve(0, 0, {}, [], 0)
    b, _ = cache.resolve(0, 0, {}, [], 1)
    assert a is not None and b is not None
    cache.resolve(a.session_id, 1, {}, [], 2)  # a is now the most recent
    c, _ = cache.resolve(0, 0, {}, [], 3)
    assert c is not None and len(cache) == 2
    with pytest.raises(FetchSessionError):
        cache.resolve(b.session_id, 1, {}, [], 4)


def test_zero_slots_means_sessionless() -> None:
    assert FetchSessionCache(0).resolve(0, 0, {("t", 0): sp(0)}, [], 0) == (None, False)
