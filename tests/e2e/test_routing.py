"""Routing through a running gateway: distribution, retries, cooldown, fallbacks.

Each deployment has its own fake upstream server, so failures can be injected into one.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, UPSTREAM_KEY, running_gateway
from triogate.config import parse_config
from triogate.testing.fakeupstream import open_fake_upstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

BODY = {"model": "primary", "messages": [{"role": "user", "content": "route me"}]}


def deployment(group: str, ident: str, upstream: FakeUpstream) -> dict[str, Any]:
    return {"model_name": group, "model_info": {"id": ident},
            "litellm_params": {"model": f"openai/{ident}", "api_base": f"{upstream.base_url}/v1",
                               "api_key": UPSTREAM_KEY}}


@pytest.fixture
async def three_upstreams() -> AsyncIterator[tuple[FakeUpstream, FakeUpstream, FakeUpstream]]:
    async with AsyncExitStack() as stack:
        ups = [await stack.enter_async_context(open_fake_upstream()) for _ in range(3)]
        yield ups[0], ups[1], ups[2]


@pytest.fixture
async def routed(
    tmp_path: Path, redis: RespBackend, redis_url: str,
    three_upstreams: tuple[FakeUpstream, FakeUpstream, FakeUpstream],
) -> AsyncIterator[Gateway]:
    a, b, c = three_upstreams
    config = parse_config({
        "model_list": [deployment("primary", "dep-a", a), deployment("primary", "dep-b", b),
                       deployment("backup", "dep-c", c)],
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 1,
                            "allowed_fails": 2, "cooldown_time": 60,
                            "fallbacks": [{"primary": ["backup"]}]},
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": {"state_dir": str(tmp_path / "state"), "redis": {"url": redis_url},
                     "tracing": True},
    })
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            yield gateway


async def send(gateway: Gateway, n: int = 1) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=20) as http:
        return [
            await http.post(f"{gateway.openai_base}/chat/completions", json=BODY,
                            headers={"authorization": f"Bearer {MASTER_KEY}"})
            for _ in range(n)
        ]


async def test_simple_shuffle_spreads_requests_over_the_group(
    routed: Gateway, three_upstreams: tuple[FakeUpstream, ...]
) -> None:
    a, b, c = three_upstreams
    responses = await send(routed, 60)
    assert all(r.status_code == 200 for r in responses)
    # Equal weights: each deployment gets a fair share (binomial, p=0.5, n=60).
    assert 15 <= len(a.requests) <= 45 and len(a.requests) + len(b.requests) == 60
    assert not c.requests


async def test_a_failing_deployment_is_retried_elsewhere_then_cooled_down(
    routed: Gateway, three_upstreams: tuple[FakeUpstream, ...]
) -> None:
    a, b, _ = three_upstreams
    a.fail_next(1000, status=503)
    responses = await send(routed, 30)
    assert all(r.status_code == 200 for r in responses)  # every failure retried on dep-b
    assert all(r.headers["x-triogate-deployment"] == "dep-b" for r in responses)
    # allowed_fails=2: after two failures dep-a cools down and is not tried again.
    assert len(a.requests) == 2
    assert len(b.requests) == 30
    with trio.fail_after(10):
        await routed.services.settler.wait_drained()
    cooldown = await routed.services.backends["counters"].execute(
        [("HGET", "tg:{rt:primary}:cooldown", "dep-a")])
    assert cooldown[0] is not None  # shared in Redis for other processes


async def test_an_exhausted_group_falls_back_to_the_next_group(
    routed: Gateway, three_upstreams: tuple[FakeUpstream, ...]
) -> None:
    a, b, c = three_upstreams
    a.fail_next(1000, status=500)
    b.fail_next(1000, status=500)
    (response,) = await send(routed)
    assert response.status_code == 200
    assert response.headers["x-triogate-deployment"] == "dep-c"
    assert len(a.requests) + len(b.requests) == 2  # num_retries=1: two attempts
    assert len(c.requests) == 1


async def test_when_everything_fails_the_client_gets_the_mapped_error(
    routed: Gateway, three_upstreams: tuple[FakeUpstream, ...]
) -> None:
    for upstream in three_upstreams:
        upstream.fail_next(1000, status=500)
    (response,) = await send(routed)
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "api_error"


async def test_the_services_group_table_is_the_configs(gateway: Gateway) -> None:
    """Handlers read the model groups from ``services.groups``, built once at start-up:
    the same table as ``config.groups`` (which builds a new one on each read)."""
    services = gateway.services
    assert services.groups == services.config.groups
    assert services.groups is services.groups
