"""LiteLLM's own settings: Redis location, callbacks, retries, aliases, its example file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from triogate.app import check_redis_url
from triogate.config import load_config, parse_config
from triogate.errors import ConfigError

FIXTURE = Path(__file__).parents[2] / "fixtures" / "litellm_proxy_server_config.yaml"
ENV = {"OPENAI_API_KEY": "sk-o", "ANTHROPIC_API_KEY": "sk-a", "AZURE_API_KEY": "sk-z",
       "REDIS_HOST": "redis.internal", "REDIS_PASSWORD": "p@ss word",
       "LITELLM_MASTER_KEY": "sk-1234", "DATABASE_URL": "postgresql://u@db/litellm"}


def _model(name: str, model: str) -> dict[str, Any]:
    return {"model_name": name, "litellm_params": {"model": model}}


def _config(**sections: Any) -> dict[str, Any]:
    return {"model_list": [_model("gpt-4o", "openai/gpt-4o"), _model("claude", "anthropic/c")],
            **sections}


def test_litellms_example_names_exactly_the_unsupported_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(FIXTURE, environ=ENV)
    lines = str(info.value).splitlines()[1:]
    assert sorted(line.strip() for line in lines) == [
        "store_model_in_db: triogate has no models stored in the database (the config "
        "file's model_list is the only source) (set it to false) @ $.general_settings",
    ]


def test_litellms_tuning_of_machinery_triogate_lacks_is_accepted() -> None:
    raw = yaml.safe_load(FIXTURE.read_text())
    raw["general_settings"].update(store_model_in_db=False, proxy_batch_write_at=1,
                                   proxy_budget_rescheduler_min_time=60,
                                   proxy_budget_rescheduler_max_time=64)
    raw["litellm_settings"]["telemetry"] = False
    del raw["model_list"][2]
    parse_config(raw, environ=ENV)
    raw["litellm_settings"]["telemetry"] = True
    with pytest.raises(ConfigError, match="telemetry: triogate has no telemetry"):
        parse_config(raw, environ=ENV)


def test_litellms_example_loads_without_its_unsupported_parts() -> None:
    raw = yaml.safe_load(FIXTURE.read_text())
    del raw["general_settings"]["store_model_in_db"]
    # Its Azure deployment's name says nothing of the model: a price, or the model it
    # deploys, must be given.
    with pytest.raises(ConfigError, match=r"model_list\[2\].*no price for 'azure/chatgpt-v-2'"):
        parse_config(raw, environ=ENV)
    raw["model_list"][2]["model_info"] = {"base_model": "azure/gpt-4"}
    azure = parse_config(raw, environ=ENV).deployments[2]
    assert (azure.provider, azure.upstream_model, azure.api_key) == ("azure", "chatgpt-v-2",
                                                                     "sk-z")
    assert azure.azure is not None and azure.azure.api_version == "2023-05-15"
    del raw["model_list"][2]
    config = parse_config(raw, environ=ENV)
    # Redis: host and password from the environment, the port from environment_variables.
    assert config.settings.redis.url == "redis://:p%40ss%20word@redis.internal:6380/0"
    assert config.router.num_retries == 2  # router_settings wins over litellm_settings
    assert config.router.aliases == {"gpt-3.5-turbo-0125": "gpt-3.5-turbo"}
    assert config.router.context_window_fallbacks == {"gpt-3.5-turbo": ("gpt-3.5-turbo-large",)}
    assert config.callbacks == {"prometheus", "otel"}
    assert config.drop_params and not config.verbose
    by_group = {d.group: d for d in config.deployments}
    assert by_group["gpt-3.5-turbo-large"].provider == "openai"
    assert by_group["text-embedding-ada-002"].mode == "embedding"
    assert by_group["*"].wildcard and by_group["*"].upstream_model == "*"
    assert by_group["anthropic/*"].provider == "anthropic"
    assert not by_group["*"].priced and by_group["gpt-3.5-turbo"].drop_params
    assert "p@ss" not in repr(config)


@pytest.mark.parametrize(
    ("sections", "environ", "url"),
    [
        ({"router_settings": {"redis_host": "r1", "redis_port": 7000}}, {}, "redis://r1:7000/0"),
        ({"router_settings": {"redis_url": "redis://u:p@r2:1/2"}}, {}, "redis://u:p@r2:1/2"),
        ({"litellm_settings": {"cache_params": {"host": "c", "password": "pw"}}}, {},
         "redis://:pw@c:6379/0"),
        ({"litellm_settings": {"cache_params": {"url": "rediss://c:1/0"}}}, {},
         "rediss://c:1/0"),
        ({}, {"REDIS_HOST": "e", "REDIS_PORT": "1234"}, "redis://e:1234/0"),
        ({}, {"REDIS_URL": "redis://whole:1/0", "REDIS_HOST": "e"}, "redis://whole:1/0"),
        ({"router_settings": {"redis_host": "r1"}}, {"TRIOGATE_REDIS_URL": "redis://t:1/0"},
         "redis://t:1/0"),
        ({"triogate": {"redis": {"url": "redis://own:1/0"}},
          "router_settings": {"redis_host": "r1"}}, {"REDIS_HOST": "e"}, "redis://own:1/0"),
        ({}, {}, None),
    ],
)
def test_litellms_redis_settings_become_the_redis_url(
    sections: dict[str, Any], environ: dict[str, str], url: str | None
) -> None:
    assert parse_config(_config(**sections), environ=environ).settings.redis.url == url


@pytest.mark.parametrize(
    ("cache_params", "environ", "url"),
    [
        ({"host": "c", "username": "app", "password": "p@ss", "ssl": True,
          "ssl_ca_certs": "/etc/ca.pem"}, {},
         "rediss://app:p%40ss@c:6379/0?ssl_ca_certs=%2Fetc%2Fca.pem"),
        ({"host": "c", "ssl": "os.environ/REDIS_SSL"}, {"REDIS_SSL": "True"},
         "rediss://c:6379/0"),
        ({"host": "c", "ssl": "os.environ/REDIS_SSL"}, {"REDIS_SSL": "False"},
         "redis://c:6379/0"),
        ({}, {"REDIS_HOST": "e", "REDIS_USERNAME": "u", "REDIS_PASSWORD": "p",
              "REDIS_SSL": "true", "REDIS_SSL_CERT_REQS": "none"},
         "rediss://u:p@e:6379/0?ssl_cert_reqs=none"),
        ({"host": "c", "ssl_certfile": "/me.pem", "ssl_keyfile": "/me.key"}, {},
         "rediss://c:6379/0?ssl_certfile=%2Fme.pem&ssl_keyfile=%2Fme.key"),
        ({"service_name": "svc", "sentinel_nodes": [["s1", 26379]], "password": "pw",
          "ssl": True, "ssl_ca_certs": "/ca.pem", "sentinel_password": "sp"}, {},
         "rediss+sentinel://:pw@s1:26379/svc?ssl_ca_certs=%2Fca.pem&sentinel_password=sp"),
    ],
)
def test_litellms_redis_tls_settings_become_a_rediss_url(
    cache_params: dict[str, Any], environ: dict[str, str], url: str
) -> None:
    config = parse_config(_config(litellm_settings={"cache_params": cache_params}),
                          environ=environ)
    assert config.settings.redis.url == url
    check_redis_url(url)  # the gateway accepts what it made


def test_a_bad_redis_port_is_named() -> None:
    with pytest.raises(ConfigError, match="redis port 'abc'"):
        parse_config(_config(router_settings={"redis_host": "r", "redis_port": "abc"}))


def test_litellm_settings_num_retries_is_the_default_for_the_router() -> None:
    assert parse_config(_config(litellm_settings={"num_retries": 5})).router.num_retries == 5
    assert parse_config(_config()).router.num_retries == 2


def test_alias_forms_and_hidden_aliases() -> None:
    config = parse_config(_config(router_settings={"model_group_alias": {
        "gpt-4": "gpt-4o", "secret": {"model": "claude", "hidden": True}}}))
    assert config.router.aliases == {"gpt-4": "gpt-4o", "secret": "claude"}
    assert config.router.hidden_aliases == {"secret"}


def test_a_wildcard_model_needs_a_wildcard_name() -> None:
    with pytest.raises(ConfigError, match="has a '\\*' that model_name 'x' does not fill"):
        parse_config({"model_list": [_model("x", "openai/*")]})


def test_set_verbose_and_drop_params_per_deployment() -> None:
    raw = _config(litellm_settings={"set_verbose": True, "drop_params": True})
    raw["model_list"][1]["litellm_params"]["drop_params"] = False
    config = parse_config(raw)
    assert config.verbose
    assert [d.drop_params for d in config.deployments] == [True, False]
