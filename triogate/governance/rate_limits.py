"""Rate limits: a participant that admits a request against RPM, TPM and parallel windows.

Before the model call, :func:`admit` declares one ``rate_admit.lua`` call per principal
that has limits (key, team, user, end user, tags), all in the same round, and awaits
them together: one wait. Each call checks all of that principal's windows (its RPM, TPM
and parallel-request limits, plus a key's per-model RPM/TPM for the request's model
group) and counts the request only if all pass, atomically, in the principal's hash
tag. A principal that rejects writes nothing. Through ``governance.admit`` (the
gateway's path), a principal with a budget has its windows admitted by its
``budget_reserve.lua`` call instead (the same code); :func:`conclude` reads either reply.

Windows slide over 60 s in 1 s buckets (see the header of ``rate_admit.lua`` for why).
TPM is reserved on the request's estimate and settled on the actual usage afterwards.

After the call, :func:`settle` declares one ``rate_settle.lua`` per principal that
counted the request, on the post-call batch, idempotent by request id (the gateway uses
``governance.settle.settle``, where a principal that also settles a budget has this done
by its ``budget_settle.lua`` call, under the budget's marker):

* admitted (the call ran, failed upstream, or was a cache hit): the TPM bucket the
  estimate went to is corrected to the actual tokens; the parallel slot is released;
* not admitted (any check rejected the request): the RPM count and the TPM reservation
  are taken back and the slot released, so the request leaves no trace. This is also how
  principals that admitted are compensated when another principal (or another check)
  rejected in the same round.

When Redis does not answer: ``fail-open`` (the default) decides from process-local
sliding windows with the same limits (``local.py``), which also mirror every admission
this process made through Redis; ``fail-closed`` refuses with 503. Both say
``degraded=True``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, final

import attrs
import trio

from triogate.batch import BatchError, Script
from triogate.governance.decisions import Allowed, Rejected, check_failed, is_refusal
from triogate.governance.facts import Window, principal_label
from triogate.governance.keys import (
    MARKER_SLICE_MS,
    PARALLEL,
    RPM,
    TPM,
    rate_marker,
    rate_window_key,
)
from triogate.governance.local import BUCKET_MS

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping, Sequence

    from triogate.batch import Batch, Handle, PostCallBatch
    from triogate.governance.decisions import Decision
    from triogate.governance.facts import CheckSettings, RequestFacts
    from triogate.governance.local import LocalGovernance
    from triogate.governance.principals import Identity, Principal

OWNER = "rate_limits"
ADMIT = Script.from_package("triogate.lua", "rate_admit.lua")
SETTLE = Script.from_package("triogate.lua", "rate_settle.lua")

#: Settlement modes of ``rate_settle.lua``.
ADMITTED, UNDO, RELEASE = "a", "u", "x"

logger = logging.getLogger("triogate.governance.rate_limits")


@final
@attrs.frozen(kw_only=True)
class RateEntry:
    """One principal's part of a request's admission.

    Attributes:
        kind, id: the principal.
        label: how messages name it.
        windows: its windows checked for this request.
        counted: Redis admitted (and counted) the request at this principal.
        degraded: Redis did not answer for this principal: it may or may not have counted
            the request, so settlement only releases the parallel slot.
        local_counted: the process-local windows counted the request.
        remaining: per window, what was left after (or, when rejected, before) it.
    """

    kind: str
    id: str
    label: str
    windows: tuple[Window, ...]
    counted: bool
    degraded: bool
    local_counted: bool
    remaining: tuple[int, ...]


@final
@attrs.frozen(kw_only=True)
class RateAdmission:
    """Everything :func:`settle` needs, carried from admission to settlement.

    Attributes:
        bucket: the bucket (epoch second) the request was counted in.
        estimate_tokens: what the TPM windows reserved.
    """

    request_id: str
    bucket: int
    estimate_tokens: int
    entries: tuple[RateEntry, ...]
    backend: str
    marker_ttl_ms: int


@final
@attrs.frozen(kw_only=True)
class RateOutcome:
    """What :func:`admit` concluded.

    Attributes:
        decision: Allowed (with the ``x-ratelimit-*`` headers), or Rejected with
            ``check="rate_limits"``.
        admission: what to settle; None when no principal has limits (or master).
        local: the process-local state to update on settlement.
    """

    decision: Decision
    admission: RateAdmission | None = None
    local: LocalGovernance | None = attrs.field(default=None, eq=False, repr=False)


def windows_for(principal: Principal, model_group: str) -> tuple[Window, ...]:
    """The windows of ``principal`` that apply to a request for ``model_group``.

    Kept per (principal, limits, group): every request of a principal has the same ones.
    """
    limits = principal.limits
    key = (principal.kind, principal.id, limits.rpm, limits.tpm, limits.max_parallel,
           model_group, principal.model_rpm.get(model_group),
           principal.model_tpm.get(model_group))
    found = _WINDOWS.get(key)
    if found is None:
        if len(_WINDOWS) >= _MAX_WINDOWS:
            _WINDOWS.clear()
        found = _WINDOWS[key] = _windows_for(principal, model_group)
    return found


_WINDOWS: dict[tuple[object, ...], tuple[Window, ...]] = {}
_MAX_WINDOWS = 8192


def _windows_for(principal: Principal, model_group: str) -> tuple[Window, ...]:
    kind, pid, limits = principal.kind, principal.id, principal.limits
    out = []
    if limits.rpm is not None:
        out.append(Window(kind=RPM, key=rate_window_key(kind, pid, RPM), limit=limits.rpm))
    if limits.tpm is not None:
        out.append(Window(kind=TPM, key=rate_window_key(kind, pid, TPM), limit=limits.tpm))
    if limits.max_parallel is not None:
        out.append(
            Window(kind=PARALLEL, key=rate_window_key(kind, pid, PARALLEL),
                   limit=limits.max_parallel)
        )
    for window, table in ((RPM, principal.model_rpm), (TPM, principal.model_tpm)):
        if model_group in table:
            out.append(
                Window(kind=window, key=rate_window_key(kind, pid, window, model_group),
                       limit=table[model_group], model_group=model_group)
            )
    return tuple(out)


def _admit_args(
    request: RequestFacts, windows: Sequence[Window], lease_ms: int
) -> list[str | int]:
    args: list[str | int] = [request.now_ms, request.request_id, request.estimate_tokens, lease_ms]
    for w in windows:
        args += [w.code, w.limit]
    return args


def plans_for(
    identity: Identity, request: RequestFacts
) -> list[tuple[Principal, tuple[Window, ...]]]:
    """Each principal of ``identity`` with windows for ``request``, and those windows (none
    for the master key)."""
    if identity.master:
        return []
    return [(p, ws) for p in identity.principals() if (ws := windows_for(p, request.model_group))]


def declare_admit(
    batch: Batch, windows: Sequence[Window], request: RequestFacts, settings: CheckSettings
) -> Handle[object]:
    """Declare one principal's ``rate_admit.lua`` call (sync)."""
    return batch.call(
        ADMIT,
        keys=[w.key for w in windows],
        args=_admit_args(request, windows, settings.lease_ms),
        backend=settings.backend,
        owner=OWNER,
    )


async def admit(
    batch: Batch,
    identity: Identity,
    request: RequestFacts,
    settings: CheckSettings,
    local: LocalGovernance,
) -> RateOutcome:
    """Check and count ``request`` against every rate window of ``identity``.

    Declares every principal's script before awaiting any, so the participant costs one
    wait, shared with the round's other participants. Always a checkpoint; with nothing to
    check (master key, no limits) it declares nothing and joins no round.
    (The gateway uses ``governance.admit``, where a principal with a budget has its
    windows admitted by its ``budget_reserve.lua`` call.)
    """
    calls = [(p, ws, declare_admit(batch, ws, request, settings))
             for p, ws in plans_for(identity, request)]
    return await conclude(calls, request, settings, local)


async def conclude(
    calls: Sequence[tuple[Principal, tuple[Window, ...], Awaitable[object]]],
    request: RequestFacts,
    settings: CheckSettings,
    local: LocalGovernance,
) -> RateOutcome:
    """The rate limits' outcome from each principal's declared call: ``(principal, its
    windows, reply)``; awaits each reply. Always a checkpoint; without calls (nothing to
    check) the outcome is Allowed."""
    if not calls:
        await trio.lowlevel.checkpoint()
        return RateOutcome(decision=Allowed(), local=local)
    entries: list[RateEntry] = []
    rejected: Rejected | None = None
    unavailable = refused = False
    for p, ws, handle in calls:
        reply = await _reply(handle, len(ws))
        if reply == REFUSED:  # the script refused its arguments: decide nothing, refuse
            refused = True
            entries.append(RateEntry(
                kind=p.kind, id=p.id, label=principal_label(p), windows=ws, counted=False,
                degraded=True, local_counted=False, remaining=()))
            continue
        if isinstance(reply, tuple):
            admitted, failed, retry_ms, remaining = reply
            if admitted:  # mirror it locally, so the local windows know our traffic
                local.windows.count(
                    ws, request_id=request.request_id, estimate_tokens=request.estimate_tokens,
                    now_ms=request.now_ms, lease_ms=settings.lease_ms,
                )
            entry = RateEntry(
                kind=p.kind, id=p.id, label=principal_label(p), windows=ws, counted=admitted,
                degraded=False, local_counted=admitted, remaining=remaining,
            )
        elif settings.rate_limits_policy == "fail-open":
            verdict = local.windows.admit(
                ws, request_id=request.request_id, estimate_tokens=request.estimate_tokens,
                now_ms=request.now_ms, lease_ms=settings.lease_ms,
            )
            admitted, retry_ms, remaining = (
                verdict.admitted, verdict.retry_after_ms, verdict.remaining
            )
            failed = -1 if verdict.failed is None else verdict.failed
            entry = RateEntry(
                kind=p.kind, id=p.id, label=principal_label(p), windows=ws, counted=False,
                degraded=True, local_counted=admitted, remaining=remaining,
            )
        else:
            unavailable = True
            entries.append(
                RateEntry(
                    kind=p.kind, id=p.id, label=principal_label(p), windows=ws, counted=False,
                    degraded=True, local_counted=False, remaining=(),
                )
            )
            continue
        entries.append(entry)
        if rejected is None and not admitted:
            rejected = _limited(entry, failed, retry_ms, degraded=entry.degraded)

    admission = RateAdmission(
        request_id=request.request_id,
        bucket=request.now_ms // BUCKET_MS,
        estimate_tokens=request.estimate_tokens,
        entries=tuple(entries),
        backend=settings.backend,
        marker_ttl_ms=settings.settle_marker_ttl_ms,
    )
    headers = rate_headers(entries)
    decision: Decision
    if rejected is not None:
        decision = attrs.evolve(rejected, headers={**headers, **rejected.headers})
    elif refused:
        decision = check_failed("rate_limits")
    elif unavailable:
        decision = Rejected(
            check="rate_limits",
            reason="redis_unavailable",
            message="Rate limits cannot be checked right now (the counter store is "
            "unavailable); try again shortly",
            status=503,
            error_type="service_unavailable",
            retry_after_s=1.0,
            degraded=True,
        )
    else:
        decision = Allowed(headers=headers, degraded=any(e.degraded for e in entries))
    return RateOutcome(decision=decision, admission=admission, local=local)


#: What :func:`_reply` returns when the script refused its arguments.
REFUSED = "refused"


async def _reply(
    handle: Awaitable[object], windows: int
) -> tuple[bool, int, int, tuple[int, ...]] | str | None:
    """``(admitted, failed index (0-based, -1 if none), retry_after_ms, remaining)``, None
    when Redis could not decide, or :data:`REFUSED` when the script refused its arguments."""
    try:
        reply = await handle
    except BatchError as exc:
        if is_refusal(exc):
            logger.error("rate_admit refused its arguments: %s", exc)
            return REFUSED
        logger.warning("rate limit check could not reach Redis: %s", exc)
        return None
    if (
        not isinstance(reply, list)
        or len(reply) != 3 + windows
        or not all(isinstance(v, int) for v in reply)
    ):
        logger.error("rate_admit returned an unexpected reply: %r", reply)
        return None
    return bool(reply[0]), reply[1] - 1, reply[2], tuple(reply[3:])


_WHAT = {RPM: "requests per minute", TPM: "tokens per minute", PARALLEL: "parallel requests"}


def _limited(entry: RateEntry, failed: int, retry_ms: int, *, degraded: bool) -> Rejected:
    window = entry.windows[failed]
    what = _WHAT[window.kind]
    if window.model_group is not None:
        what += f" for model '{window.model_group}'"
    retry_s = retry_ms / 1000
    kind = entry.kind.replace("_", " ")
    return Rejected(
        check="rate_limits",
        reason="rate_limited",
        message=f"Rate limit exceeded for {kind} '{entry.label}': {window.limit} {what} "
        f"(retry after {retry_s:g} s)",
        status=429,
        error_type="rate_limit_error",
        retry_after_s=retry_s,
        degraded=degraded,
    )


def rate_headers(entries: Sequence[RateEntry]) -> Mapping[str, str]:
    """``x-ratelimit-{remaining,limit}-{requests,tokens}`` of the most constrained window.

    The most constrained window is the one with the least remaining, over every
    principal's RPM (for requests) and TPM (for tokens) windows, per-model ones included.
    """
    headers: dict[str, str] = {}
    for kind, noun in ((RPM, "requests"), (TPM, "tokens")):
        pairs = [
            (left, w.limit)
            for e in entries
            for w, left in zip(e.windows, e.remaining, strict=False)
            if w.kind == kind
        ]
        if pairs:
            left, limit = min(pairs)
            headers[f"x-ratelimit-remaining-{noun}"] = str(left)
            headers[f"x-ratelimit-limit-{noun}"] = str(limit)
    return headers


@final
@attrs.frozen(kw_only=True)
class RateSettlement:
    """What one principal's windows must do after the request (``rate_settle.lua``'s
    arguments), built by :func:`settle_plans`: declared alone (:func:`declare`), or carried
    by the same principal's budget settlement (``budgets.settle(..., rates=...)``)."""

    kind: str
    id: str
    window_keys: tuple[str, ...]
    codes: tuple[str, ...]
    request_id: str
    mode: str
    bucket: int
    estimate_tokens: int
    actual_tokens: int
    now_ms: int
    backend: str
    marker_ttl_ms: int
    #: It gives back a parallel slot: the client's next request may need it at once, so
    #: its batch leaves without the settler's group-commit delay (``PostCallBatch.hurry``).
    releases_slot: bool = False

    def args(self) -> list[str | int]:
        """``rate_settle.lua``'s mode .. now_ms (the part budget_settle.lua also takes)."""
        return [self.mode, self.bucket, self.estimate_tokens, self.actual_tokens, self.now_ms]


def settle(
    post: PostCallBatch,
    outcome: RateOutcome,
    request: RequestFacts,
    *,
    actual_tokens: int,
    admitted: bool,
    now_ms: int,
) -> tuple[Handle[object], ...]:
    """Settle the request's rate windows (sync, never blocks).

    Args:
        actual_tokens: tokens the request used (0 for a cache hit or when nothing ran).
        admitted: False when ANY check rejected the request: then it leaves no trace
            (its RPM count, TPM reservation and parallel slot are given back). A rate
            rejection is always treated as not admitted.
        now_ms: epoch ms now (a bucket that slid out of the window is left alone).

    Declares one ``rate_settle.lua`` per principal of :func:`settle_plans` on ``post``;
    each is idempotent by request id. Also updates the process-local windows.
    ``governance.settle.settle`` instead lets a principal's budget settlement carry its
    windows (one script per principal).

    Returns:
        The declared handles.

    Raises:
        ValueError: negative ``actual_tokens``, or another request's outcome.
        BatchClosed: ``post`` is closed.
    """
    plans = settle_plans(outcome, request, actual_tokens=actual_tokens, admitted=admitted,
                         now_ms=now_ms)
    return declare(post, plans)


def settle_plans(
    outcome: RateOutcome,
    request: RequestFacts,
    *,
    actual_tokens: int,
    admitted: bool,
    now_ms: int,
) -> tuple[RateSettlement, ...]:
    """What each principal's windows must do after the request (arguments as for
    :func:`settle`), and the process-local windows updated. Sync.

    One plan per principal that counted the request (or whose answer was lost and that
    has a parallel slot to release), unless it has nothing to change there (admitted, no
    parallel slot, and no TPM window or the actual tokens equal the estimate).

    Raises:
        ValueError: negative ``actual_tokens``, or another request's outcome.
    """
    admission = outcome.admission
    if admission is None:
        return ()
    if actual_tokens < 0:
        raise ValueError(f"actual_tokens must be >= 0, not {actual_tokens}")
    if request.request_id != admission.request_id:
        raise ValueError("settle() got another request's outcome")
    if isinstance(outcome.decision, Rejected):
        admitted = False
    plans = []
    for entry in admission.entries:
        if entry.local_counted and outcome.local is not None:
            outcome.local.windows.settle(
                entry.windows,
                request_id=admission.request_id,
                mode=ADMITTED if admitted else UNDO,
                bucket=admission.bucket,
                estimate_tokens=admission.estimate_tokens,
                actual_tokens=actual_tokens,
                now_ms=now_ms,
            )
        if entry.counted:
            mode = ADMITTED if admitted else UNDO
            if mode == ADMITTED and not any(
                w.kind == PARALLEL
                or (w.kind == TPM and actual_tokens != admission.estimate_tokens)
                for w in entry.windows
            ):
                # Nothing to change at this principal (its 'r' counts stand, no token
                # correction, no slot): no script, no marker. A replay finds nothing either.
                continue
        elif entry.degraded and any(w.kind == PARALLEL for w in entry.windows):
            mode = RELEASE
        else:
            continue
        plans.append(RateSettlement(
            kind=entry.kind,
            id=entry.id,
            window_keys=tuple(w.key for w in entry.windows),
            codes=tuple(w.code for w in entry.windows),
            request_id=admission.request_id,
            mode=mode,
            bucket=admission.bucket,
            estimate_tokens=admission.estimate_tokens,
            actual_tokens=actual_tokens,
            now_ms=now_ms,
            backend=admission.backend,
            marker_ttl_ms=admission.marker_ttl_ms,
            releases_slot=any(w.kind == PARALLEL for w in entry.windows),
        ))
    return tuple(plans)


def declare(post: PostCallBatch, plans: Sequence[RateSettlement]) -> tuple[Handle[object], ...]:
    """One ``rate_settle.lua`` per plan on ``post``, idempotent by request id (its marker
    in the principal's tag). Sync.

    Raises:
        BatchClosed: ``post`` is closed.
    """
    return tuple(
        post.call(
            SETTLE,
            keys=[*plan.window_keys, rate_marker(plan.kind, plan.id, plan.now_ms)],
            args=[
                plan.request_id,
                *plan.args(),
                plan.marker_ttl_ms + MARKER_SLICE_MS,  # from the slice's first marker
                *plan.codes,
            ],
            backend=plan.backend,
            owner=OWNER,
            # A replay after the marker expired would count twice.
            replay_window_ms=plan.marker_ttl_ms,
        )
        for plan in plans
    )
