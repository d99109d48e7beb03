"""The config file's shape: LiteLLM's YAML sections as users write them.

These classes mirror the YAML, LiteLLM's key names included (``timeout``,
``cooldown_time``: seconds), so a LiteLLM file loads unchanged when it uses only what
triogate supports. cattrs structures them with ``forbid_extra_keys`` (``config.py``): a
typo or an unsupported key is an error naming its path. ``config.load_config`` then
normalises them into the records the gateway uses.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from triogate.config_settings import TriogateSettings, _non_negative, _optional, _positive


@attrs.frozen(kw_only=True)
class LitellmParams:
    """``model_list[].litellm_params``. ``timeout`` is in seconds, prices in USD per token."""

    model: str
    api_base: str | None = None
    api_key: str | None = attrs.field(default=None, repr=False)
    rpm: int | None = attrs.field(default=None, validator=_optional(_positive))
    tpm: int | None = attrs.field(default=None, validator=_optional(_positive))
    timeout: float | None = attrs.field(default=None, validator=_optional(_positive))
    stream_timeout: float | None = attrs.field(default=None, validator=_optional(_positive))
    weight: float = attrs.field(default=1.0, validator=_positive)
    input_cost_per_token: float | str | None = None
    output_cost_per_token: float | str | None = None
    # triogate's mock provider only (``model: mock/<name>``):
    mock_response: str | None = None
    mock_latency_ms: float = attrs.field(default=0.0, validator=_non_negative)
    mock_first_token_ms: float | None = attrs.field(
        default=None, validator=_optional(_non_negative)
    )
    mock_output_tokens: int | None = attrs.field(default=None, validator=_optional(_positive))
    mock_failure_rate: float = attrs.field(
        default=0.0, validator=[_non_negative, attrs.validators.le(1)]
    )
    mock_failure_status: int = 500
    #: LiteLLM's per-deployment ``drop_params``: drop what this provider cannot take.
    drop_params: bool | None = None
    # Azure OpenAI only (``model: azure/<deployment>``):
    #: Azure: the ``api-version`` query parameter (default ``AZURE_API_VERSION``, else
    #: 2024-10-21).
    api_version: str | None = None
    #: Azure: a static Entra ID bearer token, instead of ``api_key``.
    azure_ad_token: str | None = attrs.field(default=None, repr=False)
    #: Azure: the Entra ID tenant for client credentials (default ``AZURE_TENANT_ID``).
    tenant_id: str | None = None
    #: Azure: the application (client) id for client credentials (``AZURE_CLIENT_ID``).
    client_id: str | None = None
    #: Azure: the client secret for client credentials (``AZURE_CLIENT_SECRET``).
    client_secret: str | None = attrs.field(default=None, repr=False)
    #: Azure: where Entra ID issues tokens (``AZURE_AUTHORITY_HOST``, default
    #: https://login.microsoftonline.com).
    azure_authority_host: str | None = None
    # Cloud providers (bedrock/, gemini/, vertex_ai/): see config_cloud.CloudParams.
    #: Bedrock: the AWS access key id (default ``AWS_ACCESS_KEY_ID``).
    aws_access_key_id: str | None = None
    #: Bedrock: the AWS secret access key (default ``AWS_SECRET_ACCESS_KEY``).
    aws_secret_access_key: str | None = attrs.field(default=None, repr=False)
    #: Bedrock: the session token of temporary credentials (``AWS_SESSION_TOKEN``).
    aws_session_token: str | None = attrs.field(default=None, repr=False)
    #: Bedrock: the AWS region (``AWS_REGION_NAME``, ``AWS_REGION``, ``AWS_DEFAULT_REGION``).
    aws_region_name: str | None = None
    #: Vertex AI: the Google Cloud project (``VERTEXAI_PROJECT``, ``GOOGLE_CLOUD_PROJECT``).
    vertex_project: str | None = None
    #: Vertex AI: the region (``VERTEXAI_LOCATION``; default us-central1).
    vertex_location: str | None = None
    #: Vertex AI: a service-account JSON: its file's path, its text or a mapping
    #: (``GOOGLE_APPLICATION_CREDENTIALS``).
    vertex_credentials: Any = attrs.field(
        default=None, repr=False,
        validator=_optional(attrs.validators.instance_of((str, dict))))
    #: Vertex AI: where the service account's JWT is exchanged for an access token
    #: (default: the credentials' ``token_uri``, else Google's).
    vertex_token_url: str | None = None
    #: An ``http://`` proxy for this deployment (else ``triogate.http.proxy``, else the
    #: environment's ``HTTPS_PROXY``/``HTTP_PROXY`` outside ``NO_PROXY``).
    proxy: str | None = attrs.field(default=None, repr=False)
    #: TLS verification: true, false, or a CA bundle's path (else ``triogate.http``'s).
    ssl_verify: bool | str | None = None


@attrs.frozen(kw_only=True)
class ModelEntry:
    """One ``model_list`` item: a deployment of the model group ``model_name``."""

    model_name: str
    litellm_params: LitellmParams
    model_info: dict[str, Any] = attrs.Factory(dict)


@attrs.frozen(kw_only=True)
class RouterSettingsFile:
    """``router_settings``. ``timeout`` and ``cooldown_time`` are in seconds."""

    routing_strategy: str = "simple-shuffle"
    num_retries: int | None = attrs.field(default=None, validator=_optional(_non_negative))
    timeout: float | None = attrs.field(default=None, validator=_optional(_positive))
    allowed_fails: int = attrs.field(default=3, validator=_non_negative)
    cooldown_time: float = attrs.field(default=5.0, validator=_non_negative)
    retry_after: float = attrs.field(default=0.0, validator=_non_negative)
    fallbacks: list[dict[str, list[str]]] = attrs.Factory(list)
    context_window_fallbacks: list[dict[str, list[str]]] = attrs.Factory(list)
    #: alias → group, or alias → ``{model: group, hidden: bool}`` (LiteLLM's two forms).
    model_group_alias: dict[str, str | dict[str, Any]] = attrs.Factory(dict)
    # LiteLLM's Redis settings: they become the Redis URL (see ``compat.redis_url``).
    redis_host: str | None = None
    redis_port: int | str | None = None
    redis_password: str | None = attrs.field(default=None, repr=False)
    redis_url: str | None = attrs.field(default=None, repr=False)


def _only_false(what: str) -> Any:
    """A validator: ``False`` only, else a message saying triogate has no ``what``."""

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value:
            raise ValueError(f"{attribute.name}: triogate has no {what} (set it to false)")

    return check


@attrs.frozen(kw_only=True)
class GeneralSettingsFile:
    """``general_settings``: the subset triogate supports.

    ``proxy_batch_write_at`` and ``proxy_budget_rescheduler_min_time|max_time`` tune
    LiteLLM machinery triogate does not have (a periodic spend writer, a budget-reset
    job: spend rows are written in batches as requests end, budget periods follow the
    clock), so they are accepted and change nothing.
    """

    master_key: str | None = attrs.field(default=None, repr=False)
    database_url: str | None = attrs.field(default=None, repr=False)
    proxy_batch_write_at: float | None = attrs.field(default=None,
                                                     validator=_optional(_positive))
    proxy_budget_rescheduler_min_time: float | None = attrs.field(
        default=None, validator=_optional(_positive))
    proxy_budget_rescheduler_max_time: float | None = attrs.field(
        default=None, validator=_optional(_positive))
    #: Where budget alerts go: ``["webhook"]`` posts them to ``alerting_webhook_url``.
    alerting: list[str] = attrs.Factory(list)
    #: The webhook budget alerts are POSTed to (Slack-compatible JSON), with ``alerting``.
    alerting_webhook_url: str | None = attrs.field(default=None, repr=False)
    store_model_in_db: bool = attrs.field(
        default=False, validator=_only_false("models stored in the database (the config "
                                             "file's model_list is the only source)"))
    #: Keep each request's messages and its answer on its spend-log row (off: users' data).
    store_prompts_in_spend_logs: bool = False


@attrs.frozen(kw_only=True)
class CacheParamsFile:
    """``litellm_settings.cache_params``: only the Redis cache exists here."""

    type: Literal["redis"] = "redis"
    ttl: float = attrs.field(default=600.0, validator=_positive)
    host: str | None = None
    port: int | str | None = None
    password: str | None = attrs.field(default=None, repr=False)
    url: str | None = attrs.field(default=None, repr=False)
    redis_url: str | None = attrs.field(default=None, repr=False)
    #: Redis Sentinel: the sentinels, ``[[host, port], ...]`` or ``["host:port", ...]``
    #: (with ``service_name``, they become a ``redis+sentinel://`` URL).
    sentinel_nodes: list[Any] | None = None
    #: Redis Sentinel: another spelling of ``sentinel_nodes``.
    redis_sentinel_nodes: list[Any] | None = None
    #: Redis Sentinel: the monitored service's name (``sentinel monitor NAME``).
    service_name: str | None = None
    #: Redis Sentinel: the sentinels' own password (``password`` is the primary's).
    sentinel_password: str | None = attrs.field(default=None, repr=False)
    #: The Redis ACL user (with ``password``) when the server is named by ``host``.
    username: str | None = None
    #: TLS to Redis (``rediss://``): ``true``, or ``"True"`` from ``os.environ/REDIS_SSL``.
    ssl: str | None = None
    #: TLS: a PEM file of the certificate authorities to trust (a private CA).
    ssl_ca_certs: str | None = None
    #: TLS: a client certificate (PEM), for servers that ask for one.
    ssl_certfile: str | None = None
    #: TLS: the client certificate's key (PEM).
    ssl_keyfile: str | None = None
    #: TLS: ``required`` (the default), ``optional`` or ``none`` (no check).
    ssl_cert_reqs: str | None = None


@attrs.frozen(kw_only=True)
class LitellmSettingsFile:
    """``litellm_settings``: the subset triogate supports (the rest is refused by name)."""

    cache: bool = False
    cache_params: CacheParamsFile = attrs.Factory(CacheParamsFile)
    request_timeout: float | None = attrs.field(default=None, validator=_optional(_positive))
    num_retries: int | None = attrs.field(default=None, validator=_optional(_non_negative))
    drop_params: bool = False
    set_verbose: bool = False
    json_logs: bool = False
    telemetry: bool = attrs.field(
        default=False, validator=_only_false("telemetry (it never reports usage anywhere)"))
    #: Only the built-in ones: ``prometheus`` (always on at /metrics) and ``otel``.
    callbacks: list[str] | str = attrs.Factory(list)
    success_callback: list[str] = attrs.Factory(list)
    failure_callback: list[str] = attrs.Factory(list)
    context_window_fallbacks: list[dict[str, list[str]]] = attrs.Factory(list)
    #: The proxy-wide budget (USD) every governed request reserves against, per
    #: ``budget_duration`` (``30s``, ``1h``, ``1d``, ``30d``; unset: for ever).
    max_budget: float | str | None = None
    #: How often the proxy-wide budget's spend starts again (``30s``, ``1h``, ``1d``, ...).
    budget_duration: str | None = None


@attrs.frozen(kw_only=True)
class ConfigFile:
    """The whole YAML file."""

    model_list: list[ModelEntry] = attrs.Factory(list)
    router_settings: RouterSettingsFile = attrs.Factory(RouterSettingsFile)
    general_settings: GeneralSettingsFile = attrs.Factory(GeneralSettingsFile)
    litellm_settings: LitellmSettingsFile = attrs.Factory(LitellmSettingsFile)
    #: LiteLLM's ``guardrails:`` list, checked by ``config_guardrails``.
    guardrails: list[dict[str, Any]] = attrs.Factory(list)
    triogate: TriogateSettings = attrs.Factory(TriogateSettings)
