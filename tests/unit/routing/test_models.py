"""Model names: groups, aliases, wildcards; binding a wildcard to the model asked for."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import trio

from triogate.config import Price, parse_config
from triogate.errors import ProviderStatusError, ProviderTimeout
from triogate.routing.models import ModelNames, ModelRef, bind, table_models, table_price
from triogate.routing.retries import RetryPolicy, is_context_window_error, run_with_fallbacks

from .support import dep


def _config(*entries: tuple[str, str], **router: Any) -> Any:
    return parse_config({
        "model_list": [{"model_name": n, "litellm_params": {"model": m}} for n, m in entries],
        "router_settings": router,
    })


CONFIG = _config(("gpt-4o", "openai/gpt-4o"), ("anthropic/*", "anthropic/*"),
                 ("fo::*:static::*", "openai/fo::*:static::*"), ("*", "openai/*"),
                 model_group_alias={"gpt-4": "gpt-4o"})


@pytest.mark.parametrize(("name", "ref"), [
    ("gpt-4o", ModelRef("gpt-4o", "gpt-4o")),
    ("gpt-4", ModelRef("gpt-4o", "gpt-4o")),
    ("anthropic/claude-x", ModelRef("anthropic/*", "anthropic/claude-x")),
    ("fo::a:static::b", ModelRef("fo::*:static::*", "fo::a:static::b")),
    ("llama", ModelRef("*", "llama")),
])
def test_names_resolve_most_specific_first(name: str, ref: ModelRef) -> None:
    assert ModelNames(CONFIG).resolve(name) == ref


def test_without_a_star_deployment_unknown_names_do_not_resolve() -> None:
    names = ModelNames(_config(("gpt-4o", "openai/gpt-4o")))
    assert names.resolve("gpt-5") is None
    assert names.resolve("*") is None


def test_binding_fills_the_star_and_prices_from_the_table() -> None:
    groups = CONFIG.groups
    assert bind(groups["*"][0], "gpt-4o-2024-11-20").upstream_model == "gpt-4o-2024-11-20"
    assert bind(groups["*"][0], "openai/gpt-4o").upstream_model == "gpt-4o"
    ant = bind(groups["anthropic/*"][0], "anthropic/claude-3-5-haiku-20241022")
    assert ant.upstream_model == "claude-3-5-haiku-20241022"
    assert ant.price.output_usd_per_token == Decimal(4) / 1_000_000
    assert bind(groups["fo::*:static::*"][0], "fo::a:static::b").upstream_model == (
        "fo::a:static::b")
    plain = groups["gpt-4o"][0]
    assert bind(plain, "anything") is plain


def test_a_configured_price_beats_the_table() -> None:
    config = parse_config({"model_list": [{"model_name": "*", "litellm_params": {
        "model": "openai/*", "input_cost_per_token": 1e-6}}]})
    bound = bind(config.groups["*"][0], "gpt-4o")
    assert bound.price.input_usd_per_token == Decimal("0.000001")


def test_the_price_table() -> None:
    assert table_price("gpt-4o-mini-2024-07-18") == table_price("gpt-4o-mini")
    assert table_price("gpt-4o-mini") != table_price("gpt-4o")
    assert table_price("gpt-4-turbo-2024-04-09").input_usd_per_token == Decimal("0.00001")
    assert all(m.startswith("claude") for m in table_models(["anthropic"]))
    assert "gpt-4o" in table_models(["openai"])
    assert table_price("unknown-model") == Price()


@pytest.mark.parametrize(("model", "priced_as"), [
    ("gpt-4o-2024-08-06", "gpt-4o"),
    ("gpt-4-0613", "gpt-4"),
    ("gpt-3.5-turbo-0125", "gpt-3.5-turbo"),
    ("claude-sonnet-4-20250514", "claude-sonnet-4"),
    ("claude-3-5-sonnet-latest", "claude-3-5-sonnet"),
    ("claude-opus-4-5-20251101", "claude-opus-4-5"),
    ("gemini/gemini-2.0-flash-001", "gemini/gemini-2.0-flash"),
    ("gemini/gemini-2.5-flash-lite", "gemini/gemini-2.5-flash-lite"),
    # Other models whose names begin with a listed one: never its price.
    ("gpt-4-1106-preview", None),
    ("claude-opus-4-7", None),
    ("xai/grok-3-fast", None),
    ("perplexity/sonar-deep-research", None),
])
def test_a_name_prices_its_snapshots_and_no_other_model(model: str, priced_as: str | None,
                                                        ) -> None:
    assert table_price(model) == (table_price(priced_as) if priced_as else Price())
    assert priced_as is None or table_price(model) != Price()


def test_an_unpriced_wildcard_model_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config(("anthropic/*", "anthropic/*"))
    deployment = config.groups["anthropic/*"][0]
    with caplog.at_level("WARNING", logger="triogate.routing"):
        for _ in range(3):
            assert bind(deployment, "anthropic/claude-next-unlisted").price == Price()
        bind(deployment, "anthropic/claude-3-5-haiku-20241022")  # priced: no warning
    (record,) = caplog.records
    assert "anthropic/claude-next-unlisted" in record.getMessage()
    assert "charged nothing" in record.getMessage()


def test_context_window_errors_are_recognised() -> None:
    assert is_context_window_error(ProviderStatusError(
        400, '{"error": {"code": "context_length_exceeded"}}'))
    assert is_context_window_error(ProviderStatusError(400, "prompt is too long: 300000"))
    assert not is_context_window_error(ProviderStatusError(400, "bad temperature"))
    assert not is_context_window_error(ProviderStatusError(500, "maximum context length"))
    assert not is_context_window_error(ProviderTimeout("slow"))


async def test_a_context_window_error_goes_to_the_context_groups_only() -> None:
    calls: list[str] = []
    deployments = {"a": dep("a", "a"), "b": dep("b", "b"), "c": dep("c", "c")}

    async def call(d: Any) -> str:
        calls.append(d.id)
        await trio.lowlevel.checkpoint()
        if d.id == "a":
            raise ProviderStatusError(400, "maximum context length is 10 tokens")
        return d.id

    result = await run_with_fallbacks(
        ["a", "b"], call, policy=RetryPolicy(num_retries=2, retry_after_s=0),
        pick=lambda g, failed: deployments[g], on_attempt=lambda a: None,
        context_groups=["c"])
    assert (result.value, calls) == ("c", ["a", "c"])
