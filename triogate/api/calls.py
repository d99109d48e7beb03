"""What the four model endpoints share: reading the body, building a :class:`Call`.

Each endpoint checks its own API's shape; everything else (the model group, its mode,
the cache controls, tags, the end user, the estimates, the body sent upstream, the
request's unique id) is decided here the same way for all of them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from triogate.api import auth, controls, validate
from triogate.api.errors import ApiError
from triogate.api.http import new_request_id
from triogate.api.records import Call
from triogate.errors import StoreError
from triogate.governance.model_access import resolve_alias
from triogate.providers.tokens import estimate_input_tokens

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.errors import Style
    from triogate.api.http import Request, Response
    from triogate.api.services import Services
    from triogate.providers.records import Api

    Handler = Callable[[Services, Request], Awaitable[Response]]

#: Request fields asking to skip guardrails: refused (only a key or team may).
OPT_OUTS = ("disable_global_guardrails", "disable_global_guardrail",
            "opted_out_global_guardrails")
#: Fields the gateway reads and does not pass upstream (``mock_response`` stays for mock
#: deployments, whose provider honours it).
GATEWAY_FIELDS = ("cache", "metadata", "mock_response", "guardrails", *OPT_OUTS,
                  *controls.CONTROL_FIELDS)
#: Most choices one request may ask for (OpenAI's own limit).
MAX_CHOICES = 128


def trace_id_of(request: Request) -> str:
    """The request's unique id: the ``x-request-id`` the gateway gave it, so the response,
    its spend-log row and its trace share one id. A client's own ``x-request-id`` is
    echoed but never used here: ids settle money exactly once, so they must be unique."""
    if request.trace_id is None:
        request.trace_id = (new_request_id()
                            if request.headers.get("x-request-id") == request.request_id
                            else request.request_id)
    return request.trace_id


def auth_first(handler: Handler) -> Handler:
    """Authenticate before telling the caller anything about its request.

    A model handler validates its body before admission (where the key is checked, in
    the same round as everything else). Without this, a caller with no valid key could
    learn which models exist (404 vs 401). A request refused before admission is
    authenticated first, at the cost of a wait on the error path only.
    """

    @functools.wraps(handler)
    async def guarded(services: Services, request: Request) -> Response:
        try:
            return await handler(services, request)
        except ApiError:
            if not request.authenticated:
                request.authenticated = True
                try:
                    await auth.authenticate_only(services, request)
                except StoreError:
                    raise ApiError(503, "the key store is unavailable; try again shortly",
                                   "service_unavailable") from None
            raise

    return guarded


async def read_body(services: Services, request: Request) -> tuple[dict[str, Any], str]:
    """The JSON body and its model group (a group, an alias's, or a wildcard's).

    A name that is not a configured group may be one of the caller's aliases (its key's
    ``aliases``, its team's ``model_aliases``), which win over the config's aliases and
    wildcards; the body then names the alias's target. Finding them needs the identity:
    from memory (no wait) in the common case, else the MGET admission would have made,
    which admission then finds in memory (so the waits stay 1 + 1, or 2 + 1).
    """
    body = await request.json(services.config.settings.max_body_bytes)
    model = body.get("model")
    if isinstance(model, str) and "*" not in model and model not in services.groups:
        target = await _caller_alias(services, request, model)
        if target is not None:
            body = {**body, "model": target}
    return body, controls.resolve_model(services, body).group


async def _caller_alias(services: Services, request: Request, model: str) -> str | None:
    """What the caller's key or team aliases ``model`` to, if anything. A checkpoint.

    Raises:
        ApiError: 401 for a missing or unknown key (as admission would); 503 when the key
            store cannot be reached.
    """
    if services.identities is None or auth.is_master(services, request.bearer()):
        return None
    try:
        identity = await auth.authenticate_only(services, request,
                                                trace_id=trace_id_of(request))
    except StoreError:
        raise ApiError(503, "the key store is unavailable; try again shortly",
                       "service_unavailable") from None
    request.authenticated = True
    if identity is None:
        return None
    target = resolve_alias(model, identity.key.aliases,
                           identity.team.aliases if identity.team else None)
    return None if target == model else target


def check_mode(services: Services, group: str, *, embedding: bool) -> None:
    """400 when the group serves the other kind of model (wildcards serve both)."""
    if "*" in group:
        return
    modes = {d.mode for d in services.groups[group]}
    if embedding and "embedding" not in modes:
        raise ApiError(400, f"model '{group}' is not an embedding model", param="model")
    if not embedding and "chat" not in modes:
        kind = "an embedding" if "embedding" in modes else "a moderation"
        raise ApiError(400, f"model '{group}' is {kind} model", param="model")


def output_estimate(services: Services, body: dict[str, Any], *names: str) -> int:
    """Output tokens to reserve: max_tokens (or the default), capped, times ``n``."""
    settings = services.config.settings.governance
    requested = None
    for name in names:
        requested = validate.positive_int(body, name) or requested
    n = validate.positive_int(body, "n", high=MAX_CHOICES) or 1
    per_choice = min(requested or settings.default_max_output_tokens,
                     settings.max_reserved_output_tokens)
    return per_choice * n


#: The output names a request may bound itself by, per API.
_OUTPUT_NAMES = {"chat": ("max_tokens", "max_completion_tokens"),
                 "messages": ("max_tokens",), "responses": ("max_output_tokens",)}


def stream_output_bound(services: Services, api: str, body: dict[str, Any]) -> int:
    """Output tokens a stream may bring at most: the request's own bound (``max_tokens``
    and the like; not capped by ``max_reserved_output_tokens``), else
    ``default_max_stream_output_tokens``, times ``n``. Not the reservation's
    ``default_max_output_tokens``: that is an estimate, and a long answer its client
    did not bound is no runaway."""
    settings = services.config.settings.governance
    requested = None
    for name in _OUTPUT_NAMES.get(api, ()):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            requested = value if requested is None else max(requested, value)
    n = body.get("n")
    choices = n if isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_CHOICES else 1
    return (requested or settings.default_max_stream_output_tokens) * choices


def upstream_body(services: Services, group: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body without gateway-only fields."""
    mock = any(d.provider == "mock" for d in services.groups[group])
    drop = [f for f in GATEWAY_FIELDS if not (mock and f == "mock_response")]
    return {k: v for k, v in body.items() if k not in drop}


def make_call(
    services: Services,
    request: Request,
    body: dict[str, Any],
    *,
    api: Api,
    style: Style,
    group: str,
    output_tokens: int,
    end_user: str | None,
    upstream: dict[str, Any] | None = None,
    include_usage: bool = False,
) -> Call:
    """The :class:`Call` for a validated body (``upstream`` overrides the body sent on)."""
    stream = bool(validate.field(body, "stream", bool, what="a boolean"))
    ref = controls.resolve_model(services, body)
    return Call(
        api=api,
        route=api,
        style=style,
        body=upstream if upstream is not None else upstream_body(services, group, body),
        group=group,
        stream=stream,
        include_usage=include_usage,
        request=request,
        cache=validate.cache_control(body, request.headers),
        trace_id=trace_id_of(request),
        end_user=end_user or validate.identifier(
            request.headers.get(services.config.settings.governance.end_user_header),
            services.config.settings.governance.end_user_header),
        tags=validate.tags_of(body),
        input_tokens=estimate_input_tokens(api, body),
        output_tokens=output_tokens,
        routing=controls.routing(services, body, request, ref),
        drop_params=controls.drop_params(body),
        guardrails=requested_guardrails(services, body),
        metadata=body["metadata"] if isinstance(body.get("metadata"), dict) else None,
    )


def requested_guardrails(services: Services, body: dict[str, Any]) -> tuple[str, ...]:
    """The guardrails a request names (``guardrails``, or ``metadata.guardrails``, as
    LiteLLM reads them).

    A request may not turn guardrails off (LiteLLM reads ``disable_global_guardrails``
    only from the key's and team's metadata, which an admin sets): a request asking to
    is refused by name rather than served as if it had been obeyed.

    Raises:
        ApiError: 400 for a value that is not a list of names, a name no configured
            guardrail has, or a request-level opt-out.
    """
    metadata = body.get("metadata")
    for place in (body, metadata if isinstance(metadata, dict) else {}):
        for name in OPT_OUTS:
            if place.get(name):
                raise ApiError(400, f"'{name}' cannot be set by a request: a proxy admin "
                               "sets disable_global_guardrails on the key or team",
                               param=name)
    names = body.get("guardrails")
    if names is None and isinstance(metadata, dict):
        names = metadata.get("guardrails")
    if names is None:
        return ()
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ApiError(400, "'guardrails' must be a list of guardrail names",
                       param="guardrails")
    guards = services.guardrails
    unknown = guards.unknown(names) if guards is not None else names
    if unknown:
        raise ApiError(400, f"unknown guardrail '{unknown[0]}' (configured: "
                       f"{', '.join(g.name for g in guards.specs) if guards else 'none'})",
                       param="guardrails")
    return tuple(dict.fromkeys(names))
