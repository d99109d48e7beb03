"""Azure OpenAI settings, LiteLLM's OpenAI-compatible provider names, and their prices."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from triogate.config import Deployment, parse_config
from triogate.config_litellm import COMPAT_PROVIDERS, compat_table_markdown
from triogate.errors import ConfigError

DOC = Path(__file__).parents[3] / "docs" / "providers-azure-compat.md"
PRICED = {"input_cost_per_token": 0, "output_cost_per_token": 0}


def load(model: str, environ: dict[str, str] | None = None, info: dict[str, Any] | None = None,
         **params: Any) -> Deployment:
    raw = {"model_list": [{"model_name": "m", "model_info": info or {},
                           "litellm_params": {"model": model, **params}}]}
    return parse_config(raw, environ=environ or {}).deployments[0]


def test_a_compat_name_gets_litellms_default_base_and_key_variable() -> None:
    d = load("groq/llama-3.1-8b-instant", {"GROQ_API_KEY": "gsk"})
    assert (d.provider, d.upstream_model) == ("groq", "llama-3.1-8b-instant")
    assert (d.api_base, d.api_key) == ("https://api.groq.com/openai/v1", "gsk")
    assert d.price.input_usd_per_token == Decimal("0.05") / 1_000_000
    d = load("together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo",
             {"TOGETHERAI_API_KEY": "t", "TOGETHER_AI_API_BASE": "http://proxy/v1"})
    assert (d.api_base, d.api_key) == ("http://proxy/v1", "t")
    d = load("deepseek/deepseek-chat", {"DEEPSEEK_API_KEY": "env"}, api_base="http://mine/",
             api_key="own")
    assert (d.api_base, d.api_key) == ("http://mine", "own")


def test_every_name_resolves() -> None:
    for name, spec in COMPAT_PROVIDERS.items():
        d = load(f"{name}/some-model", {spec.key_envs[-1]: "k"}, api_base="http://h:1", **PRICED)
        assert d.provider == name and d.api_key == "k"


def test_ollama_serves_its_openai_api_under_v1() -> None:
    assert load("ollama/llama3", **PRICED).api_base == "http://localhost:11434/v1"
    d = load("ollama_chat/llama3", {"OLLAMA_API_BASE": "http://gpu:11434"}, **PRICED)
    assert d.api_base == "http://gpu:11434/v1"


def test_a_server_without_a_default_address_needs_one() -> None:
    with pytest.raises(ConfigError, match=r"api_base: hosted_vllm/ models need api_base "
                                          r"\(or HOSTED_VLLM_API_BASE\)"):
        load("hosted_vllm/qwen", **PRICED)
    assert load("hosted_vllm/qwen", {"HOSTED_VLLM_API_BASE": "http://v:8000/v1"},
                **PRICED).api_base == "http://v:8000/v1"


def test_a_model_without_a_price_is_refused_unless_the_deployment_gives_one() -> None:
    with pytest.raises(ConfigError, match=r"no price for 'ollama/llama3'.*input_cost_per_token"):
        load("ollama/llama3")
    assert load("ollama/llama3", input_cost_per_token="1e-7").price.input_usd_per_token == (
        Decimal("1e-7"))
    load("openai/unlisted-model")  # as before: the other providers are not refused


def test_azure_settings() -> None:
    d = load("azure/gpt-4o-2024-08-06", {"AZURE_API_KEY": "key"},
             api_base="https://r.openai.azure.com/")
    assert (d.api_base, d.api_key) == ("https://r.openai.azure.com", "key")
    assert d.azure is not None and d.azure.api_version == "2024-10-21"
    assert d.azure.token_url is None and d.azure.ad_token is None
    assert d.price.output_usd_per_token == Decimal(10) / 1_000_000  # gpt-4o by its name
    d = load("azure/prod", {"AZURE_API_KEY": "key"}, info={"base_model": "azure/gpt-4o-mini"},
             api_base="https://r", tenant_id="t", client_id="c", client_secret="s3cr3t",
             api_version="2025-01-01-preview", azure_authority_host="http://login.local/")
    assert d.api_key is None and d.azure is not None
    assert d.azure.token_url == "http://login.local/t/oauth2/v2.0/token"
    assert d.azure.api_version == "2025-01-01-preview"
    assert d.price.input_usd_per_token == Decimal("0.15") / 1_000_000
    assert "s3cr3t" not in repr(d)  # the secret is not shown
    d = load("azure/gpt-4o", api_base="https://r", azure_ad_token="tok")
    assert d.azure is not None and d.azure.ad_token == "tok" and d.api_key is None


@pytest.mark.parametrize(("params", "message"), [
    ({"api_base": "https://r", "tenant_id": "t"}, "need tenant_id, client_id and client_secret"),
    ({}, "azure/ models need api_base"),
    ({"api_base": "https://r", "model": "azure/unknown-name"}, "no price"),
    # A deployment name that begins with a model's is not that model (gpt-4-32k is not
    # gpt-4): it needs model_info.base_model or a price.
    ({"api_base": "https://r", "model": "azure/gpt-4o-prod"}, "or model_info.base_model"),
])
def test_azure_refusals(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(**{"model": "azure/gpt-4o", **params})


def test_azure_settings_are_refused_elsewhere() -> None:
    with pytest.raises(ConfigError, match="only apply to azure/ models"):
        load("openai/gpt-4o", api_version="2024-10-21")


def test_the_documentation_lists_the_names_table() -> None:
    assert compat_table_markdown() in DOC.read_text()


def test_the_documentations_examples_load_priced() -> None:
    blocks = DOC.read_text().split("```yaml\n")[1:]
    assert len(blocks) == 2
    environ = {"AZURE_API_KEY": "k", "AZURE_TENANT_ID": "t", "AZURE_CLIENT_ID": "c",
               "AZURE_CLIENT_SECRET": "s", "GROQ_API_KEY": "g"}
    for block in blocks:
        config = parse_config(yaml.safe_load(block.split("```")[0]), environ=environ)
        for d in config.deployments:
            assert d.provider != "ollama" or d.priced
            assert d.provider == "ollama" or d.price.output_usd_per_token > 0


def test_azure_credentials_from_the_environment_come_after_its_key() -> None:
    env = {"AZURE_TENANT_ID": "t", "AZURE_CLIENT_ID": "c", "AZURE_CLIENT_SECRET": "s",
           "AZURE_API_BASE": "https://r"}
    d = load("azure/gpt-4o", env)
    assert d.azure is not None and d.azure.token_url == (
        "https://login.microsoftonline.com/t/oauth2/v2.0/token")
    assert d.api_key is None and d.api_base == "https://r"
    d = load("azure/gpt-4o", {**env, "AZURE_API_KEY": "k"})
    assert d.azure is not None and d.azure.token_url is None and d.api_key == "k"
