"""The router: read routing state before the call, run the call with retries, record after.

Three steps, each fitting the gateway's two waits on Redis:

1. :meth:`Router.read`, a participant of the request's batch scope, declares ONE
   ``routing_state.lua`` call per group (the requested group and each of its fallbacks),
   all in the same round as auth, budgets, rate limits and the cache, so a fallback never
   costs an extra wait. For ``least-busy`` the requested group's call also claims a slot
   (a lease in a ZSET, so a dead process's claims expire). If Redis does not answer, the
   router fails open: the state comes from the :class:`LocalMirror` and is ``degraded``.
2. :meth:`Router.run` calls deployments with the configured strategy, retries and
   fallbacks (``retries.py``), noting every outcome in the mirror at once so later
   requests of this process avoid a deployment that just failed.
3. :meth:`Router.record`, sync, declares one ``routing_record.lua`` call per group touched
   on the request's post-call batch: usage, failures, cooldowns, latency, and the release
   of the least-busy claim, idempotent by request id.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, TypeVar, final

import attrs

from triogate.batch import BackendUnavailable, CommandError, Script
from triogate.errors import TriogateError
from triogate.governance.decisions import Allowed, Rejected
from triogate.routing import cooldowns, keys, strategies
from triogate.routing.cooldowns import NoDeploymentAvailable as NoDeploymentAvailable
from triogate.routing.failures import FailureLog
from triogate.routing.models import bind
from triogate.routing.retries import Attempt as Attempt
from triogate.routing.retries import RetryPolicy, is_retryable, run_with_fallbacks
from triogate.routing.retries import RouteResult as RouteResult
from triogate.routing.state import LATENCY_ALPHA, DeploymentState, GroupState, LocalMirror
from triogate.routing.state import RequestRouting as RequestRouting
from triogate.routing.state import RoutingState as RoutingState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from triogate.batch import Batch, Handle, PostCallBatch
    from triogate.config import Deployment, GatewayConfig

T = TypeVar("T")

logger = logging.getLogger("triogate.routing")

OWNER = "routing"
STATE_SCRIPT = Script.from_package("triogate.lua", "routing_state.lua")
RECORD_SCRIPT = Script.from_package("triogate.lua", "routing_record.lua")

#: The usage hash of a minute outlives the minute, so a late record still lands in it.
USAGE_TTL_MS = 120_000
#: Replays later than this could count twice; by then the minute they count in is no
#: longer read and their cooldowns have ended (only a latency sample could count twice),
#: while a longer TTL would hold one more key per request for longer.
MARKER_TTL_MS = 600_000
#: A deployment unused for this long forgets its latency (and is tried again as new).
LATENCY_TTL_MS = 3_600_000
#: Values per deployment in a ``routing_state.lua`` reply.
_STATE_FIELDS = 6


class UnknownGroup(TriogateError, LookupError):
    """Raised by ``Router.read`` (and ``route_groups``) for a model group not in the config."""


@final
@attrs.frozen(kw_only=True)
class RoutingFacts:
    """What the router needs to know of a request.

    Attributes:
        request_id: unique per request; keys least-busy claims and record markers.
        now_ms: epoch ms (the app's injectable clock) when the request is routed.
        estimate_tokens: estimated prompt + output tokens, for TPM limits.
        request: the request's own routing controls (model, fallbacks, retries, timeout).
    """

    request_id: str
    now_ms: int
    estimate_tokens: int = 0
    request: RequestRouting = attrs.Factory(RequestRouting)


@final
@attrs.frozen(kw_only=True)
class PendingRead:
    """The declarations of :meth:`Router.declare_read`, waiting for their round."""

    group: str
    facts: RoutingFacts
    groups: tuple[str, ...]
    handles: tuple[Handle[object], ...]


@final
class Router:
    """Chooses deployments of model groups; see the module docstring.

    Args:
        config: the gateway's configuration (deployments, ``router`` settings, lease).
        rng: randomness for shuffles and tie-breaks (seed it in tests).
        clock_ms: epoch milliseconds (the app's clock), for cooldowns during retries and
            for records.
        backend: the batch backend holding routing state.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        rng: random.Random | None = None,
        clock_ms: Callable[[], int],
        backend: str = "counters",
    ) -> None:
        self._settings = config.router
        self._strategy = strategies.normalise(config.router.strategy)
        self._groups = config.groups
        self._by_id = {d.id: d for d in config.deployments}
        self._lease_ms = round(config.settings.governance.lease_s * 1000)
        self._rng = rng if rng is not None else random.Random()
        self._clock_ms = clock_ms
        self._backend = backend
        self._policy = RetryPolicy(
            num_retries=config.router.num_retries, retry_after_s=config.router.retry_after_s
        )
        self.mirror = LocalMirror()
        #: Warnings about failing deployments (one per deployment per 10 s).
        self.failures = FailureLog()

    @property
    def strategy(self) -> str:
        """The strategy in use (``usage-based-routing-v2`` reads as ``usage-based-routing``)."""
        return self._strategy

    def fallbacks(self, group: str, request: RequestRouting | None = None) -> tuple[str, ...]:
        """The groups tried after ``group`` fails: the request's own, else the config's."""
        if request is not None and request.fallbacks:
            return request.fallbacks
        return tuple(self._settings.fallbacks.get(group, ()))

    def route_groups(self, group: str, request: RequestRouting | None = None
                     ) -> tuple[str, ...]:
        """``group``, its fallbacks, then its context-window fallbacks, in order, without
        repeats or unknown groups: every group the request may be routed to.

        Raises:
            UnknownGroup: ``group`` has no deployment in the config.
        """
        if group not in self._groups:
            raise UnknownGroup(f"unknown model group {group!r}")
        out = [group]
        for g in (*self.fallbacks(group, request),
                  *self._settings.context_window_fallbacks.get(group, ())):
            if g in self._groups and g not in out:
                out.append(g)
        return tuple(out)

    # ------------------------------------------------------------------ before the call

    async def read(self, batch: Batch, group: str, facts: RoutingFacts) -> RoutingState:
        """Read the state of ``group`` and its fallbacks: one script call per group, one round.

        For ``least-busy`` the call for ``group`` also claims a slot on its least busy
        eligible deployment (:attr:`RoutingState.claimed`); :meth:`record` releases it.
        A group whose call fails (Redis unreachable, or an error reply) is built from the
        local mirror and marked degraded: routing fails open. A checkpoint.

        Raises:
            UnknownGroup: ``group`` is not configured.
        """
        return await self.finish_read(self.declare_read(batch, group, facts))

    def declare_read(self, batch: Batch, group: str, facts: RoutingFacts) -> PendingRead:
        """:meth:`read`'s declarations alone (sync): a caller that waits on the batch for
        something else anyway (the admission's host) reads the state without a task, with
        :meth:`finish_read` once the round has left.

        Raises:
            UnknownGroup: ``group`` is not configured.
        """
        groups = self.route_groups(group, facts.request)
        least_busy = self._strategy == strategies.LEAST_BUSY
        # Where the claim's scan starts: ties go to a random deployment, not the first.
        offset = self._rng.randrange(len(self._groups[group])) if least_busy else 0
        handles = []
        for i, g in enumerate(groups):
            claim = i == 0 and least_busy
            deployments = self._groups[g]
            handles.append(
                batch.call(
                    STATE_SCRIPT,
                    keys=self._state_keys(g, deployments, facts.now_ms),
                    args=[
                        facts.now_ms,
                        "claim" if claim else "read",
                        facts.request_id,
                        self._lease_ms,
                        facts.estimate_tokens,
                        offset,
                        *[v for d in deployments for v in (d.id, d.rpm or 0, d.tpm or 0)],
                    ],
                    backend=self._backend,
                    owner=OWNER,
                )
            )
        return PendingRead(group=group, facts=facts, groups=groups, handles=tuple(handles))

    async def finish_read(self, pending: PendingRead) -> RoutingState:
        """The :class:`RoutingState` of a :meth:`declare_read`: awaits its handles (the
        first await is the round's wait unless it has left already). A checkpoint."""
        facts = pending.facts
        states: list[GroupState] = []
        claimed: str | None = None
        for g, handle in zip(pending.groups, pending.handles, strict=True):
            deployments = self._groups[g]
            try:
                index, state = _parse_state(g, deployments, await handle)
            except (BackendUnavailable, CommandError, ValueError) as exc:
                logger.warning("routing state of %r unavailable, using local state: %s", g, exc)
                state = self.mirror.snapshot(g, deployments, facts.now_ms)
            else:
                self.mirror.observe(state, facts.now_ms)
                if index:
                    claimed = deployments[index - 1].id
            states.append(state)
        return RoutingState(
            group=pending.group,
            groups=tuple(states),
            request_id=facts.request_id,
            estimate_tokens=facts.estimate_tokens,
            now_ms=facts.now_ms,
            claimed=claimed,
            request=facts.request,
        )

    async def snapshot(self, batch: Batch, groups: Sequence[str], *, now_ms: int
                       ) -> list[GroupState]:
        """Each group's state, read-only (no least-busy claim): for dashboards. One round;
        a group Redis did not answer for comes from the local mirror, marked degraded."""
        handles = [
            batch.call(
                STATE_SCRIPT,
                keys=self._state_keys(g, self._groups[g], now_ms),
                args=[now_ms, "read", "snapshot", self._lease_ms, 0, 0,
                      *[v for d in self._groups[g] for v in (d.id, d.rpm or 0, d.tpm or 0)]],
                backend=self._backend,
                owner=OWNER,
            )
            for g in groups
        ]
        out: list[GroupState] = []
        for g, handle in zip(groups, handles, strict=True):
            try:
                out.append(_parse_state(g, self._groups[g], await handle)[1])
            except (BackendUnavailable, CommandError, ValueError):
                out.append(self.mirror.snapshot(g, self._groups[g], now_ms))
        return out

    def _state_keys(self, group: str, deployments: Sequence[Deployment], now_ms: int) -> list[str]:
        return [
            keys.usage_key(group, now_ms),
            keys.cooldown_key(group),
            keys.latency_key(group),
            *[keys.inflight_key(group, d.id) for d in deployments],
        ]

    def pick(
        self,
        state: RoutingState,
        *,
        group: str | None = None,
        exclude: frozenset[str] = frozenset(),
        estimate_tokens: int | None = None,
        now_ms: int | None = None,
    ) -> Deployment | None:
        """Choose a deployment of ``group`` (default: the request's) from ``state`` alone.

        Pure apart from the router's RNG: no Redis, no mirror. Deployments cooling down
        or over their limits are never chosen; those in ``exclude`` only when nothing
        else remains. Returns None when no deployment may be called.
        """
        view = state.group_state(group or state.group)
        chosen = strategies.choose(
            self._strategy,
            view.deployments,
            now_ms=state.now_ms if now_ms is None else now_ms,
            estimate_tokens=state.estimate_tokens if estimate_tokens is None else estimate_tokens,
            rng=self._rng,
            exclude=exclude,
        )
        return None if chosen is None else chosen.deployment

    def decide(self, state: RoutingState) -> Allowed | Rejected:
        """The routing decision for the request's fixed-order checks (``decisions.ORDER``).

        Rejected (429 when deployments are only over their limits, 503 when all cool down)
        if no group, fallbacks included, has a deployment that may be called now.
        """
        views = [self.mirror.overlay(g, state.now_ms) for g in state.groups]
        for view in views:
            if strategies.candidates(
                view.deployments, now_ms=state.now_ms, estimate_tokens=state.estimate_tokens
            ):
                return Allowed(degraded=state.degraded)
        retry_after_s, reason = cooldowns.unavailable(
            [s for v in views for s in v.deployments],
            now_ms=state.now_ms,
            estimate_tokens=state.estimate_tokens,
        )
        limits = reason == "limits"
        return Rejected(
            check="routing",
            reason="no_deployment_available",
            message=str(NoDeploymentAvailable(state.group, retry_after_s, reason=reason)),
            status=429 if limits else 503,
            error_type="rate_limit_error" if limits else "service_unavailable",
            retry_after_s=retry_after_s,
            degraded=state.degraded,
        )

    # ------------------------------------------------------------------ the call

    async def run(
        self,
        state: RoutingState,
        call: Callable[[Deployment], Awaitable[T]],
        facts: RoutingFacts | None = None,
        *,
        allowed: Callable[[str], bool] | None = None,
    ) -> RouteResult[T]:
        """Call a deployment, retrying and falling back per the router settings.

        Each pick sees ``state`` overlaid with the mirror (so failures seen since the read
        count). With ``least-busy`` the first attempt goes to the claimed deployment.
        Every attempt is appended to ``state.attempts`` and noted in the mirror as it ends.

        Args:
            state: from :meth:`read`.
            call: the model call on one deployment.
            facts: overrides the state's ``estimate_tokens`` when given.
            allowed: whether the caller may use a fallback group (its key's, team's and
                user's model lists): a fallback it may not use is never tried. The
                request's own group was checked at admission.

        Raises:
            ProviderError: non-retryable at once, or the last error when exhausted.
            NoDeploymentAvailable: no deployment of any group could be called.

        A checkpoint.
        """
        estimate_tokens = state.estimate_tokens if facts is None else facts.estimate_tokens
        request = state.request

        def bound(deployment: Deployment) -> Deployment:
            """The deployment as this request calls it: its wildcard filled, its timeout
            no longer than the request's."""
            deployment = bind(deployment, request.model)
            if request.timeout_s is not None and request.timeout_s < deployment.timeout_s:
                deployment = attrs.evolve(
                    deployment, timeout_s=request.timeout_s,
                    stream_timeout_s=min(deployment.stream_timeout_s, request.timeout_s))
            return deployment

        def pick(group: str, failed: frozenset[str]) -> Deployment:
            now_ms = self._clock_ms()
            view = self.mirror.overlay(state.group_state(group), now_ms)
            if group == state.group and state.claimed and state.claimed not in failed:
                claimed = view.get(state.claimed)
                if claimed and not cooldowns.is_cooling(claimed.cooldown_until_ms, now_ms):
                    return bound(claimed.deployment)
            chosen = strategies.choose(
                self._strategy,
                view.deployments,
                now_ms=now_ms,
                estimate_tokens=estimate_tokens,
                rng=self._rng,
                exclude=failed,
            )
            if chosen is None:
                retry_after_s, reason = cooldowns.unavailable(
                    view.deployments, now_ms=now_ms, estimate_tokens=estimate_tokens
                )
                raise NoDeploymentAvailable(group, retry_after_s, reason=reason)
            return bound(chosen.deployment)

        async def tracked(deployment: Deployment) -> T:
            self.mirror.begin(deployment.id)
            try:
                return await call(deployment)
            finally:
                self.mirror.end(deployment.id)

        def on_attempt(attempt: Attempt) -> None:
            state.attempts.append(attempt)
            now_ms = self._clock_ms()
            if attempt.ok:
                self.mirror.note_success(
                    attempt.deployment_id, now_ms=now_ms, latency_ms=attempt.latency_s * 1000
                )
            elif attempt.error is not None and is_retryable(attempt.error):
                known = self._by_id.get(attempt.deployment_id)
                self.failures.note(known.group if known else state.group,
                                   attempt.deployment_id, attempt.error, now_ms=now_ms)
                self.mirror.note_failure(
                    attempt.deployment_id,
                    now_ms=now_ms,
                    allowed_fails=self._settings.allowed_fails,
                    cooldown_s=self._settings.cooldown_s,
                )

        read = {g.group for g in state.groups}
        if allowed is not None:
            read = {g for g in read if g == state.group or allowed(g)}
        groups = [state.group, *(g for g in self.fallbacks(state.group, request) if g in read)]
        policy = self._policy if request.num_retries is None else attrs.evolve(
            self._policy, num_retries=request.num_retries)
        return await run_with_fallbacks(
            groups,
            tracked,
            policy=policy,
            pick=pick,
            on_attempt=on_attempt,
            context_groups=[g for g in self._settings.context_window_fallbacks.get(
                state.group, ()) if g in read],
        )

    # ------------------------------------------------------------------ after the call

    def record(
        self,
        post: PostCallBatch,
        state: RoutingState,
        result: RouteResult[T] | None = None,
        facts: RoutingFacts | None = None,
        *,
        usage_tokens: int = 0,
        now_ms: int | None = None,
    ) -> None:
        """Declare the request's routing writes on its post-call batch. Sync; never blocks.

        One ``routing_record.lua`` call per group touched (by an attempt, or by the
        least-busy claim), idempotent by request id. Successful attempt: RPM + 1, TPM +
        ``usage_tokens``, latency EWMA. Retryable failure: failure count, cooldown once it
        reaches ``allowed_fails``. Non-retryable failures are the request's fault and
        count nothing. The claim is always released. Call it after rejections and cache
        hits too when a claim was made (``result`` None, no attempts).

        Args:
            post: the request's post-call batch.
            state: from :meth:`read`; its ``attempts`` are used when ``result`` is None
                (a run that raised).
            result: what :meth:`run` returned, if it returned.
            facts: overrides the state's request id when given.
            usage_tokens: tokens the successful call used.
            now_ms: epoch ms of the record (default: the router's clock).
        """
        now_ms = self._clock_ms() if now_ms is None else now_ms
        request_id = state.request_id if facts is None else facts.request_id
        attempts = result.attempts if result is not None else tuple(state.attempts)
        success_id = result.deployment.id if result is not None else None
        items: dict[str, list[str | int]] = {}
        for attempt in attempts:
            deployment = self._by_id.get(attempt.deployment_id)
            if deployment is None:
                continue
            if attempt.ok:
                tokens = usage_tokens if attempt.deployment_id == success_id else 0
                entry: list[str | int] = [
                    deployment.id, "ok", tokens, f"{attempt.latency_s * 1000:.3f}"
                ]
            elif attempt.error is not None and is_retryable(attempt.error):
                entry = [deployment.id, "fail", 0, 0]
            else:
                continue
            items.setdefault(deployment.group, []).extend(entry)
        release: dict[str, list[str]] = {}
        claimed = self._by_id.get(state.claimed) if state.claimed else None
        if claimed is not None:
            release[claimed.group] = [keys.inflight_key(claimed.group, claimed.id)]
            items.setdefault(claimed.group, [])
        for group, args in items.items():
            post.call(
                RECORD_SCRIPT,
                keys=[
                    keys.record_markers_key(group, now_ms),
                    keys.usage_key(group, now_ms),
                    keys.cooldown_key(group),
                    keys.latency_key(group),
                    *release.get(group, []),
                ],
                args=[
                    now_ms,
                    request_id,
                    # from the minute's first marker: every marker lives >= MARKER_TTL_MS
                    MARKER_TTL_MS + keys.MINUTE_MS,
                    USAGE_TTL_MS,
                    cooldowns.threshold(self._settings.allowed_fails),
                    round(self._settings.cooldown_s * 1000),
                    repr(LATENCY_ALPHA),
                    LATENCY_TTL_MS,
                    *args,
                ],
                backend=self._backend,
                owner=OWNER,
                replay_window_ms=MARKER_TTL_MS,
            )
        if success_id is not None and usage_tokens:
            self.mirror.note_tokens(success_id, now_ms=now_ms, tokens=usage_tokens)


def _parse_state(
    group: str, deployments: Sequence[Deployment], reply: object
) -> tuple[int, GroupState]:
    """Decode a ``routing_state.lua`` reply: (1-based claimed index or 0, the group state).

    Raises:
        ValueError: the reply does not have the script's shape (a version mismatch).
    """
    if not isinstance(reply, list) or len(reply) != 1 + _STATE_FIELDS * len(deployments):
        raise ValueError(f"unexpected routing_state reply for {group!r}: {reply!r}")
    try:
        claimed = int(reply[0])
        states = []
        for i, d in enumerate(deployments):
            rpm, tpm, fails, until_ms, in_flight, latency = reply[
                1 + _STATE_FIELDS * i : 1 + _STATE_FIELDS * (i + 1)
            ]
            states.append(
                DeploymentState(
                    deployment=d,
                    rpm_used=int(rpm),
                    tpm_used=int(tpm),
                    fails=int(fails),
                    cooldown_until_ms=int(until_ms),
                    in_flight=int(in_flight),
                    latency_ms=float(latency) if latency else None,
                )
            )
    except TypeError as exc:
        raise ValueError(f"unexpected routing_state reply for {group!r}: {reply!r}") from exc
    if not 0 <= claimed <= len(deployments):
        raise ValueError(f"routing_state claimed index {claimed} out of range for {group!r}")
    return claimed, GroupState(group=group, deployments=tuple(states))
