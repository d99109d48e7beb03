"""LiteLLM's settings that map onto triogate's own: Redis location, callbacks, aliases.

Pure functions of already-structured values, called by :mod:`triogate.config` while it
normalises a file; nothing here reads the environment (the caller passes it).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from importlib import resources
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlencode

import attrs

from triogate.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

#: Callbacks triogate has built in. ``prometheus`` is always on (``GET /metrics``).
CALLBACKS = ("prometheus", "otel")
DEFAULT_REDIS_PORT = 6379


#: LiteLLM's (redis-py's) TLS settings that become query parameters of a ``rediss://`` URL.
TLS_KEYS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
_TRUE = ("true", "1", "yes", "on")


def truthy(value: bool | str | None) -> bool:
    """LiteLLM's ``ssl: true`` (``os.environ/REDIS_SSL`` expands to the string ``"True"``)."""
    return value is True or (isinstance(value, str) and value.strip().lower() in _TRUE)


def redis_url(
    *,
    url: str | None,
    host: str | None,
    port: int | str | None,
    password: str | None,
    username: str | None = None,
    ssl: bool = False,
    tls: Mapping[str, str] | None = None,
) -> str | None:
    """A ``redis://`` URL from LiteLLM's separate settings (None when no host is known).

    ``url`` wins; else ``host`` (with ``port``, default 6379, ``username`` and
    ``password``); ``ssl`` or any ``tls`` option (``ssl_ca_certs``, ...) makes it
    ``rediss://`` with those options as query parameters.

    Raises:
        ConfigError: a port that is not a number.
    """
    if url:
        return url
    if not host:
        return None
    try:
        port_number = int(port) if port not in (None, "") else DEFAULT_REDIS_PORT
    except (TypeError, ValueError):
        raise ConfigError(f"redis port {port!r} is not a number") from None
    auth = f"{_quote(username)}:{_quote(password)}@" if password else (
        f"{_quote(username)}@" if username else "")
    options = {k: v for k, v in (tls or {}).items() if v}
    scheme = "rediss" if ssl or options else "redis"
    query = f"?{urlencode(options)}" if options else ""
    return f"{scheme}://{auth}{host}:{port_number}/0{query}"


#: Bare model names LiteLLM knows the provider of (``gpt-4o`` means ``openai/gpt-4o``).
_BARE_PREFIXES = (
    ("gpt-", "openai"), ("o1", "openai"), ("o3", "openai"), ("o4", "openai"),
    ("chatgpt-", "openai"), ("text-embedding-", "openai"), ("davinci", "openai"),
    ("babbage", "openai"), ("claude-", "anthropic"),
)


def provider_of(model: str) -> str:
    """``model`` with its provider prefix: given, or inferred for well-known bare names."""
    if "/" in model:
        return model
    for prefix, provider in _BARE_PREFIXES:
        if model.startswith(prefix):
            return f"{provider}/{model}"
    return model


def first(*values: Any) -> Any:
    """The first value that is set (not None, not empty)."""
    return next((v for v in values if v not in (None, "")), None)


def redis_url_from(
    *, urls: Iterable[str | None], hosts: Iterable[str | None],
    ports: Iterable[int | str | None], passwords: Iterable[str | None],
    environ: Mapping[str, str], username: str | None = None,
    ssl: bool | str | None = None, tls: Mapping[str, str | None] | None = None,
) -> str | None:
    """Where LiteLLM's settings put Redis, in order: a URL (``router_settings.redis_url``,
    ``cache_params.url|redis_url``), then host/port/password (``router_settings``, then
    ``cache_params``; the port and password may come from ``REDIS_PORT`` and
    ``REDIS_PASSWORD``), then the ``REDIS_URL`` or ``REDIS_HOST``/``REDIS_PORT``/
    ``REDIS_PASSWORD`` environment. None when none of them names a server.

    A URL built from a host also takes ``cache_params``' ``username``, ``ssl`` and TLS
    options (:data:`TLS_KEYS`), or ``REDIS_USERNAME``, ``REDIS_SSL`` and
    ``REDIS_SSL_CA_CERTS`` (etc.) from the environment."""
    options = {k: first((tls or {}).get(k), environ.get(f"REDIS_{k.upper()}"))
               for k in TLS_KEYS}
    extra: dict[str, Any] = {
        "username": first(username, environ.get("REDIS_USERNAME")),
        "ssl": truthy(first(ssl, environ.get("REDIS_SSL"))),
        "tls": {k: str(v) for k, v in options.items() if v},
    }
    return first(*urls) or redis_url(
        url=None, host=first(*hosts),
        port=first(*ports, environ.get("REDIS_PORT")),
        password=first(*passwords, environ.get("REDIS_PASSWORD")), **extra,
    ) or environ.get("REDIS_URL") or redis_url(
        url=None, host=environ.get("REDIS_HOST"), port=environ.get("REDIS_PORT"),
        password=environ.get("REDIS_PASSWORD"), **extra,
    )


def callbacks(sources: Mapping[str, Iterable[str] | str]) -> frozenset[str]:
    """The built-in callbacks named under ``litellm_settings`` (path → names).

    Raises:
        ConfigError: a callback triogate does not have, named with its key path.
    """
    out: set[str] = set()
    for path, names in sources.items():
        for i, name in enumerate([names] if isinstance(names, str) else list(names)):
            if name not in CALLBACKS:
                raise ConfigError(
                    f"$.litellm_settings.{path}[{i}]: callback {name!r} is not supported "
                    f"(built in: {', '.join(CALLBACKS)})"
                )
            out.add(name)
    return frozenset(out)


def aliases(
    raw: Mapping[str, str | Mapping[str, Any]], groups: Iterable[str]
) -> tuple[dict[str, str], frozenset[str]]:
    """``model_group_alias`` → (alias → group, hidden aliases).

    Raises:
        ConfigError: an alias of an unknown group, an alias that is itself a group, or a
            malformed entry.
    """
    known = set(groups)
    out: dict[str, str] = {}
    hidden: set[str] = set()
    for alias, target in raw.items():
        path = f"$.router_settings.model_group_alias.{alias}"
        if isinstance(target, str):
            group, hide = target, False
        elif isinstance(target, dict) and isinstance(target.get("model"), str) and set(
            target) <= {"model", "hidden"}:
            group, hide = target["model"], bool(target.get("hidden", False))
        else:
            raise ConfigError(f"{path}: expected a model group or {{model: ..., hidden: ...}}")
        if alias in known:
            raise ConfigError(f"{path}: {alias!r} is already a model group")
        if group not in known:
            raise ConfigError(f"{path}: unknown model group {group!r}")
        out[alias] = group
        if hide:
            hidden.add(alias)
    return out, frozenset(hidden)


def group_lists(
    items: Iterable[Mapping[str, list[str]]], groups: Iterable[str], path: str
) -> dict[str, tuple[str, ...]]:
    """``[{group: [fallback, ...]}, ...]`` → group → fallbacks; every name must be a group.

    Raises:
        ConfigError: a name that is not a model group, with its key path.
    """
    known = set(groups)
    out: dict[str, tuple[str, ...]] = {}
    for i, item in enumerate(items):
        for group, targets in item.items():
            for name in (group, *targets):
                if name not in known:
                    raise ConfigError(f"{path}[{i}]: unknown model group {name!r}")
            out[group] = (*out.get(group, ()), *targets)
    return out


#: The OTLP/HTTP default (the OpenTelemetry collector's port for HTTP).
DEFAULT_OTLP_ENDPOINT = "http://localhost:4318"


def _headers(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (percent-encoded values), the OTLP headers variable's format."""
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError("OTEL_EXPORTER_OTLP_HEADERS: expected name=value pairs")
        out[name.strip().lower()] = unquote(value.strip())
    return out


def otel(environ: Mapping[str, str]) -> dict[str, Any]:
    """OpenTelemetry export settings from the standard variables (and LiteLLM's own).

    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (the full URL), else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` or LiteLLM's ``OTEL_ENDPOINT`` (a base; ``/v1/traces``
    is added), else ``http://localhost:4318``; headers from
    ``OTEL_EXPORTER_OTLP_HEADERS`` (or ``OTEL_HEADERS``); ``OTEL_SERVICE_NAME``.

    Raises:
        ConfigError: a protocol or exporter other than OTLP over HTTP with JSON.
    """
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "http/json":
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: triogate exports OTLP "
                          "over HTTP as JSON only (set http/json)")
    exporter = environ.get("OTEL_EXPORTER")
    if exporter and exporter not in ("otlp_http", "otlp"):
        raise ConfigError(f"OTEL_EXPORTER {exporter!r}: triogate exports OTLP over HTTP only "
                          "(otlp_http)")
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint:
        base = (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_ENDPOINT")
                or DEFAULT_OTLP_ENDPOINT).rstrip("/")
        endpoint = base if base.endswith("/v1/traces") else f"{base}/v1/traces"
    headers = _headers(environ.get("OTEL_EXPORTER_OTLP_HEADERS")
                       or environ.get("OTEL_HEADERS") or "")
    return {"endpoint": endpoint, "headers": headers,
            "service_name": environ.get("OTEL_SERVICE_NAME") or "triogate"}


def sentinel_url(
    nodes: Sequence[str | Sequence[object]], service: str, *,
    password: str | None = None, sentinel_password: str | None = None, tls: bool = False,
    tls_options: Mapping[str, str | None] | None = None,
) -> str:
    """A ``redis+sentinel://`` URL from LiteLLM's ``redis_sentinel_nodes`` (``[[host, port],
    ...]`` or ``["host:port", ...]``), ``service_name``, passwords and TLS settings
    (``tls``, or any of ``tls_options``, makes it ``rediss+sentinel://``)."""
    hosts = []
    for node in nodes:
        if isinstance(node, str):
            host, port = _sentinel_host_port(node)
        else:
            host, port = str(node[0]), int(str(node[1]))
        hosts.append(f"{host}:{port}")
    auth = f":{_quote(password)}@" if password else ""
    params = {k: str(v) for k, v in (tls_options or {}).items() if v}
    scheme = "rediss+sentinel" if tls or params else "redis+sentinel"
    if sentinel_password:
        params["sentinel_password"] = sentinel_password
    query = f"?{urlencode(params)}" if params else ""
    return f"{scheme}://{auth}{','.join(hosts)}/{_quote(service)}{query}"


def _sentinel_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a sentinel is host:port or [host, port], got {text!r}")
    return host.strip("[]"), int(port)


def _quote(text: str | None) -> str:
    return quote(text or "", safe="")


# ------------------------------------------------------------- OpenAI-compatible names


@attrs.frozen
class CompatProvider:
    """A LiteLLM provider name served by the OpenAI-compatible provider.

    ``api_base`` is the default (None: the deployment or ``base_env`` must give one);
    ``base_env`` and ``key_envs`` are the environment variables LiteLLM reads for them,
    the first one set wins. ``v1``: the server's OpenAI-compatible API is under ``/v1``
    of the address users configure (Ollama's ``http://localhost:11434``).
    """

    api_base: str | None
    base_env: str
    key_envs: tuple[str, ...]
    v1: bool = False


#: LiteLLM's defaults for its OpenAI-compatible provider names.
COMPAT_PROVIDERS: dict[str, CompatProvider] = {
    "groq": CompatProvider("https://api.groq.com/openai/v1", "GROQ_API_BASE",
                           ("GROQ_API_KEY",)),
    "together_ai": CompatProvider("https://api.together.xyz/v1", "TOGETHER_AI_API_BASE",
                                  ("TOGETHER_API_KEY", "TOGETHER_AI_API_KEY",
                                   "TOGETHERAI_API_KEY", "TOGETHER_AI_TOKEN")),
    "fireworks_ai": CompatProvider("https://api.fireworks.ai/inference/v1",
                                   "FIREWORKS_API_BASE",
                                   ("FIREWORKS_API_KEY", "FIREWORKS_AI_API_KEY",
                                    "FIREWORKSAI_API_KEY", "FIREWORKS_AI_TOKEN")),
    "deepseek": CompatProvider("https://api.deepseek.com/beta", "DEEPSEEK_API_BASE",
                               ("DEEPSEEK_API_KEY",)),
    "mistral": CompatProvider("https://api.mistral.ai/v1", "MISTRAL_API_BASE",
                              ("MISTRAL_API_KEY",)),
    "openrouter": CompatProvider("https://openrouter.ai/api/v1", "OPENROUTER_API_BASE",
                                 ("OPENROUTER_API_KEY", "OR_API_KEY")),
    "xai": CompatProvider("https://api.x.ai/v1", "XAI_API_BASE", ("XAI_API_KEY",)),
    "perplexity": CompatProvider("https://api.perplexity.ai", "PERPLEXITY_API_BASE",
                                 ("PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY")),
    "cerebras": CompatProvider("https://api.cerebras.ai/v1", "CEREBRAS_API_BASE",
                               ("CEREBRAS_API_KEY",)),
    "deepinfra": CompatProvider("https://api.deepinfra.com/v1/openai", "DEEPINFRA_API_BASE",
                                ("DEEPINFRA_API_KEY",)),
    "hosted_vllm": CompatProvider(None, "HOSTED_VLLM_API_BASE", ("HOSTED_VLLM_API_KEY",)),
    "vllm": CompatProvider(None, "HOSTED_VLLM_API_BASE", ("HOSTED_VLLM_API_KEY",)),
    "ollama": CompatProvider("http://localhost:11434", "OLLAMA_API_BASE",
                             ("OLLAMA_API_KEY",), v1=True),
    "ollama_chat": CompatProvider("http://localhost:11434", "OLLAMA_API_BASE",
                                  ("OLLAMA_API_KEY",), v1=True),
    "lm_studio": CompatProvider(None, "LM_STUDIO_API_BASE", ("LM_STUDIO_API_KEY",)),
    "text-completion-openai": CompatProvider("https://api.openai.com/v1", "OPENAI_API_BASE",
                                             ("OPENAI_API_KEY",)),
}


def compat_endpoint(
    provider: str, api_base: str | None, api_key: str | None, environ: Mapping[str, str],
    path: str,
) -> tuple[str, str | None]:
    """(api_base, api_key) of a deployment of an OpenAI-compatible provider name: the
    deployment's own, else the provider's environment variables, else its default.

    Raises:
        ConfigError: no address known (the provider has no default and none is set).
    """
    spec = COMPAT_PROVIDERS[provider]
    base = first(api_base, environ.get(spec.base_env), spec.api_base)
    if not base:
        raise ConfigError(f"{path}.api_base: {provider}/ models need api_base "
                          f"(or {spec.base_env})")
    base = base.rstrip("/")
    if spec.v1 and not base.endswith("/v1"):
        base += "/v1"
    key = first(api_key, *(environ.get(name) for name in spec.key_envs))
    return base, key


def compat_table_markdown() -> str:
    """The names table of the providers documentation, generated from the one above."""
    lines = ["| provider | default api_base | api_base variable | key variables |",
             "| --- | --- | --- | --- |"]
    for name, spec in COMPAT_PROVIDERS.items():
        base = f"`{spec.api_base}{'/v1' if spec.v1 else ''}`" if spec.api_base else "(required)"
        keys = ", ".join(f"`{k}`" for k in spec.key_envs)
        lines.append(f"| `{name}/` | {base} | `{spec.base_env}` | {keys} |")
    return "\n".join(lines) + "\n"


#: The packaged price table (USD per million tokens), read once when this module is imported.
_PRICES: Mapping[str, list[float]] = MappingProxyType(json.loads(
    resources.files("triogate").joinpath("routing", "prices.json").read_text()
)["usd_per_million_tokens"])


#: What may follow a listed name in a name it prices: a date (``-2024-11-20``,
#: ``-20241022``, ``@20241022``), a short snapshot number (``-0613``, ``-001``) or
#: ``-latest``, then perhaps a version (``-v1:0``). ``gpt-4-1106-preview``,
#: ``claude-opus-4-5`` or ``gemini-2.5-flash-lite`` are other models, priced otherwise.
_SNAPSHOT = re.compile(r"[-@](?:\d{4}-\d{2}-\d{2}|\d{8}|\d{3,4}|latest)(?:-v\d+(?::\d+)?)?")


def priced_name(model: str, names: Mapping[str, object]) -> str | None:
    """The name of ``names`` (a price table) that prices ``model``: itself, or the longest
    name of which it is a dated snapshot; None when there is none."""
    if model in names:
        return model
    return max((n for n in names if model.startswith(n) and _SNAPSHOT.fullmatch(model[len(n):])),
               key=len, default=None)


#: Cross-region inference profile prefixes of Bedrock model ids (``us.anthropic.…``).
_BEDROCK_REGIONS = frozenset(("us", "eu", "apac", "global", "us-gov", "jp", "au", "ca"))


def listed_price(provider: str, model: str, info: Mapping[str, Any]) -> tuple[str, str] | None:
    """USD per token (input, output) of ``provider/model`` in the packaged table
    (``routing/prices.json``): by ``provider/model``, or for Azure by
    ``model_info.base_model`` or the deployment's name; a name also prices its dated
    snapshots. None when the table has none of them."""
    names = [f"{provider}/{model}"]
    if provider == "bedrock":  # the API route and a cross-region profile are not the model
        bare = model.removeprefix("converse/").removeprefix("invoke/")
        region, dot, rest = bare.partition(".")
        names = [f"bedrock/{bare}"] + (
            [f"bedrock/{rest}"] if dot and region in _BEDROCK_REGIONS and "." in rest else [])
    if provider == "azure":
        base = str(info.get("base_model") or model)
        names = [base, base.removeprefix("azure/"), model]
    for name in names:
        found = priced_name(name, _PRICES)
        if found is not None:
            inp, out = (str(Decimal(str(v)) / 1_000_000) for v in _PRICES[found])
            return inp, out
    return None
