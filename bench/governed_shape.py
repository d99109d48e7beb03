"""The governed request of ``bench/load.py``, for benches that run a gateway in-process
(``redis_capacity.py``): its configuration, its principals and its
traffic, so that every Redis figure is taken on the same shape.

The shape: two deployments of one group behind usage-based routing, the response cache
on, a key in a team (both with a budget and RPM/TPM) and an end user with a budget and
RPM; every prompt unique (a cache miss).

Imported from the bench folder (put on ``sys.path`` by the caller, which may run a
gateway of another source tree: this module uses only ``tests/e2e/conftest.py``'s
``gateway_config`` and the store's ``create_*`` calls, which every tree has).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

USD = 1_000_000_000


def config(folder: Path, redis_url: str, upstream_base: str, **triogate: Any) -> Any:
    """The gateway's configuration: the shape above, tracing off, a 30 s Redis timeout
    (a server under callgrind is slow), then ``triogate`` settings merged in."""
    from tests.e2e.conftest import gateway_config

    def deployment(name: str) -> dict[str, Any]:
        return {"model_name": "bench", "model_info": {"id": name}, "litellm_params": {
            "model": f"openai/{name}", "api_base": f"{upstream_base}/v1",
            "api_key": "sk-upstream-secret", "input_cost_per_token": "0.000001",
            "output_cost_per_token": "0.000002", "rpm": 10**9, "tpm": 10**11}}

    return gateway_config(
        folder / "state", redis_url, upstream_base,
        model_list=[deployment("up-a"), deployment("up-b")],
        router_settings={"routing_strategy": "usage-based-routing"},
        litellm_settings={"cache": True, "cache_params": {"ttl": 600}},
        triogate={"tracing": False, "redis": {"url": redis_url, "timeout_s": 30.0},
                  **triogate})


async def principals(store: Any) -> str:
    """Create the team, the key in it and the end user; return the key."""
    team = await store.create_team(max_budget_nanousd=10**6 * USD, budget_duration="30d",
                                   rpm_limit=10**9, tpm_limit=10**11)
    key, _ = await store.create_key(team_id=team.team_id, max_budget_nanousd=10**5 * USD,
                                    budget_duration="1d", rpm_limit=10**8, tpm_limit=10**10)
    await store.create_end_user(user_id="end-user-1", max_budget_nanousd=10**4 * USD,
                                rpm_limit=10**8)
    return str(key)


async def send(http: httpx.AsyncClient, url: str, key: str, n: int, tag: str,
               connections: int, *, request_ids: bool = False) -> None:
    """``n`` unique chat completions over ``connections`` concurrent loops, each a 200.
    With ``request_ids``, request ``i`` carries ``x-request-id: <tag><i:06d>x``."""
    async def one_connection(c: int) -> None:
        for i in range(c, n, connections):
            headers = {"authorization": f"Bearer {key}"}
            if request_ids:
                headers["x-request-id"] = f"{tag}{i:06d}x"
            reply = await http.post(f"{url}/chat/completions", json={
                "model": "bench", "user": "end-user-1", "max_tokens": 16,
                "messages": [{"role": "user", "content": f"{tag} {i} {time.time()}"}]},
                headers=headers)
            assert reply.status_code == 200, reply.text

    async with trio.open_nursery() as nursery:
        for c in range(connections):
            nursery.start_soon(one_connection, c)
