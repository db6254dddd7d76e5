"""Requests of a transactional id whose transaction is completing wait for the completion
(``TransactionService.after_completion``), and not longer than ``PARKED_REQUEST_WAIT_S``."""

from __future__ import annotations

import asyncio
import time

import pytest

from shoal.server import txn_service
from shoal.server.txn_service import TransactionService


def _service() -> TransactionService:
    svc = TransactionService.__new__(TransactionService)
    svc._sending = {}
    return svc


def test_a_parked_request_resumes_when_the_completion_is_recorded() -> None:
    async def scenario() -> None:
        svc = _service()
        loop = asyncio.get_running_loop()
        completion: asyncio.Future[bool] = loop.create_future()
        svc._track("t", completion)
        parked = asyncio.ensure_future(svc.after_completion("t"))
        other = asyncio.ensure_future(svc.after_completion("another id"))
        await asyncio.sleep(0.05)
        assert other.done() and not parked.done()  # only the completing id waits
        completion.set_result(True)
        await asyncio.wait_for(parked, 1)
        assert "t" not in svc._sending  # forgotten once done: the next request does not wait

    asyncio.run(scenario())


def test_a_parked_request_is_served_after_the_wait_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txn_service, "PARKED_REQUEST_WAIT_S", 0.2)

    async def scenario() -> None:
        svc = _service()
        stuck: asyncio.Future[bool] = asyncio.get_running_loop().create_future()  # markers never durable
        svc._track("t", stuck)
        start = time.monotonic()
        await asyncio.wait_for(svc.after_completion("t"), 5)
        assert time.monotonic() - start >= 0.15
        assert not stuck.done()  # waiting never cancels the completion
        stuck.cancel()

    asyncio.run(scenario())
