"""Cloud deployments in the config: LiteLLM's keys, the environment's defaults, errors."""

from __future__ import annotations

from typing import Any

import pytest

from triogate.config import parse_config
from triogate.errors import ConfigError
from triogate.routing.models import _table, table_price


def load(params: dict[str, Any], environ: dict[str, str] | None = None) -> Any:
    config = parse_config({"model_list": [{"model_name": "m", "litellm_params": params}]},
                          environ=environ or {})
    return config.deployments[0]


def test_bedrock_credentials_come_from_the_standard_environment() -> None:
    deployment = load({"model": "bedrock/converse/meta.llama3-1-70b-instruct-v1:0"}, {
        "AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "S3CR3T-VALUE",
        "AWS_SESSION_TOKEN": "SESSION-VALUE", "AWS_DEFAULT_REGION": "eu-central-1"})
    assert deployment.provider == "bedrock"
    assert deployment.upstream_model == "converse/meta.llama3-1-70b-instruct-v1:0"
    cloud = deployment.cloud
    assert (cloud.aws_access_key_id, cloud.aws_region_name) == ("AKID", "eu-central-1")
    assert cloud.aws_secret_access_key == "S3CR3T-VALUE"
    assert cloud.aws_session_token == "SESSION-VALUE"
    assert "S3CR3T" not in repr(deployment) and "SESSION-VALUE" not in repr(deployment)


def test_the_deployments_own_settings_win_over_the_environment() -> None:
    deployment = load({"model": "bedrock/amazon.titan-embed-text-v2:0",
                       "aws_region_name": "us-west-2", "aws_access_key_id": "mine",
                       "aws_secret_access_key": "s"}, {"AWS_REGION": "eu-west-1"})
    assert deployment.cloud.aws_region_name == "us-west-2"
    assert deployment.cloud.aws_access_key_id == "mine"


def test_vertex_settings_and_gemini_key() -> None:
    vertex = load({"model": "vertex_ai/gemini-1.5-pro", "vertex_project": "p",
                   "vertex_credentials": {"client_email": "a@b", "private_key": "k"}},
                  {"VERTEXAI_LOCATION": "europe-west4"})
    assert vertex.cloud.vertex_location == "europe-west4"
    assert vertex.cloud.vertex_credentials == {"client_email": "a@b", "private_key": "k"}
    gemini = load({"model": "gemini/gemini-2.0-flash"}, {"GEMINI_API_KEY": "g-key"})
    assert gemini.api_key == "g-key" and gemini.provider == "gemini"


@pytest.mark.parametrize(("params", "message"), [
    ({"model": "bedrock/x", "aws_access_key_id": "a", "aws_secret_access_key": "s"},
     "aws_region_name"),
    ({"model": "bedrock/x", "aws_region_name": "us-east-1"}, "aws_access_key_id"),
    ({"model": "vertex_ai/gemini-1.5-pro", "vertex_credentials": "/x.json"},
     "vertex_project"),
    ({"model": "vertex_ai/gemini-1.5-pro", "vertex_project": "p"}, "vertex_credentials"),
    ({"model": "vertex_ai/g", "vertex_project": "p", "vertex_credentials": 3},
     "vertex_credentials"),
])
def test_an_incomplete_cloud_deployment_is_refused_at_load(
    params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load(params)


@pytest.mark.parametrize("model", [
    "gemini/gemini-2.0-flash", "gemini/gemini-2.5-flash", "gemini/gemini-3-pro-preview",
    "gemini/text-embedding-004", "vertex_ai/gemini-1.5-pro", "vertex_ai/text-embedding-005",
    "vertex_ai/claude-3-5-sonnet-v2@20241022",
    "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0",
    "bedrock/meta.llama3-1-70b-instruct-v1:0", "bedrock/amazon.titan-embed-text-v2:0",
    "bedrock/cohere.embed-english-v3"])
def test_the_cloud_models_named_in_tests_and_docs_have_list_prices(model: str) -> None:
    """Listed as provider/model, as LiteLLM's other provider names are."""
    assert model in _table()
    assert model.endswith("text-embedding-004") or table_price(model).input_usd_per_token > 0


def test_cloud_models_are_priced_from_the_table_or_refused() -> None:
    """A cloud deployment takes the packaged list price (a Bedrock id through its API route
    and cross-region profile prefixes); one the table does not know must give its own."""
    aws = {"aws_region_name": "us-east-1", "aws_access_key_id": "a",
           "aws_secret_access_key": "s"}
    config = parse_config({"model_list": [{"model_name": "c", "litellm_params": {
        "model": "bedrock/converse/us.anthropic.claude-3-5-sonnet-20241022-v2:0", **aws}}]})
    (deployment,) = config.deployments
    assert float(deployment.price.input_usd_per_token) == pytest.approx(3e-6)
    with pytest.raises(ConfigError, match="no price"):
        parse_config({"model_list": [{"model_name": "c", "litellm_params": {
            "model": "bedrock/acme.unknown-model-v1:0", **aws}}]})
    with pytest.raises(ConfigError, match="no price"):
        parse_config({"model_list": [{"model_name": "g", "litellm_params": {
            "model": "gemini/gemini-unknown", "api_key": "k"}}]})
