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
from typing import TYPE_CHECKING, Any

import attrs
import cattrs
import yaml
from cattrs.errors import ClassValidationError
from cattrs.v import format_exception

from triogate import LITELLM_VERSION as LITELLM_VERSION
from triogate import __version__, config_cloud, config_litellm
from triogate.config_file import (
    ConfigFile,
    LitellmParams,
    ModelEntry,
)
from triogate.config_governance import GovernanceFeatures, governance_features
from triogate.config_settings import (
    HttpSettings,
    TriogateSettings,
)
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
