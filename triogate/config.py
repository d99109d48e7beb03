"""Configuration: LiteLLM's YAML shape for the common subset, plus a ``triogate:`` section.

Two layers. The *file* classes (``ConfigFile`` and below) mirror the YAML as users write
it, LiteLLM's key names included (``timeout``, ``cooldown_time``: seconds), so a LiteLLM
file loads unchanged when it uses only what triogate supports. cattrs structures them with
``forbid_extra_keys``: a typo or an unsupported key is an error naming its path, never
silence. :func:`load_config` then normalises the file into :class:`GatewayConfig`, the
frozen record the gateway uses, with units in every name (``timeout_s``).

Environment variables are read in one place: ``os.environ/NAME`` and ``${NAME}`` in
values are resolved here from the mapping the caller passes (``cli.py`` passes
``os.environ``), and ``TRIOGATE_REDIS_URL``, ``TRIOGATE_DATABASE_URL`` and
``TRIOGATE_MASTER_KEY`` override the file.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import urllib.parse
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import cattrs
import yaml
from cattrs.errors import ClassValidationError
from cattrs.v import format_exception

from triogate import LITELLM_VERSION as LITELLM_VERSION
from triogate import __version__, config_cloud, config_litellm
from triogate.config_governance import GovernanceFeatures, governance_features
from triogate.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

#: triogate's own version (readiness shows it next to ``LITELLM_VERSION``).
TRIOGATE_VERSION = __version__
PROVIDERS: tuple[str, ...] = ("openai", "anthropic", "mock")
# Azure OpenAI and LiteLLM's OpenAI-compatible provider names (config_litellm).
#: Provider names served by the OpenAI-compatible provider.
OPENAI_COMPATIBLE: tuple[str, ...] = tuple(config_litellm.COMPAT_PROVIDERS)
PROVIDERS += ("azure", *OPENAI_COMPATIBLE, *config_cloud.CLOUD_PROVIDERS)
#: Providers whose deployments must be priced: by the config or the packaged table.
PRICE_REQUIRED = ("azure", *OPENAI_COMPATIBLE, *config_cloud.CLOUD_PROVIDERS)
#: Where Entra ID issues tokens (``azure_authority_host``; LiteLLM's AZURE_AUTHORITY_HOST).
AZURE_AUTHORITY_HOST = "https://login.microsoftonline.com"
AZURE_API_VERSION = "2024-10-21"
STRATEGIES = (
    "simple-shuffle",
    "least-busy",
    "usage-based-routing",
    "usage-based-routing-v2",
    "latency-based-routing",
)
FailurePolicy = Literal["fail-open", "fail-closed"]

_positive: Any = attrs.validators.gt(0)
_non_negative: Any = attrs.validators.ge(0)


def _optional(validator: Any) -> Any:
    return attrs.validators.optional(validator)


# --------------------------------------------------------------------------- the file


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
class RedisSettings:
    """Where counters, caches and routing state live, and how long to wait for them."""

    url: str | None = attrs.field(default=None, repr=False)
    timeout_s: float = attrs.field(default=0.5, validator=_positive)
    pool_size: int = attrs.field(default=64, validator=_positive)
    #: How long the embedded server (no ``url``) may not answer before liveness fails.
    liveness_grace_s: float = attrs.field(default=30.0, validator=_positive)
    #: With Redis Sentinel or a Redis Cluster: replicas (of each node, on a cluster) that
    #: must acknowledge every pipeline's writes (``WAIT``) before they count as done. 0:
    #: none (replication stays asynchronous, and writes of the last moment before a
    #: failover can be lost with the old primary).
    wait_replicas: int = attrs.field(default=0, validator=_non_negative)


@attrs.frozen(kw_only=True)
class PolicySettings:
    """What each check does when Redis does not answer in time."""

    budgets: FailurePolicy = "fail-open"
    rate_limits: FailurePolicy = "fail-open"


@attrs.frozen(kw_only=True)
class GovernanceSettings:
    """Budgets and limits knobs that are not per key."""

    identity_ttl_s: float = attrs.field(default=60.0, validator=_positive)
    #: Output tokens assumed when a request sets no max_tokens (estimates only).
    default_max_output_tokens: int = attrs.field(default=1024, validator=_positive)
    #: Cap on the output tokens an estimate reserves, whatever max_tokens says.
    max_reserved_output_tokens: int = attrs.field(default=4096, validator=_positive)
    #: Output a stream may bring when its request sets no max_tokens: past it (by a
    #: quarter) the stream is ended, so a runaway upstream cannot bill without bound.
    default_max_stream_output_tokens: int = attrs.field(default=16384, validator=_positive)
    #: How long a parallel-request slot or a reservation outlives a dead process.
    lease_s: float = attrs.field(default=600.0, validator=_positive)
    end_user_header: str = "x-end-user-id"
    #: Settle one principal's requests of a settler flush with one script call
    #: (``budget_settle_many.lua``), not one call each: exact, cheaper for Redis.
    merge_settlements: bool = True


@attrs.frozen(kw_only=True)
class ResponseCacheSettings:
    """``triogate.cache``: who may share cached answers, and how big one may be.

    ``scope``: ``team`` (the default: a key in a team shares with its team, a key
    without one only with itself), ``key``, or ``global`` (LiteLLM's behaviour: every
    caller shares; a hit then tells a caller that someone else asked the same).
    """

    scope: Literal["team", "key", "global"] = "team"
    max_entry_bytes: int = attrs.field(default=1_000_000, validator=_positive)


@attrs.frozen(kw_only=True)
class HttpSettings:
    """``triogate.http``: who may read ``/metrics``, and which browser origins may call.

    ``metrics_key``: when set, ``GET /metrics`` needs ``Authorization: Bearer`` with it
    (or the master key); unset, ``/metrics`` is open, as Prometheus scrapers expect.
    ``cors_allow_origins``: origins (``https://app.example``, or ``"*"``) whose browsers
    may call the gateway; preflight ``OPTIONS`` requests are answered for them.
    ``body_read_timeout_s``: a request head must be complete this long after its first
    byte, and a body may go this long without a byte; otherwise the request is answered
    408 and its connection closed (a head trickled a byte at a time is not kept alive).
    ``max_connections``: client connections one worker keeps open at once; at the bound
    an idle kept-alive one is closed for a newcomer, and with none idle newcomers wait in
    the listen queue. Unset: what the open-files limit leaves room for, one upstream
    connection each (``triogate.server._limits``).
    ``max_body_read_s``: a whole request body must arrive within this long after its
    head, however steadily it comes; otherwise 408 and the connection closed.
    ``max_unauthenticated_bodies``: request bodies one worker reads at once for keys not
    yet known to be valid (none in memory); they hold no ``max_in_flight`` slot while
    they arrive, and the others wait their turn (the wait and the read within
    ``max_body_read_s``). A request without any key is refused 401 on its head, before
    its body is read.
    """

    metrics_key: str | None = attrs.field(default=None, repr=False)
    cors_allow_origins: list[str] = attrs.Factory(list)
    cors_max_age_s: int = attrs.field(default=600, validator=_non_negative)
    body_read_timeout_s: float = attrs.field(default=30.0, validator=_positive)
    max_connections: int | None = attrs.field(default=None, validator=_optional(_positive))
    max_body_read_s: float = attrs.field(default=60.0, validator=_positive)
    max_unauthenticated_bodies: int = attrs.field(default=32, validator=_positive)

    #: An upstream's whole (not streamed) answer, error bodies included, is refused past
    #: this many bytes: the client gets 502, the upstream connection is dropped.
    max_upstream_body_bytes: int = attrs.field(default=32 * 1024 * 1024, validator=_positive)
    #: One event of an upstream stream is refused past this many bytes (the stream ends
    #: with an error event, as on any upstream failure).
    max_upstream_event_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=_positive)
    #: The proxy of every deployment that names none (``http://[user:pass@]host:port``).
    proxy: str | None = attrs.field(default=None, repr=False)
    #: TLS verification of every deployment that says nothing: true (``SSL_CERT_FILE``'s
    #: bundle, else certifi's), false, or a CA bundle's path.
    ssl_verify: bool | str = True
    #: A non-streamed request whose client closes its connection before the answer
    #: (its end of file: it left, or only half-closed) cancels its upstream call and is
    #: settled as cancelled at once. False: the call runs on and a half-closed client
    #: still gets its answer.
    cancel_when_client_leaves: bool = True


@attrs.frozen(kw_only=True)
class KeyRotationSettings:
    """``triogate.key_rotation``: the scheduled rotation of keys with ``auto_rotate``.

    ``check_interval_s``: how often each process looks for keys due (one of them
    rotates each key). ``grace_period_s``: how long a rotated-out secret keeps working.
    ``secrets_dir``: where each new secret is written (a file named by the key's alias,
    else its id, mode 0600), for a secret-sync agent to pick up; unset, the new secret
    is shown to nobody and the key's holder asks an admin for one.
    """

    #: How often each process looks for keys due for rotation (one of them rotates each).
    check_interval_s: float = attrs.field(default=60.0, validator=_positive)
    #: How long a rotated-out secret keeps working (0: refused at once).
    grace_period_s: float = attrs.field(default=0.0, validator=_non_negative)
    #: Where each new secret is written (a mode-0600 file per key) for a secret-sync agent.
    secrets_dir: str | None = None


@attrs.frozen(kw_only=True)
class TriogateSettings:
    """The ``triogate:`` section: everything LiteLLM's file has no name for."""

    state_dir: str = ".triogate"
    redis: RedisSettings = attrs.Factory(RedisSettings)
    policies: PolicySettings = attrs.Factory(PolicySettings)
    governance: GovernanceSettings = attrs.Factory(GovernanceSettings)
    cache: ResponseCacheSettings = attrs.Factory(ResponseCacheSettings)
    http: HttpSettings = attrs.Factory(HttpSettings)
    key_rotation: KeyRotationSettings = attrs.Factory(KeyRotationSettings)
    tracing: bool = False
    log_prompts: bool = False
    max_body_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=_positive)
    shutdown_grace_s: float = attrs.field(default=5.0, validator=_non_negative)
    post_call_deadline_s: float = attrs.field(default=1.0, validator=_positive)
    #: Group-commit delay of the settler: a request's post-call writes leave this long
    #: after they were queued, longer (up to four times) while other requests are in
    #: their pre-call checks (``batch.Settler``'s ``delay_s`` and ``busy``; shutdown's
    #: drain does not wait). With one client, a flush sent as the response leaves lands
    #: on the next request's pre-call work; 5 ms later it lands in that request's
    #: upstream wait instead, and under load more requests share a flush
    #: (``bench/load.py``). A settlement that gives back a parallel-request
    #: slot leaves at once (``PostCallBatch.hurry``): a client under
    #: ``max_parallel_requests`` may send its next request as soon as it has the answer.
    #: Meanwhile a budget still holds the request's estimate and a TPM window its
    #: estimated tokens (never less than the actual cost), so a check in those few ms can
    #: only be stricter, never looser. 0: flush at once.
    post_call_settle_delay_s: float = attrs.field(default=0.005, validator=_non_negative)
    spend_log_interval_s: float = attrs.field(default=1.0, validator=_positive)
    spend_log_batch_rows: int = attrs.field(default=500, validator=_positive)
    upstream_max_connections: int = attrs.field(default=1000, validator=_positive)
    #: Most retries a request may ask for (body ``num_retries``, ``x-litellm-num-retries``).
    max_request_retries: int = attrs.field(default=5, validator=_non_negative)
    #: Requests one worker serves at once; beyond, a request is answered 503 at once
    #: (``Retry-After``) instead of queueing behind the others. 0: no limit.
    max_in_flight: int = attrs.field(default=1000, validator=_non_negative)
    #: Requests one worker runs through the pre-call checks at once (``api/gate.py``);
    #: the others wait, in arrival order, up to ``max_admission_wait_s``, then get 503
    #: with ``Retry-After``. Bounds the CPU queue in front of the Redis round trip, so
    #: checks are not failed open under a burst. 0: no bound.
    max_admitting: int = attrs.field(default=64, validator=_non_negative)
    max_admission_wait_s: float = attrs.field(default=5.0, validator=_non_negative)
    #: Longest a stream waits between a client write and its next upstream read while
    #: the worker is behind (``api/pacing.py``): the next read then carries the chunks
    #: of the whole window and one write sends them, instead of every stream waking per
    #: chunk and new requests waiting seconds for their first token. A worker that
    #: keeps up holds nothing; a stream's first event is never held. 0: never hold.
    stream_coalesce_window_s: float = attrs.field(
        default=0.1, validator=[_non_negative, attrs.validators.le(1)])


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


# --------------------------------------------------------------------------- normalised


@attrs.frozen(kw_only=True)
class MockSettings:
    """Behaviour of a ``mock/`` deployment (deterministic; for tests and benchmarks)."""

    response: str | None = None
    latency_s: float = 0.0
    first_token_s: float | None = None
    output_tokens: int | None = None
    failure_rate: float = 0.0
    failure_status: int = 500


@attrs.frozen(kw_only=True)
class AzureSettings:
    """How an ``azure/`` deployment is called and authenticated.

    One of: ``api_key`` (on the deployment, sent as ``api-key``), ``ad_token`` (a static
    Entra ID bearer token), or client credentials (``tenant_id``, ``client_id``,
    ``client_secret``) exchanged at ``token_url`` for bearer tokens.
    """

    api_version: str
    ad_token: str | None = attrs.field(default=None, repr=False)
    tenant_id: str | None = None
    client_id: str | None = None
    client_secret: str | None = attrs.field(default=None, repr=False)
    token_url: str | None = None


@attrs.frozen(kw_only=True)
class Price:
    """USD per token, kept as exact decimals; costs come out in integer nano-USD.

    The prices are also kept as integers over one denominator (nano-USD per token times
    ``_den``), so that :meth:`cost_nanousd`, computed two to four times per request,
    is integer arithmetic: exact for any token count, where Decimal's 28 digits round.
    """

    input_usd_per_token: Decimal = Decimal(0)
    output_usd_per_token: Decimal = Decimal(0)
    _in: int = attrs.field(init=False, repr=False, eq=False)
    _out: int = attrs.field(init=False, repr=False, eq=False)
    _den: int = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        inp, out = self.input_usd_per_token, self.output_usd_per_token
        if not (inp.is_finite() and out.is_finite()):
            num_in = num_out = den = 0  # cost_nanousd keeps to Decimal (and its errors)
        else:
            num_in, den_in = inp.as_integer_ratio()
            num_out, den_out = out.as_integer_ratio()
            den = math.lcm(den_in, den_out)
            num_in *= den // den_in * 1_000_000_000
            num_out *= den // den_out * 1_000_000_000
        object.__setattr__(self, "_in", num_in)
        object.__setattr__(self, "_out", num_out)
        object.__setattr__(self, "_den", den)

    def cost_nanousd(self, input_tokens: int, output_tokens: int) -> int:
        """Cost of a call, rounded half-up (away from zero) to a whole nano-dollar."""
        den = self._den
        if not den:
            usd = (input_tokens * self.input_usd_per_token
                   + output_tokens * self.output_usd_per_token)
            return int((usd * 1_000_000_000).to_integral_value(rounding="ROUND_HALF_UP"))
        total = input_tokens * self._in + output_tokens * self._out
        whole, rest = divmod(abs(total), den)
        if 2 * rest >= den:
            whole += 1
        return whole if total >= 0 else -whole


@attrs.frozen(kw_only=True)
class Deployment:
    """One upstream model endpoint, member of the model group ``group``."""

    id: str
    group: str
    provider: str
    upstream_model: str
    api_base: str | None
    api_key: str | None = attrs.field(repr=False)
    rpm: int | None
    tpm: int | None
    timeout_s: float
    stream_timeout_s: float
    weight: float
    price: Price
    mode: str
    mock: MockSettings | None
    info: Mapping[str, Any]
    drop_params: bool = False
    #: Whether the config gave a price (else a wildcard's model is priced from the table).
    priced: bool = True
    azure: AzureSettings | None = None
    #: Credentials and placement of a bedrock/, gemini/ or vertex_ai/ deployment.
    cloud: config_cloud.CloudParams | None = None
    #: The proxy to reach it through (None: the environment's, if any).
    proxy: str | None = attrs.field(default=None, repr=False)
    #: TLS verification: True, False, or a CA bundle's path.
    ssl_verify: bool | str = True

    @property
    def wildcard(self) -> bool:
        """A ``*`` deployment: the requested model goes to the provider as it is."""
        return "*" in self.group


@attrs.frozen(kw_only=True)
class RouterSettings:
    """Routing and retry policy, normalised (seconds in ``_s`` fields)."""

    strategy: str
    num_retries: int
    timeout_s: float | None
    allowed_fails: int
    cooldown_s: float
    retry_after_s: float
    fallbacks: Mapping[str, tuple[str, ...]]
    context_window_fallbacks: Mapping[str, tuple[str, ...]] = attrs.Factory(dict)
    #: ``model_group_alias``: alias → group.
    aliases: Mapping[str, str] = attrs.Factory(dict)
    #: Aliases LiteLLM's ``hidden: true`` keeps out of ``/v1/models``.
    hidden_aliases: frozenset[str] = frozenset()


@attrs.frozen(kw_only=True)
class CacheSettings:
    """The response cache."""

    enabled: bool
    ttl_s: float


@attrs.frozen(kw_only=True)
class OtelSettings:
    """Where OpenTelemetry spans go (``callbacks: [otel]``): OTLP over HTTP, JSON."""

    endpoint: str
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    service_name: str = "triogate"
    queue_spans: int = 4096
    batch_spans: int = 512
    interval_s: float = 1.0
    timeout_s: float = 5.0


@attrs.frozen(kw_only=True)
class GatewayConfig:
    """Everything the gateway needs, validated and normalised. Frozen: reload swaps it."""

    deployments: tuple[Deployment, ...]
    router: RouterSettings
    master_key: str | None = attrs.field(repr=False)
    database_url: str | None = attrs.field(repr=False)
    cache: CacheSettings
    request_timeout_s: float | None
    settings: TriogateSettings
    source: str
    drop_params: bool = False
    verbose: bool = False
    #: Built-in callbacks switched on (``prometheus``, ``otel``).
    callbacks: frozenset[str] = frozenset()
    otel: OtelSettings | None = None
    #: Proxy-wide budget, alerting and guardrails (``config_governance``).
    governance: GovernanceFeatures = attrs.Factory(GovernanceFeatures)
    #: ``general_settings.store_prompts_in_spend_logs``.
    store_prompts_in_spend_logs: bool = False

    @property
    def groups(self) -> dict[str, tuple[Deployment, ...]]:
        """Model group name → its deployments, in file order."""
        out: dict[str, list[Deployment]] = {}
        for d in self.deployments:
            out.setdefault(d.group, []).append(d)
        return {k: tuple(v) for k, v in out.items()}

    @property
    def state_dir(self) -> Path:
        return Path(self.settings.state_dir)


# --------------------------------------------------------------------------- loading

_converter = cattrs.Converter(forbid_extra_keys=True)


def _price(value: Any, _: Any) -> float | str | None:
    """Prices stay as written (float or string, e.g. ``1e-6`` which YAML 1.1 reads as a
    string); ``_decimal`` turns them into exact decimals and names the field on error."""
    if value is None or (isinstance(value, (int, float, str)) and not isinstance(value, bool)):
        return value
    raise ValueError(f"expected a number, got {value!r}")


_converter.register_structure_hook(float | str | None, _price)


def _scalar(value: Any, _: Any) -> Any:
    """A port: a number or a string (``os.environ/REDIS_PORT`` expands to a string)."""
    if value is None or (isinstance(value, (int, str)) and not isinstance(value, bool)):
        return value
    raise ValueError(f"expected a number or a string, got {value!r}")


def _names(value: Any, _: Any) -> list[str] | str:
    if isinstance(value, str) or (isinstance(value, list)
                                  and all(isinstance(v, str) for v in value)):
        return value
    raise ValueError(f"expected a name or a list of names, got {value!r}")


def _alias_target(value: Any, _: Any) -> str | dict[str, Any]:
    if isinstance(value, (str, dict)):
        return value
    raise ValueError(f"expected a model group or a mapping, got {value!r}")


def _verify(value: Any, _: Any) -> bool | str | None:
    """``ssl_verify``: true, false, or a CA bundle's path."""
    if value is None or isinstance(value, (bool, str)):
        return value
    raise ValueError(f"expected true, false or a CA bundle's path, got {value!r}")


_converter.register_structure_hook(int | str | None, _scalar)
_converter.register_structure_hook(bool | str | None, _verify)
_converter.register_structure_hook(bool | str, _verify)
_converter.register_structure_hook(list[str] | str, _names)
_converter.register_structure_hook(str | dict[str, Any], _alias_target)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEFAULT_TIMEOUT_S = 600.0


def expand_env(value: Any, environ: Mapping[str, str], path: str = "$") -> Any:
    """Resolve ``os.environ/NAME`` (LiteLLM) and ``${NAME}`` in every string of ``value``.

    Raises:
        ConfigError: a referenced variable is not set (the message names the key path).
    """
    if isinstance(value, dict):
        return {k: expand_env(v, environ, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, environ, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    if value.startswith("os.environ/"):
        name = value.removeprefix("os.environ/")
        if name not in environ:
            raise ConfigError(f"{path}: environment variable {name} is not set")
        return environ[name]

    def sub(match: re.Match[str]) -> str:
        if match.group(1) not in environ:
            raise ConfigError(f"{path}: environment variable {match.group(1)} is not set")
        return environ[match.group(1)]

    return _ENV_REF.sub(sub, value)


def _describe(exc: BaseException, type_: Any) -> str:
    """Validators' own messages (``'rpm' must be > 0: -1``) beat cattrs' "invalid value"."""
    if isinstance(exc, ValueError) and not isinstance(exc, cattrs.BaseValidationError) and str(exc):
        return str(exc)
    return format_exception(exc, type_)


def _format_errors(exc: ClassValidationError, source: str) -> str:
    lines = []
    for message in cattrs.transform_error(exc, path="$", format_exception=_describe):
        extra = re.match(r"extra fields found \((.*)\) @ (.*)", message)
        if extra:
            for name in extra.group(1).split(", "):
                lines.append(f"{extra.group(2)}.{name}: unsupported key (not known to triogate)")
        else:
            lines.append(message)
    return f"invalid configuration in {source}:\n  " + "\n  ".join(lines)


def _decimal(value: float | str | None, path: str) -> Decimal:
    if value is None:
        return Decimal(0)
    try:
        result = Decimal(str(value))
    except InvalidOperation as exc:
        raise ConfigError(f"{path}: not a number: {value!r}") from exc
    if result < 0:
        raise ConfigError(f"{path}: must be >= 0")
    return result


def _egress(path: str, proxy: str | None, ssl_verify: bool | str) -> None:
    """Check a ``proxy`` and ``ssl_verify`` pair at load time."""
    if proxy is not None:
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if parts.scheme != "http" or not parts.hostname:
            raise ConfigError(f"{path}.proxy: must be an http://host:port URL")
    if isinstance(ssl_verify, str) and not os.path.isfile(ssl_verify):
        raise ConfigError(f"{path}.ssl_verify: {ssl_verify!r} is not a CA bundle file "
                          "(give true, false, or a PEM file's path)")


def _deployment(i: int, entry: ModelEntry, default_timeout_s: float,
                drop_params: bool = False, environ: Mapping[str, str] | None = None,
                http: HttpSettings | None = None) -> Deployment:
    params = entry.litellm_params
    path = f"$.model_list[{i}].litellm_params"
    http = http or HttpSettings()
    proxy = params.proxy if params.proxy is not None else http.proxy
    ssl_verify = params.ssl_verify if params.ssl_verify is not None else http.ssl_verify
    _egress(path, params.proxy, ssl_verify if params.ssl_verify is not None else True)
    provider, sep, upstream = config_litellm.provider_of(params.model).partition("/")
    if not sep or provider not in PROVIDERS or not upstream:
        raise ConfigError(
            f"{path}.model: {params.model!r} must be <provider>/<model> with provider one of "
            f"{', '.join(PROVIDERS)}"
        )
    environ = environ or {}
    if provider != "azure" and any(getattr(params, f) is not None for f in _AZURE_FIELDS):
        raise ConfigError(f"{path}: {', '.join(_AZURE_FIELDS)} only apply to azure/ models")
    if provider in config_litellm.COMPAT_PROVIDERS:
        api_base, api_key = config_litellm.compat_endpoint(
            provider, params.api_base, params.api_key, environ, path)
        params = attrs.evolve(params, api_base=api_base, api_key=api_key)
    azure = _azure(params, environ, path) if provider == "azure" else None
    if provider == "azure":
        bearer = azure is not None and (azure.ad_token or azure.token_url)
        params = attrs.evolve(
            params, api_base=params.api_base or environ.get("AZURE_API_BASE"),
            api_key=params.api_key or (None if bearer else environ.get("AZURE_API_KEY")))
        if not params.api_base:
            raise ConfigError(f"{path}.api_base: azure/ models need api_base "
                              "(https://<resource>.openai.azure.com, or AZURE_API_BASE)")
    if upstream.count("*") > entry.model_name.count("*"):
        raise ConfigError(
            f"{path}.model: {params.model!r} has a '*' that model_name "
            f"{entry.model_name!r} does not fill"
        )
    mode = str(entry.model_info.get("mode", "chat"))
    if mode not in ("chat", "embedding", "moderation"):
        raise ConfigError(f"$.model_list[{i}].model_info.mode: {mode!r} is not chat, "
                          "embedding or moderation")
    if mode == "moderation" and provider != "openai":
        raise ConfigError(f"$.model_list[{i}].model_info.mode: moderation needs an "
                          "OpenAI-compatible deployment (openai/...)")
    groups = entry.model_info.get("access_groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
        raise ConfigError(f"$.model_list[{i}].model_info.access_groups: must be a list of "
                          "names (keys and teams naming one may use this model group)")
    if provider != "mock" and any(
        getattr(params, f) != getattr(_MOCK_DEFAULTS, f)
        for f in ("mock_response", "mock_latency_ms", "mock_failure_rate", "mock_output_tokens")
    ):
        raise ConfigError(f"{path}: mock_* settings only apply to mock/ models")
    cloud = config_cloud.cloud_params(provider, params)
    if (missing := config_cloud.check_cloud_params(provider, cloud, path)) is not None:
        raise ConfigError(missing)
    ident = str(entry.model_info.get("id") or hashlib.sha256(
        f"{entry.model_name}|{params.model}|{params.api_base}|{i}".encode()
    ).hexdigest()[:16])
    timeout_s = params.timeout or default_timeout_s
    priced = params.input_cost_per_token is not None or params.output_cost_per_token is not None
    if provider in PRICE_REQUIRED and not priced and "*" not in upstream:
        table = config_litellm.listed_price(provider, upstream, entry.model_info)
        if table is None:
            raise ConfigError(
                f"{path}: no price for {params.model!r} (not in the packaged price table): "
                "set input_cost_per_token and output_cost_per_token"
                + (", or model_info.base_model" if provider == "azure" else ""))
        params = attrs.evolve(params, input_cost_per_token=table[0],
                              output_cost_per_token=table[1])
    return Deployment(
        id=ident,
        group=entry.model_name,
        provider=provider,
        upstream_model=upstream,
        api_base=params.api_base.rstrip("/") if params.api_base else None,
        api_key=params.api_key,
        rpm=params.rpm,
        tpm=params.tpm,
        timeout_s=timeout_s,
        stream_timeout_s=params.stream_timeout or timeout_s,
        weight=params.weight,
        price=Price(
            input_usd_per_token=_decimal(
                params.input_cost_per_token, f"{path}.input_cost_per_token"
            ),
            output_usd_per_token=_decimal(
                params.output_cost_per_token, f"{path}.output_cost_per_token"
            ),
        ),
        mode=mode,
        mock=MockSettings(
            response=params.mock_response,
            latency_s=params.mock_latency_ms / 1000,
            first_token_s=None if params.mock_first_token_ms is None
            else params.mock_first_token_ms / 1000,
            output_tokens=params.mock_output_tokens,
            failure_rate=params.mock_failure_rate,
            failure_status=params.mock_failure_status,
        )
        if provider == "mock"
        else None,
        info=dict(entry.model_info),
        drop_params=drop_params if params.drop_params is None else params.drop_params,
        priced=priced,
        azure=azure,
        cloud=cloud,
        proxy=proxy,
        ssl_verify=ssl_verify,
    )


# --------------------------------------------------------------------------- azure, prices

_AZURE_FIELDS = ("api_version", "azure_ad_token", "tenant_id", "client_id", "client_secret",
                 "azure_authority_host")


def _azure(params: LitellmParams, environ: Mapping[str, str], path: str) -> AzureSettings:
    """An ``azure/`` deployment's settings, LiteLLM's AZURE_* variables filling gaps."""
    credentials = [params.tenant_id or environ.get("AZURE_TENANT_ID"),
                   params.client_id or environ.get("AZURE_CLIENT_ID"),
                   params.client_secret or environ.get("AZURE_CLIENT_SECRET")]
    explicit = any((params.tenant_id, params.client_id, params.client_secret))
    use_credentials = not params.api_key and not params.azure_ad_token and (
        explicit or (all(credentials) and not environ.get("AZURE_API_KEY")))
    if use_credentials and not all(credentials):
        raise ConfigError(f"{path}: Entra ID client credentials need tenant_id, client_id "
                          "and client_secret")
    token_url = None
    if use_credentials:
        host = (params.azure_authority_host or environ.get("AZURE_AUTHORITY_HOST")
                or AZURE_AUTHORITY_HOST).rstrip("/")
        token_url = f"{host}/{credentials[0]}/oauth2/v2.0/token"
    return AzureSettings(
        api_version=params.api_version or environ.get("AZURE_API_VERSION") or AZURE_API_VERSION,
        ad_token=params.azure_ad_token,
        tenant_id=credentials[0] if use_credentials else None,
        client_id=credentials[1] if use_credentials else None,
        client_secret=credentials[2] if use_credentials else None,
        token_url=token_url,
    )



_MOCK_DEFAULTS = LitellmParams(model="mock/x")


def normalise(file: ConfigFile, *, source: str,
              environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Turn the structured file into a :class:`GatewayConfig`; check cross-references.

    Raises:
        ConfigError: unknown strategy, bad model string, duplicate ids, fallbacks naming
            unknown groups.
    """
    rs = file.router_settings
    if rs.routing_strategy not in STRATEGIES:
        raise ConfigError(
            f"$.router_settings.routing_strategy: {rs.routing_strategy!r} is not one of "
            f"{', '.join(STRATEGIES)}"
        )
    ls = file.litellm_settings
    default_timeout_s = rs.timeout or ls.request_timeout or DEFAULT_TIMEOUT_S
    http = file.triogate.http
    _egress("$.triogate.http", http.proxy, http.ssl_verify)
    deployments = tuple(
        _deployment(i, e, default_timeout_s, ls.drop_params, environ, http)
        for i, e in enumerate(file.model_list)
    )
    seen: set[str] = set()
    for i, d in enumerate(deployments):
        if d.id in seen:
            raise ConfigError(f"$.model_list[{i}].model_info.id: duplicate id {d.id!r}")
        seen.add(d.id)
    groups = {d.group for d in deployments}
    fallbacks = config_litellm.group_lists(rs.fallbacks, groups, "$.router_settings.fallbacks")
    context_fallbacks = {
        **config_litellm.group_lists(ls.context_window_fallbacks, groups,
                                     "$.litellm_settings.context_window_fallbacks"),
        **config_litellm.group_lists(rs.context_window_fallbacks, groups,
                                     "$.router_settings.context_window_fallbacks"),
    }
    aliases, hidden = config_litellm.aliases(rs.model_group_alias, groups)
    callbacks = config_litellm.callbacks({
        "callbacks": ls.callbacks, "success_callback": ls.success_callback,
        "failure_callback": ls.failure_callback,
    })
    num_retries = next((n for n in (rs.num_retries, ls.num_retries) if n is not None), 2)
    return GatewayConfig(
        deployments=deployments,
        router=RouterSettings(
            strategy=rs.routing_strategy,
            num_retries=num_retries,
            timeout_s=rs.timeout,
            allowed_fails=rs.allowed_fails,
            cooldown_s=rs.cooldown_time,
            retry_after_s=rs.retry_after,
            fallbacks=fallbacks,
            context_window_fallbacks=context_fallbacks,
            aliases=aliases,
            hidden_aliases=hidden,
        ),
        master_key=file.general_settings.master_key,
        database_url=file.general_settings.database_url,
        cache=CacheSettings(enabled=ls.cache, ttl_s=ls.cache_params.ttl),
        request_timeout_s=ls.request_timeout,
        settings=file.triogate,
        source=source,
        drop_params=ls.drop_params,
        verbose=ls.set_verbose,
        callbacks=callbacks,
        governance=governance_features(
            max_budget=ls.max_budget, budget_duration=ls.budget_duration,
            alerting=file.general_settings.alerting,
            webhook_url=file.general_settings.alerting_webhook_url,
            guardrails=file.guardrails),
        store_prompts_in_spend_logs=file.general_settings.store_prompts_in_spend_logs,
    )


def _with_litellm_redis(file: ConfigFile, environ: Mapping[str, str]) -> ConfigFile:
    """Fill ``triogate.redis.url`` from LiteLLM's Redis settings when it is not set
    (:func:`config_litellm.redis_url_from`)."""
    if file.triogate.redis.url:
        return file
    rs, cp = file.router_settings, file.litellm_settings.cache_params
    nodes = cp.sentinel_nodes or cp.redis_sentinel_nodes
    if nodes or cp.service_name:
        if not (nodes and cp.service_name):
            raise ConfigError("litellm_settings.cache_params: Redis Sentinel needs both "
                              "sentinel_nodes and service_name")
        try:
            url: str | None = config_litellm.sentinel_url(
                nodes, cp.service_name, password=cp.password,
                sentinel_password=cp.sentinel_password, tls=config_litellm.truthy(cp.ssl),
                tls_options={k: getattr(cp, k) for k in config_litellm.TLS_KEYS})
        except (TypeError, ValueError, IndexError) as exc:
            raise ConfigError(f"litellm_settings.cache_params.sentinel_nodes: {exc}") from None
    else:
        url = config_litellm.redis_url_from(
            urls=(rs.redis_url, cp.url, cp.redis_url), hosts=(rs.redis_host, cp.host),
            ports=(rs.redis_port, cp.port), passwords=(rs.redis_password, cp.password),
            environ=environ, username=cp.username, ssl=cp.ssl,
            tls={k: getattr(cp, k) for k in config_litellm.TLS_KEYS})
    if not url:
        return file
    redis = attrs.evolve(file.triogate.redis, url=url)
    return attrs.evolve(file, triogate=attrs.evolve(file.triogate, redis=redis))


def parse_config(
    raw: Any, *, source: str = "<config>", environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    """Structure and normalise an already-parsed YAML document.

    Raises:
        ConfigError: anything wrong, with every problem's key path in the message.
    """
    environ = environ or {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"invalid configuration in {source}: the top level must be a mapping")
    raw = dict(raw)
    # LiteLLM's ``environment_variables`` section: defaults for the real environment.
    section = raw.pop("environment_variables", None) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"invalid configuration in {source}: environment_variables must be "
                          "a mapping")
    environ = {**{str(k): str(v) for k, v in section.items()}, **environ}
    raw = expand_env(raw, environ)
    config_cloud.fill_from_environ(raw, environ)
    raw.setdefault("triogate", {})
    if raw["triogate"] is None:
        raw["triogate"] = {}
    redis = raw["triogate"].setdefault("redis", {}) or {}
    raw["triogate"]["redis"] = redis
    general = raw.setdefault("general_settings", {}) or {}
    raw["general_settings"] = general
    if environ.get("TRIOGATE_REDIS_URL"):
        redis["url"] = environ["TRIOGATE_REDIS_URL"]
    if environ.get("TRIOGATE_DATABASE_URL"):
        general["database_url"] = environ["TRIOGATE_DATABASE_URL"]
    if environ.get("TRIOGATE_MASTER_KEY"):
        general["master_key"] = environ["TRIOGATE_MASTER_KEY"]
    try:
        file = _converter.structure(raw, ConfigFile)
    except ClassValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid configuration in {source}: {exc}") from None
    config = normalise(_with_litellm_redis(file, environ), source=source, environ=environ)
    if "otel" in config.callbacks:
        config = attrs.evolve(config, otel=OtelSettings(**config_litellm.otel(environ)))
    return config


def load_config(path: Path | None, *, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Load ``path`` (or the example config shipped with triogate when None).

    Raises:
        ConfigError: unreadable file, bad YAML, or invalid contents.
    """
    if path is None:
        text = resources.files("triogate").joinpath("example.yaml").read_text()
        source = "triogate/example.yaml"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        source = str(path)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    return parse_config(raw, source=source, environ=environ)
