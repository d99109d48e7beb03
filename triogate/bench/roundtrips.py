"""The round-trip table: how many times one request waits on Redis, per request shape.

``triogate bench roundtrips`` (or ``python bench/roundtrips.py``) starts the gateway in
this process with tracing on, mock deployments (no network) and a private embedded
Redis-compatible server; creates a team, a key in it and an end user through the admin
API over real HTTP, each with a budget, the team and key with TPM/RPM limits; turns the
Redis response cache on; then sends, for every shape, one warm-up request and N traced
ones. Waits are counted from the tracer's flush records (real pipelines that left, one
wait per round; nothing is counted by hand), after the settler has drained.

Every figure in the output comes from the run, except the reference column: an
established Python gateway's counts for the same shapes (waits on Redis, a pipeline or a
Lua script counting as one), before and after its own batching work. They cannot be
measured here and are quoted as given, labelled as such.

The report (:class:`RoundTripReport`) renders as Markdown and JSON; ``run`` writes both to
``--out`` (default ``bench/results``) as ``roundtrips.md`` and ``roundtrips.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import httpx
import orjson
import trio

from triogate.app import serve
from triogate.bench.options import add_roundtrips_arguments
from triogate.bench.report import RequestTrace, RoundTripReport, ShapeResult, trace_of
from triogate.config import parse_config
from triogate.redis_server import open_embedded_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from triogate.api.services import Services
    from triogate.config import GatewayConfig

MASTER_KEY = "sk-bench-master"
GROUP = "bench-chat"
END_USER = "bench-customer"
USAGE_BASED = "usage-based-routing"
SIMPLE_SHUFFLE = "simple-shuffle"
#: Longer than any run, so that only ``expire()`` refreshes an identity (never the clock).
IDENTITY_TTL_S = 3600.0
_TIMEOUT_S = 30.0


class HarnessError(Exception):
    """Raised by the harness when a request fails or a shape is not what it claims."""


# --------------------------------------------------------------------------- the shapes


def chat_body(prompt: str) -> dict[str, Any]:
    return {"model": GROUP, "user": END_USER, "max_tokens": 16,
            "messages": [{"role": "user", "content": prompt}]}


def stream_body(prompt: str) -> dict[str, Any]:
    return {**chat_body(prompt), "stream": True, "stream_options": {"include_usage": True}}


def messages_body(prompt: str) -> dict[str, Any]:
    return {"model": GROUP, "max_tokens": 16, "metadata": {"user_id": END_USER},
            "messages": [{"role": "user", "content": prompt}]}


def responses_body(prompt: str) -> dict[str, Any]:
    return {"model": GROUP, "user": END_USER, "max_output_tokens": 16, "input": prompt}


@attrs.frozen(kw_only=True)
class Shape:
    """One row of the table: what is sent, to which gateway, in which state.

    Attributes:
        name: the row's label.
        path: the API path.
        body: prompt → request body (every request gets its own prompt: a cache miss).
        strategy: the routing strategy of the gateway it is sent to.
        refresh: expire the identity cache before each request (what 60 s would do).
        cache_hit: send each body twice and trace the second (a response-cache hit).
        reference: the established gateway's waits (before its batching work, after),
            as quoted text; not measured here.
        features: sent to a gateway with a proxy-wide budget and a pre-call guardrail,
            with a key that has a budget for the group (``model_max_budget``).
    """

    name: str
    path: str
    body: Callable[[str], dict[str, Any]]
    strategy: str = USAGE_BASED
    refresh: bool = False
    cache_hit: bool = False
    features: bool = False
    reference: tuple[str, str]

    @property
    def headers(self) -> dict[str, str]:
        if self.path == "/v1/messages":
            return {"anthropic-version": "2023-06-01"}
        return {}


SHAPES: tuple[Shape, ...] = (
    Shape(name="chat completion", path="/v1/chat/completions", body=chat_body,
          reference=("22 (12+10)", "8 (5+3)")),
    Shape(name="chat completion, streaming", path="/v1/chat/completions", body=stream_body,
          reference=("24", "8")),
    Shape(name="chat completion, simple-shuffle routing", path="/v1/chat/completions",
          body=chat_body, strategy=SIMPLE_SHUFFLE, reference=("22", "8")),
    Shape(name="/v1/messages", path="/v1/messages", body=messages_body, reference=("21", "8")),
    Shape(name="/v1/responses", path="/v1/responses", body=responses_body,
          reference=("26", "9")),
    Shape(name="chat completion, response-cache hit", path="/v1/chat/completions",
          body=chat_body, cache_hit=True, reference=("18", "7")),
    Shape(name="chat completion, identity refresh (60 s cache expired)",
          path="/v1/chat/completions", body=chat_body, refresh=True, reference=("46", "16")),
    Shape(name="/v1/messages, identity refresh", path="/v1/messages", body=messages_body,
          refresh=True, reference=("40", "14")),
    Shape(name="chat completion, proxy budget + model budget + pre-call guardrail",
          path="/v1/chat/completions", body=chat_body, features=True,
          reference=("not measured", "not measured")),
)

#: The guardrail of the ``features`` gateway: masks e-mail addresses before the call.
GUARDRAIL = {"guardrail_name": "bench-pii", "litellm_params": {
    "guardrail": "litellm_content_filter", "mode": "pre_call", "default_on": True,
    "patterns": [{"pattern_type": "prebuilt", "pattern_name": "email", "action": "MASK"}]}}


# --------------------------------------------------------------------------- the gateway


def bench_config(state_dir: Path, redis_url: str, strategy: str, *,
                 features: bool = False) -> GatewayConfig:
    """Two mock deployments in one group, the response cache on, tracing on; with
    ``features``, a proxy-wide budget and a pre-call guardrail too."""
    def deployment(name: str) -> dict[str, Any]:
        return {"model_name": GROUP, "model_info": {"id": name}, "litellm_params": {
            "model": f"mock/{name}", "input_cost_per_token": "0.000001",
            "output_cost_per_token": "0.000002", "rpm": 100_000, "tpm": 100_000_000}}

    return parse_config({
        "model_list": [deployment("bench-a"), deployment("bench-b")],
        "router_settings": {"routing_strategy": strategy},
        "general_settings": {"master_key": MASTER_KEY},
        "litellm_settings": {"cache": True, "cache_params": {"ttl": 600},
                             **({"max_budget": 10_000, "budget_duration": "30d"}
                                if features else {})},
        "guardrails": [GUARDRAIL] if features else [],
        "triogate": {
            "state_dir": str(state_dir), "redis": {"url": redis_url, "timeout_s": 5.0},
            "tracing": True, "governance": {"identity_ttl_s": IDENTITY_TTL_S},
        },
    }, source="bench_roundtrips")


@attrs.frozen(kw_only=True)
class Gateway:
    """A gateway serving on loopback in this process, with a key ready to use."""

    url: str
    services: Services
    key: str


@asynccontextmanager
async def running_gateway(config: GatewayConfig, *, features: bool = False
                          ) -> AsyncIterator[Gateway]:
    """Serve ``config`` on 127.0.0.1 (any port); provision; drain on exit."""
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds, services = await nursery.start(partial(
            serve, config, host="127.0.0.1", port=0, shutdown=shutdown, handle_signals=False))
        try:
            key = await provision(binds[0], features=features)
            yield Gateway(url=binds[0], services=services, key=key)
        finally:
            shutdown.set()


async def provision(url: str, *, features: bool = False) -> str:
    """Create a team, a key in it and an end user through the admin API; the raw key
    (with ``features``, the key has a budget for the group too).

    Budgets are large and limits high: nothing here may reject a benchmark request.
    """
    headers = {"authorization": f"Bearer {MASTER_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=_TIMEOUT_S) as http:
        async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            response = await http.post(path, json=body)
            if response.status_code != 200:
                raise HarnessError(f"{path}: {response.status_code} {response.text}")
            return orjson.loads(response.content)  # type: ignore[no-any-return]

        team = await post("/team/new", {"team_alias": "bench-team", "max_budget": 1000,
                                        "budget_duration": "30d", "tpm_limit": 100_000_000,
                                        "rpm_limit": 1_000_000})
        model_budget = {GROUP: {"budget_limit": 50, "time_period": "1d"}} if features else None
        key = await post("/key/generate", {"team_id": team["team_id"], "max_budget": 100,
                                           "budget_duration": "1d", "tpm_limit": 10_000_000,
                                           "rpm_limit": 100_000, "key_alias": "bench-key",
                                           "model_max_budget": model_budget})
        await post("/customer/new", {"user_id": END_USER, "max_budget": 10,
                                     "rpm_limit": 100_000})
    return str(key["key"])


# --------------------------------------------------------------------------- measuring


async def send(gateway: Gateway, http: httpx.AsyncClient, shape: Shape, prompt: str
               ) -> tuple[str, str | None]:
    """One request, read to the end; its trace id and ``x-triogate-cache`` header.

    Returns once the request's post-call batch has settled (its records are complete).
    """
    headers = {"authorization": f"Bearer {gateway.key}", **shape.headers}
    response = await http.post(f"{gateway.url}{shape.path}", json=shape.body(prompt),
                               headers=headers)
    if response.status_code != 200:
        raise HarnessError(f"{shape.name}: {response.status_code} {response.text[:500]}")
    trace_id = response.headers.get("x-triogate-trace-id")
    if not trace_id:
        raise HarnessError(f"{shape.name}: no x-triogate-trace-id header (tracing off?)")
    await gateway.services.settler.wait_drained()
    return trace_id, response.headers.get("x-triogate-cache")


async def measure(gateway: Gateway, shape: Shape, requests: int) -> ShapeResult:
    """A warm-up request, then ``requests`` traced ones of ``shape``."""
    tracer = gateway.services.tracer
    identities = gateway.services.identities
    if tracer is None or identities is None:
        raise HarnessError("the gateway runs without a tracer or an identity resolver")
    traces: list[RequestTrace] = []
    async with httpx.AsyncClient(timeout=_TIMEOUT_S) as http:
        for i in range(requests + 1):
            prompt = f"{shape.name}: request {i} of a round-trip count"
            if shape.cache_hit:
                await send(gateway, http, shape, prompt)  # stores the answer
            if shape.refresh:
                identities.expire()
            with trio.fail_after(_TIMEOUT_S):
                trace_id, cache = await send(gateway, http, shape, prompt)
            expected = "hit" if shape.cache_hit else "miss"
            if cache != expected:
                raise HarnessError(f"{shape.name}: x-triogate-cache is {cache!r}, "
                                   f"expected {expected!r}")
            if i > 0:  # request 0 warms connections, scripts and the identity
                traces.append(trace_of(tracer.summary(trace_id), cache=cache))
    return ShapeResult(name=shape.name, strategy=shape.strategy, path=shape.path,
                       reference=shape.reference, refresh=shape.refresh,
                       cache_hit=shape.cache_hit, requests=tuple(traces))


async def run_roundtrips(*, requests: int = 5, work_dir: Path | None = None,
                         shapes: tuple[Shape, ...] = SHAPES) -> RoundTripReport:
    """Run every shape against fresh gateways; the report. A checkpoint (real I/O).

    Args:
        requests: traced requests per shape (after one warm-up).
        work_dir: where state (SQLite, server socket) goes; a temporary folder if None.
        shapes: the rows to measure.
    """
    if requests < 1:
        raise ValueError("requests must be at least 1")
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="tg-bench-") as folder:
            return await run_roundtrips(requests=requests, work_dir=Path(folder), shapes=shapes)
    results: dict[str, ShapeResult] = {}
    async with open_embedded_server(work_dir / "redis", persistent=False) as server:
        redis_url = server.url
        for strategy, features in dict.fromkeys((s.strategy, s.features) for s in shapes):
            config = bench_config(work_dir / f"{strategy}{'-features' if features else ''}",
                                  redis_url, strategy, features=features)
            async with running_gateway(config, features=features) as gateway:
                for shape in shapes:
                    if (shape.strategy, shape.features) == (strategy, features):
                        results[shape.name] = await measure(gateway, shape, requests)
    return RoundTripReport(requests_per_shape=requests,
                           results=tuple(results[s.name] for s in shapes))


# --------------------------------------------------------------------------- the command


def run(args: argparse.Namespace) -> int:
    """Run the harness, write the results, print the table; 1 if a budget is exceeded."""
    report = trio.run(partial(run_roundtrips, requests=args.requests))
    paths = report.write(args.out)
    sys.stdout.write(report.markdown())
    print("\nwritten: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    problems = report.budget_violations()
    for problem in problems:
        print(f"over budget: {problem}", file=sys.stderr)
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    """``python bench/roundtrips.py [--requests N] [--out DIR]``."""
    parser = argparse.ArgumentParser(prog="roundtrips", description=__doc__.split("\n")[0])
    add_roundtrips_arguments(parser)
    return run(parser.parse_args(argv))

