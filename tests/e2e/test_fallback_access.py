"""Every model a request may reach is one its key, team and user may use: a fallback (the
config's, the request's own, a context-window fallback) that the caller may not use is
never tried, and the spend-log row names the group that actually answered."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, running_gateway, spend_rows
from tests.e2e.test_routing import deployment
from triogate.config import parse_config
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
async def two_groups(
    tmp_path: Path, redis: RespBackend, redis_url: str,
) -> AsyncIterator[tuple[Gateway, FakeUpstream, FakeUpstream]]:
    """``bad-model`` (one deployment) falls back to ``good-model`` (another upstream), for
    errors and for context-window errors alike."""
    async with AsyncExitStack() as stack:
        bad, good = [await stack.enter_async_context(open_fake_upstream()) for _ in range(2)]
        config = parse_config({
            "model_list": [deployment("bad-model", "dep-bad", bad),
                           deployment("good-model", "dep-good", good)],
            "router_settings": {"num_retries": 0, "allowed_fails": 100,
                                "fallbacks": [{"bad-model": ["good-model"]}],
                                "context_window_fallbacks": [{"bad-model": ["good-model"]}]},
            "general_settings": {"master_key": MASTER_KEY},
            "triogate": {"state_dir": str(tmp_path / "state"), "redis": {"url": redis_url}},
        })
        with trio.fail_after(60):
            async with running_gateway(config) as gateway:
                yield gateway, bad, good


async def ask(gateway: Gateway, key: str, **extra: Any) -> httpx.Response:
    body = {"model": "bad-model", "messages": [{"role": "user", "content": "hello"}], **extra}
    async with httpx.AsyncClient(timeout=20) as http:
        return await http.post(f"{gateway.openai_base}/chat/completions", json=body,
                               headers={"authorization": f"Bearer {key}"})


async def make_key(gateway: Gateway, who: str) -> str:
    """A key that may use only ``bad-model``: by its own list, its team's or its user's."""
    store = gateway.services.store
    assert store is not None
    if who == "key":
        raw, _ = await store.create_key(models=["bad-model"])
    elif who == "team":
        team = await store.create_team(models=["bad-model"])
        raw, _ = await store.create_key(team_id=team.team_id)
    else:
        user = await store.create_user(models=["bad-model"])
        raw, _ = await store.create_key(user_id=user.user_id)
    return raw


@pytest.mark.parametrize("who", ["key", "team", "user"])
@pytest.mark.parametrize("how", ["config", "request", "context_window"])
async def test_a_fallback_the_caller_may_not_use_is_never_tried(
    two_groups: tuple[Gateway, FakeUpstream, FakeUpstream], who: str, how: str,
) -> None:
    gateway, bad, good = two_groups
    key = await make_key(gateway, who)
    extra: dict[str, Any] = {}
    if how == "context_window":
        bad.fail_next(1, status=400, message="This model's maximum context length is 8 tokens")
    else:
        bad.fail_next(1, status=500)
    if how == "request":
        extra["fallbacks"] = ["good-model"]
    with trio.fail_after(30):
        response = await ask(gateway, key, **extra)
    assert response.status_code == (400 if how == "context_window" else 502), response.text
    assert not good.requests
    (row,) = await spend_rows(gateway, 1)
    assert (row.model_group, row.deployment_id) == ("bad-model", None)


async def test_a_fallback_the_caller_may_use_answers_and_its_row_names_it(
    two_groups: tuple[Gateway, FakeUpstream, FakeUpstream],
) -> None:
    gateway, bad, good = two_groups
    store = gateway.services.store
    assert store is not None
    key, _ = await store.create_key(models=["bad-model", "good-model"])
    bad.fail_next(1, status=500)
    with trio.fail_after(30):
        response = await ask(gateway, key, fallbacks=["good-model"])
    assert response.status_code == 200
    assert len(good.requests) == 1
    (row,) = await spend_rows(gateway, 1)
    assert (row.model_group, row.deployment_id) == ("good-model", "dep-good")
