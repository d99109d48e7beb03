"""Configuration: LiteLLM's shape loads; mistakes fail loudly with the key path."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from triogate.config import Price, load_config, parse_config
from triogate.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

LITELLM_FILE = """
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o
      api_base: https://example.invalid/v1/
      api_key: os.environ/OPENAI_API_KEY
      rpm: 100
      tpm: 100000
      timeout: 300
      weight: 2
      input_cost_per_token: 0.0000025
      output_cost_per_token: 1e-5
    model_info:
      id: gpt4o-east
  - model_name: claude
    litellm_params:
      model: anthropic/claude-sonnet-4
      api_key: ${ANTHROPIC_KEY}
router_settings:
  routing_strategy: usage-based-routing-v2
  num_retries: 3
  allowed_fails: 2
  cooldown_time: 30
  fallbacks: [{"gpt-4o": ["claude"]}]
general_settings:
  master_key: sk-1234
  database_url: postgresql://u:p@db/litellm
litellm_settings:
  cache: true
  cache_params: {type: redis, ttl: 120}
"""

ENV = {"OPENAI_API_KEY": "sk-openai", "ANTHROPIC_KEY": "sk-ant"}


def test_a_litellm_file_loads_and_normalises() -> None:
    config = parse_config(yaml.safe_load(LITELLM_FILE), environ=ENV)
    gpt, claude = config.deployments
    assert (gpt.id, gpt.group, gpt.provider, gpt.upstream_model) == (
        "gpt4o-east", "gpt-4o", "openai", "gpt-4o")
    assert gpt.api_base == "https://example.invalid/v1"
    assert (gpt.api_key, claude.api_key) == ("sk-openai", "sk-ant")
    assert (gpt.rpm, gpt.tpm, gpt.timeout_s, gpt.weight) == (100, 100000, 300, 2)
    assert gpt.price.input_usd_per_token == Decimal("0.0000025")
    assert gpt.price.cost_nanousd(1000, 100) == 2500 * 1000 + 10000 * 100
    assert config.router.strategy == "usage-based-routing-v2"
    assert config.router.fallbacks == {"gpt-4o": ("claude",)}
    assert (config.router.allowed_fails, config.router.cooldown_s) == (2, 30)
    assert config.master_key == "sk-1234"
    assert config.cache.enabled and config.cache.ttl_s == 120
    assert "sk-openai" not in repr(config)


def test_the_example_config_loads() -> None:
    config = load_config(None)
    assert "gpt-4o-mini" in config.groups
    assert all(d.provider == "mock" for d in config.deployments)


def test_environment_overrides_the_file() -> None:
    env = {**ENV, "TRIOGATE_REDIS_URL": "redis://r:6379/1", "TRIOGATE_MASTER_KEY": "sk-env",
           "TRIOGATE_DATABASE_URL": "postgresql://x/y"}
    config = parse_config(yaml.safe_load(LITELLM_FILE), environ=env)
    assert config.settings.redis.url == "redis://r:6379/1"
    assert (config.master_key, config.database_url) == ("sk-env", "postgresql://x/y")


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"router_settings": {"routing_strategy": "fastest"}},
         "$.router_settings.routing_strategy: 'fastest' is not one of"),
        ({"router_settings": {"num_retry": 3}},
         "$.router_settings.num_retry: unsupported key"),
        ({"litellm_settings": {"success_callback": ["langfuse"]}},
         "$.litellm_settings.success_callback[0]: callback 'langfuse' is not supported"),
        ({"litellm_settings": {"callbacks": "custom_callbacks.proxy_handler_instance"}},
         "$.litellm_settings.callbacks[0]: callback 'custom_callbacks.proxy_handler_instance'"),
        ({"router_settings": {"model_group_alias": {"gpt-4o-mini": "nope"}}},
         "$.router_settings.model_group_alias.gpt-4o-mini: unknown model group 'nope'"),
        ({"router_settings": {"model_group_alias": {"claude": "gpt-4o"}}},
         "'claude' is already a model group"),
        ({"router_settings": {"context_window_fallbacks": [{"gpt-4o": ["nope"]}]}},
         "$.router_settings.context_window_fallbacks[0]: unknown model group 'nope'"),
        ({"litellm_settings": {"cache_params": {"namespace": "x"}}},
         "$.litellm_settings.cache_params.namespace: unsupported key"),
        ({"general_settings": {"alerting": ["slack"]}},
         "$.general_settings.alerting[0]: 'slack' is not supported"),
        ({"triogate": {"redis": {"timeout": 1}}}, "$.triogate.redis.timeout: unsupported key"),
        ({"triogate": {"stream_coalesce_window_s": 2}}, "'stream_coalesce_window_s' must be <= 1"),
        ({"triogate": {"stream_coalesce_window_s": -0.1}},
         "'stream_coalesce_window_s' must be >= 0"),
        ({"model_list": [{"model_name": "x", "litellm_params": {"model": "llama3"}}]},
         "$.model_list[0].litellm_params.model: 'llama3' must be <provider>/<model>"),
        ({"model_list": [{"model_name": "x", "litellm_params": {"model": "openai/x",
                                                                "rpm": "many"}}]},
         "$.model_list[0].litellm_params.rpm"),
        ({"model_list": [{"model_name": "x", "litellm_params": {"model": "openai/x",
                                                                "rpm": -1}}]},
         "rpm"),
        ({"model_list": [{"model_name": "x", "litellm_params": {"model": "openai/x",
                                                                "api_key": "os.environ/NOPE"}}]},
         "$.model_list[0].litellm_params.api_key: environment variable NOPE is not set"),
        ({"router_settings": {"fallbacks": [{"gpt-4o": ["missing"]}]}},
         "unknown model group 'missing'"),
        ({"model_list": [{"model_name": "x", "litellm_params": {"model": "openai/x",
                                                                "mock_latency_ms": 5}}]},
         "mock_* settings only apply to mock/ models"),
        ({"model_list": [{"model_name": "x", "litellm_params": {"model": "openai/x"},
                          "model_info": {"access_groups": "beta"}}]},
         "$.model_list[0].model_info.access_groups: must be a list of names"),
    ],
)
def test_mistakes_name_their_key_path(patch: dict[str, Any], message: str) -> None:
    raw = yaml.safe_load(LITELLM_FILE)
    raw.update(patch)
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ=ENV)
    assert message in str(info.value)


def test_unreadable_and_malformed_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_list: [\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(scalar)


def test_prices_are_exact_to_the_nano_dollar() -> None:
    raw = {"model_list": [{"model_name": "m", "litellm_params": {
        "model": "mock/m", "input_cost_per_token": "0.0000000375",
        "output_cost_per_token": 0.1 + 0.2}}]}
    (deployment,) = parse_config(raw).deployments
    # 37.5 nano-USD a token: per request, the cost rounds half up to a whole nano-dollar.
    assert deployment.price.cost_nanousd(1, 0) == 38
    assert deployment.price.cost_nanousd(2, 0) == 75
    assert deployment.price.cost_nanousd(3, 0) == 113
    # 0.1 + 0.2 is 0.30000000000000004 as a float; its shortest repr is kept exactly.
    assert deployment.price.output_usd_per_token == Decimal("0.30000000000000004")


def _decimal_cost(price: Price, input_tokens: int, output_tokens: int) -> int:
    usd = input_tokens * price.input_usd_per_token + output_tokens * price.output_usd_per_token
    return int((usd * 1_000_000_000).to_integral_value(rounding="ROUND_HALF_UP"))


@pytest.mark.parametrize(("inp", "out"), [
    ("0", "0"), ("0.000001", "0.000002"), ("0.0000000375", "0.30000000000000004"),
    ("0.0000000005", "0.0000000015"), ("0.00000000049999", "1E-10"), ("2.5E-9", "0"),
    ("12345.6789", "0.000000000000000001"),
])
def test_integer_costs_equal_the_decimal_formula(inp: str, out: str) -> None:
    """cost_nanousd is integer arithmetic over the prices' common denominator; wherever
    Decimal's 28 digits are exact it gives the Decimal formula's nano-dollars (half-up
    included), and beyond them it stays exact."""
    price = Price(input_usd_per_token=Decimal(inp), output_usd_per_token=Decimal(out))
    for tokens in [(0, 0), (1, 0), (0, 1), (1, 1), (2, 3), (3, 0), (999, 1), (10**6, 7),
                   (123_456_789, 987_654_321), (2**53 - 1, 0)]:
        assert price.cost_nanousd(*tokens) == _decimal_cost(price, *tokens), tokens
    assert price == Price(input_usd_per_token=Decimal(inp), output_usd_per_token=Decimal(out))
    huge = 10**40 + 1  # Decimal would round to 28 digits here; integers do not
    assert Price(input_usd_per_token=Decimal("0.0000000015")).cost_nanousd(huge, 0) == (
        (15 * huge + 5) // 10)


def test_a_non_finite_price_keeps_the_decimal_formula() -> None:
    """No integer ratio for an infinite price: the Decimal formula, and its errors."""
    price = Price(input_usd_per_token=Decimal("Infinity"))
    for tokens in [(1, 0), (0, 5)]:
        with pytest.raises((InvalidOperation, OverflowError)):
            price.cost_nanousd(*tokens)
