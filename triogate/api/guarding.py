"""Guardrails on the request path: which texts of a body they read, and when they run.

* ``pre_call``: :func:`pre_call`, each guardrail a participant of the admission scope
  (run inline by the request's task after the round's checks, one after another: it
  declares no Redis command, so the request still waits once before the call). It may
  mask the body sent upstream.
* ``during_call``: :func:`during_call` runs the guardrails in a task next to the model
  call (and a stream's first event); the answer leaves only once they passed.
* ``post_call``: :func:`post_call` reads the whole answer before any of it is sent; it
  may mask the answer's text. A streaming request it applies to is asked of the model
  whole and then sent as a stream (``flow._stream_checked``).

Which run: the default-on ones (unless the key or its team sets
``disable_global_guardrails``) and those the request, its key or its team names
(``metadata.guardrails`` of the key and team rows, which the identity already holds).

A blocking verdict answers 400 with the guardrail's message, in the API's own error
shape. Every verdict is kept on the admission, and so on the request's spend row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from triogate.governance.decisions import Rejected
from triogate.governance.guardrails import BLOCKED, MASKED

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.api.records import Admission, Call
    from triogate.api.services import Services
    from triogate.config_governance import GuardrailSpec
    from triogate.governance.guardrails import Verdict
    from triogate.governance.principals import Identity

#: A place a text lives in a body: (container, key or index).
Slot = tuple[Any, Any]


def _text_parts(container: Any, key: Any, slots: list[Slot], *,
                types: tuple[str, ...] = ("text", "input_text", "output_text")) -> None:
    """``container[key]``'s text: a string, or a list of ``{"type": "text", "text"}``."""
    value = container[key]
    if isinstance(value, str):
        slots.append((container, key))
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, dict) and part.get("type") in types and isinstance(
                    part.get("text"), str):
                slots.append((part, "text"))


def request_slots(api: str, body: dict[str, Any]) -> list[Slot]:
    """Where the prompt's texts are in a request body of ``api``."""
    slots: list[Slot] = []
    for name in ("system", "instructions"):
        if name in body:
            _text_parts(body, name, slots)
    if api == "embeddings" or (api == "responses" and isinstance(body.get("input"), str)):
        value = body.get("input")
        if isinstance(value, str):
            slots.append((body, "input"))
        elif isinstance(value, list):
            slots += [(value, i) for i, v in enumerate(value) if isinstance(v, str)]
        return slots
    items = body.get("input") if api == "responses" else body.get("messages")
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and "content" in item:
            _text_parts(item, "content", slots)
    return slots


def response_slots(api: str, body: dict[str, Any]) -> list[Slot]:
    """Where the answer's texts are in a (non-streamed) response body of ``api``."""
    slots: list[Slot] = []
    if api == "chat":
        for choice in body.get("choices") or ():
            message = choice.get("message") if isinstance(choice, dict) else None
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                slots.append((message, "content"))
    elif api == "messages":
        _text_parts(body, "content", slots)
    elif api == "responses":
        for item in body.get("output") or ():
            if isinstance(item, dict) and "content" in item:
                _text_parts(item, "content", slots)
    return slots


def _requested(call: Call, identity: Identity | None) -> tuple[tuple[str, ...], bool]:
    """The names the request and its key and team give (LiteLLM adds them up), and
    whether the key or team turns the default-on guardrails off. Read from the identity
    as the admission resolved it (memory, or the round's MGET): no further wait."""
    if identity is None:
        return call.guardrails, False
    names, off = identity.guardrails()
    return tuple(dict.fromkeys((*call.guardrails, *names))), off


def _blocked(verdict: Verdict) -> Rejected:
    return Rejected(check="guardrails", reason="guardrail_violation",
                    message=f"Violated guardrail policy '{verdict.name}': {verdict.message}",
                    status=400, error_type="invalid_request_error")


async def _one(services: Services, call: Call, spec: GuardrailSpec, verdicts: list[Verdict],
               mode: str, slots: list[Slot], input_type: str) -> Rejected | None:
    """Run ``spec`` over the texts in ``slots``; write masked texts back; its block."""
    guards = services.guardrails
    assert guards is not None
    texts = [container[key] for container, key in slots]
    verdict = await guards.check(spec, mode, texts, input_type=input_type,
                                 call_id=call.trace_id, model=call.group)
    verdicts.append(verdict)
    if verdict.status == BLOCKED:
        return _blocked(verdict)
    if verdict.status == MASKED and verdict.texts is not None:
        for (container, key), text in zip(slots, verdict.texts, strict=True):
            container[key] = text
    return None


async def _run(services: Services, call: Call, admitted: Admission, mode: str,
               slots: list[Slot], input_type: str) -> Rejected | None:
    """Run the guardrails of ``mode`` one after another (each sees the previous one's
    masking); the first block stops the run and is returned. A checkpoint."""
    for spec in active(services, call, mode, admitted.identity):
        rejected = await _one(services, call, spec, admitted.guardrails, mode, slots,
                              input_type)
        if rejected is not None:
            return rejected
    await trio.lowlevel.checkpoint()
    return None


def active(services: Services, call: Call, mode: str, identity: Identity | None
           ) -> list[GuardrailSpec]:
    """The guardrails that run in ``mode`` for ``call`` made by ``identity`` (sync,
    cheap)."""
    guards = services.guardrails
    if guards is None:
        return []
    names, off = _requested(call, identity)
    return guards.active(mode, names, global_off=off)


def wanted(services: Services, call: Call, mode: str, identity: Identity | None) -> bool:
    """Whether any guardrail runs in ``mode`` for ``call`` (sync, cheap)."""
    return bool(active(services, call, mode, identity))


async def pre_call(services: Services, call: Call, spec: GuardrailSpec,
                   verdicts: list[Verdict]) -> Rejected | None:
    """One ``pre_call`` guardrail over the request's texts (masking the body in place):
    a participant of the admission scope (it declares no Redis command)."""
    return await _one(services, call, spec, verdicts, "pre_call",
                      request_slots(call.api, call.body), "request")


async def during_call(services: Services, call: Call, admitted: Admission,
                      model_call: Callable[[], Awaitable[Any]]) -> Any:
    """``model_call()`` with the ``during_call`` guardrails running next to it; raises the
    block (an ``ApiError``-ready :class:`Rejected` in :class:`GuardrailBlocked`) once
    both are done. The texts are copied first: the call is already under way, so a
    ``during_call`` guardrail can block, never mask."""
    slots = [([text], 0) for text in
             (c[k] for c, k in request_slots(call.api, call.body))]
    verdict: list[Rejected | None] = [None]

    async def guard() -> None:
        verdict[0] = await _run(services, call, admitted, "during_call", slots, "request")

    failure: Exception | None = None
    result: Any = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(guard)
        try:
            result = await model_call()
        except Exception as exc:  # raised below, not wrapped in the nursery's group
            failure = exc
    if failure is not None:
        raise failure
    if verdict[0] is not None:
        raise GuardrailBlocked(verdict[0], result)
    return result


async def post_call(services: Services, call: Call, admitted: Admission,
                    body: dict[str, Any]) -> Rejected | None:
    """The ``post_call`` guardrails over a non-streamed answer (masking it in place)."""
    return await _run(services, call, admitted, "post_call",
                      response_slots(call.api, body), "response")


class GuardrailBlocked(Exception):
    """A ``during_call`` guardrail blocked a request whose model call had finished (its
    ``result`` is still settled: it was paid for)."""

    def __init__(self, rejected: Rejected, result: Any) -> None:
        super().__init__(rejected.message)
        self.rejected = rejected
        self.result = result
