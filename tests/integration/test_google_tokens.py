"""Vertex AI access tokens: the JWT bearer grant against the Gemini fake's token endpoint,
cached in the process, fetched again before expiry, one fetch for concurrent callers."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import orjson
import pytest
import trio

from triogate.config_cloud import CloudParams
from triogate.errors import ProviderStatusError
from triogate.providers.google_auth import REFRESH_BEFORE_S, GoogleTokens
from triogate.testing.fakegemini import open_fake_gemini

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.testing.fakegemini import FakeGemini

pytestmark = [pytest.mark.integration]


@pytest.fixture
async def fake() -> AsyncIterator[FakeGemini]:
    # Tokens live just past the refresh margin, so that the test's clock moves seconds.
    async with open_fake_gemini(token_lifetime_s=int(REFRESH_BEFORE_S) + 4) as server:
        yield server


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_cached_then_refreshed_before_expiry(fake: FakeGemini) -> None:
    account = fake.service_account()
    clock = Clock()
    async with httpx.AsyncClient() as client:
        tokens = GoogleTokens(client, clock=clock)
        cloud = CloudParams(vertex_project="p", vertex_credentials=orjson.dumps(account).decode())
        with trio.fail_after(20):
            # The fake checks the assertion's times against the real clock: start there.
            clock.now = time.time()
            first = await tokens.token(cloud, timeout_s=10)
            assert await tokens.token(cloud, timeout_s=10) == first
            clock.now += 3  # 1 s before the refresh margin: still fresh
            assert await tokens.token(cloud, timeout_s=10) == first
            assert fake.token_requests == 1
            clock.now += 2  # inside the refresh margin: fetched again
            second = await tokens.token(cloud, timeout_s=10)
    assert second != first and fake.token_requests == 2 and tokens.fetches == 2


async def test_concurrent_callers_share_one_fetch(fake: FakeGemini) -> None:
    account = fake.service_account()
    async with httpx.AsyncClient() as client:
        tokens = GoogleTokens(client)
        cloud = CloudParams(vertex_project="p", vertex_credentials=account)
        got: list[str] = []

        async def one() -> None:
            got.append(await tokens.token(cloud, timeout_s=10))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(one)
    assert len(set(got)) == 1 and fake.token_requests == 1


async def test_a_refused_grant_is_an_auth_failure_without_the_key(fake: FakeGemini) -> None:
    account = fake.service_account()
    other = fake.service_account("other@test-project.iam.gserviceaccount.com")
    forged = {**account, "private_key": other["private_key"]}  # not the key it registered
    async with httpx.AsyncClient() as client:
        with trio.fail_after(20), pytest.raises(ProviderStatusError) as caught:
            await GoogleTokens(client).token(
                CloudParams(vertex_project="p", vertex_credentials=forged), timeout_s=10)
    assert caught.value.status == 401
    assert "PRIVATE KEY" not in str(caught.value) and "PRIVATE KEY" not in caught.value.body
