"""Guardrails: checks of a request's (or a response's) text that block it or mask parts.

Two kinds are built in (``config_governance`` checks their settings):

* LiteLLM's content filter (``litellm_content_filter``): keywords and regexes, and the
  prebuilt patterns ``email``, ``phone`` and ``credit_card``; each rule ``BLOCK``s the
  request or ``MASK``s what it matched as ``[<NAME>_REDACTED]``. Local: no I/O at all.
* LiteLLM's generic guardrail API (``generic_guardrail_api``): one JSON POST to
  ``<api_base>/beta/litellm_basic_guardrail_api`` of the operator's service with the
  texts; it answers ``{"action": "NONE" | "BLOCKED" | "GUARDRAIL_INTERVENED",
  "blocked_reason", "texts"}`` (texts replaced when it intervened). A service that does
  not answer in ``timeout`` or answers something else blocks the request (fail closed:
  a guardrail that cannot say yes says no).

A guardrail runs in one or more modes: ``pre_call`` (before the model call, as a
participant of the request's admission scope: it declares no Redis command, so it adds
no wait), ``during_call`` (concurrently with the model call; its verdict is awaited
before any byte of the answer leaves) and ``post_call`` (on the answer of a non-streamed
request, before it is sent). Which run: those with ``default_on`` (unless the key or its
team sets ``disable_global_guardrails``), and those the request names in its
``guardrails`` field or its key or team names in ``metadata.guardrails``.

Every run gives a :class:`Verdict`; the request's verdicts go on its spend row.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, final

import attrs
import httpx
import trio

from triogate.config_governance import CONTENT_FILTER

if TYPE_CHECKING:
    from collections.abc import Sequence

    from triogate.config_governance import GuardrailSpec

logger = logging.getLogger("triogate.governance.guardrails")

#: The generic guardrail API's path under ``api_base``.
GENERIC_PATH = "/beta/litellm_basic_guardrail_api"
#: Verdict statuses.
PASSED, MASKED, BLOCKED = "passed", "masked", "blocked"


@final
@attrs.frozen(kw_only=True)
class Verdict:
    """What one guardrail concluded about one request (or its answer).

    Attributes:
        name: the guardrail's ``guardrail_name``.
        mode: the mode it ran in.
        status: :data:`PASSED`, :data:`MASKED` or :data:`BLOCKED`.
        message: why it blocked or what it masked (no matched text: it may be private).
        texts: the texts to use instead, when it masked.
    """

    name: str
    mode: str
    status: str
    message: str | None = None
    texts: tuple[str, ...] | None = attrs.field(default=None, repr=False)

    def record(self) -> dict[str, Any]:
        """The verdict as the spend row keeps it."""
        out: dict[str, Any] = {"guardrail_name": self.name, "mode": self.mode,
                               "status": self.status}
        if self.message:
            out["message"] = self.message
        return out


class GuardrailError(Exception):
    """A guardrail service that did not give a usable answer."""


@final
class Guardrails:
    """The configured guardrails, and the HTTP client the generic API ones use."""

    def __init__(self, specs: Sequence[GuardrailSpec], client: httpx.AsyncClient | None
                 ) -> None:
        self.specs = tuple(specs)
        self._client = client

    def active(self, mode: str, requested: Sequence[str], *, global_off: bool = False
               ) -> list[GuardrailSpec]:
        """The guardrails to run in ``mode`` (config order) for a request naming
        ``requested`` (itself, its key and its team together).

        LiteLLM's rule (``CustomGuardrail.should_run_guardrail``): a default-on guardrail
        runs unless ``global_off`` (the key's or team's ``disable_global_guardrails``),
        named or not; any other runs when named.
        """
        return [g for g in self.specs if mode in g.modes and (
            not global_off if g.default_on else g.name in requested)]

    def unknown(self, requested: Sequence[str]) -> list[str]:
        """Names a request asked for that no guardrail has."""
        names = {g.name for g in self.specs}
        return [n for n in requested if n not in names]

    async def check(self, spec: GuardrailSpec, mode: str, texts: Sequence[str], *,
                    input_type: str, call_id: str, model: str | None = None) -> Verdict:
        """Run ``spec`` over ``texts`` (``input_type``: ``request`` or ``response``).
        Always a checkpoint."""
        if spec.kind == CONTENT_FILTER:
            await trio.lowlevel.checkpoint()
            return content_filter(spec, mode, texts)
        try:
            return await self._generic(spec, mode, texts, input_type=input_type,
                                       call_id=call_id, model=model)
        except GuardrailError as exc:
            logger.error("guardrail %s failed: %s", spec.name, exc)
            return Verdict(name=spec.name, mode=mode, status=BLOCKED,
                           message="the guardrail service could not be reached; the "
                                   "request was not let through")

    async def _generic(self, spec: GuardrailSpec, mode: str, texts: Sequence[str], *,
                       input_type: str, call_id: str, model: str | None) -> Verdict:
        assert spec.api_base is not None
        if self._client is None:
            raise GuardrailError("no HTTP client")
        payload: dict[str, Any] = {"texts": list(texts), "input_type": input_type,
                                   "litellm_call_id": call_id}
        if model is not None:
            payload["model"] = model
        if spec.params:
            payload["additional_provider_specific_params"] = dict(spec.params)
        headers = {"x-api-key": spec.api_key} if spec.api_key else {}
        try:
            with trio.fail_after(spec.timeout_s):
                response = await self._client.post(spec.api_base + GENERIC_PATH,
                                                   json=payload, headers=headers)
        except (httpx.HTTPError, trio.TooSlowError) as exc:
            raise GuardrailError(f"{type(exc).__name__}") from None
        if response.status_code != 200:
            raise GuardrailError(f"status {response.status_code}")
        try:
            answer = response.json()
        except ValueError:
            raise GuardrailError("not JSON") from None
        action = answer.get("action") if isinstance(answer, dict) else None
        if action == "NONE":
            return Verdict(name=spec.name, mode=mode, status=PASSED)
        if action == "BLOCKED":
            reason = answer.get("blocked_reason")
            return Verdict(name=spec.name, mode=mode, status=BLOCKED,
                           message=reason if isinstance(reason, str) and reason
                           else "blocked by the guardrail")
        if action == "GUARDRAIL_INTERVENED":
            new = answer.get("texts")
            if new is None:
                return Verdict(name=spec.name, mode=mode, status=PASSED)
            if not (isinstance(new, list) and len(new) == len(texts)
                    and all(isinstance(t, str) for t in new)):
                raise GuardrailError("texts do not match the texts sent")
            return Verdict(name=spec.name, mode=mode, status=MASKED,
                           message="texts replaced by the guardrail", texts=tuple(new))
        raise GuardrailError(f"unknown action {action!r}")


def content_filter(spec: GuardrailSpec, mode: str, texts: Sequence[str]) -> Verdict:
    """The content filter's verdict on ``texts`` (pure)."""
    out = list(texts)
    masked: list[str] = []
    for rule in spec.patterns:
        for i, text in enumerate(out):
            if not rule.regex.search(text):
                continue
            if rule.action == "BLOCK":
                return Verdict(name=spec.name, mode=mode, status=BLOCKED,
                               message=f"content matched '{rule.name}'")
            out[i] = rule.regex.sub(f"[{rule.name.upper()}_REDACTED]", text)
            if rule.name not in masked:
                masked.append(rule.name)
    if not masked:
        return Verdict(name=spec.name, mode=mode, status=PASSED)
    return Verdict(name=spec.name, mode=mode, status=MASKED,
                   message=f"masked: {', '.join(masked)}", texts=tuple(out))
