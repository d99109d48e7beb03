"""Routing state: what a request knows about its deployments, and the process-local mirror.

:class:`RoutingState` is one request's view, read from Redis before the model call (one
``routing_state.lua`` call per group, the group and its fallbacks), or built from the
:class:`LocalMirror` when Redis did not answer (``degraded``).

:class:`LocalMirror` is what *this process* has seen (reads) or done (attempts): usage of
the current minute, failures and cooldowns, latency, its own requests in flight. It lets
the router fail open with the best knowledge it has, and lets a later request in this
process avoid a deployment that just failed before Redis has heard about it. Its size is
bounded by the number of configured deployments; it is owned by the :class:`Router`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

import attrs

from triogate.routing import cooldowns
from triogate.routing.keys import minute_of
from triogate.routing.records import DeploymentState as DeploymentState

if TYPE_CHECKING:
    from collections.abc import Sequence

    from triogate.config import Deployment
    from triogate.routing.records import Attempt

#: Weight of a new latency sample in the EWMA (here and in ``routing_record.lua``).
LATENCY_ALPHA = 0.3


@final
@attrs.frozen(kw_only=True)
class GroupState:
    """The deployments of one model group, in configuration order.

    Attributes:
        group: the model group.
        deployments: one state per deployment.
        degraded: built from the local mirror because Redis did not answer.
    """

    group: str
    deployments: tuple[DeploymentState, ...]
    degraded: bool = False

    def get(self, deployment_id: str) -> DeploymentState | None:
        """The state of one deployment of this group, if it is one."""
        for s in self.deployments:
            if s.id == deployment_id:
                return s
        return None


@final
@attrs.frozen(kw_only=True)
class RequestRouting:
    """What one request asks of routing beyond its group (LiteLLM's request controls).

    Attributes:
        model: the requested model name, sent upstream by wildcard deployments.
        fallbacks: the request's own ``fallbacks`` (groups), in place of the config's.
        num_retries: the request's retries per group (already capped by the config).
        timeout_s: the request's timeout; each deployment's own is the upper bound.
    """

    model: str | None = None
    fallbacks: tuple[str, ...] = ()
    num_retries: int | None = None
    timeout_s: float | None = None


@final
@attrs.frozen(kw_only=True)
class RoutingState:
    """One request's routing view, returned by ``Router.read``.

    Attributes:
        group: the model group the request asked for.
        groups: that group first, then its fallbacks in order (each read in full).
        request_id: the request's id (claims and record markers are keyed by it).
        estimate_tokens: the request's estimated tokens (TPM limits).
        now_ms: epoch ms of the read.
        claimed: id of the deployment whose least-busy slot the read claimed, if any.
        attempts: appended to by ``Router.run`` as it goes, so ``Router.record`` can record
            a run that raised. Owned by the request's task; not shared.
    """

    group: str
    groups: tuple[GroupState, ...]
    request_id: str
    estimate_tokens: int = 0
    now_ms: int
    claimed: str | None = None
    request: RequestRouting = attrs.Factory(RequestRouting)
    attempts: list[Attempt] = attrs.field(factory=list, eq=False)

    @property
    def degraded(self) -> bool:
        """Whether any group's state came from the local mirror (Redis did not answer)."""
        return any(g.degraded for g in self.groups)

    def group_state(self, group: str) -> GroupState:
        """The state of ``group`` (the request's group or one of its fallbacks).

        Raises:
            KeyError: ``group`` was not read for this request.
        """
        for g in self.groups:
            if g.group == group:
                return g
        raise KeyError(group)


@attrs.define
class _Local:
    """What this process knows of one deployment. Counters are for ``minute`` only."""

    minute: int = -1
    rpm_used: int = 0
    tpm_used: int = 0
    fails: int = 0
    cooldown_until_ms: int = 0
    latency_ms: float | None = None
    in_flight: int = 0

    def roll(self, now_ms: int) -> None:
        minute = minute_of(now_ms)
        if minute != self.minute:
            self.minute, self.rpm_used, self.tpm_used, self.fails = minute, 0, 0, 0


@final
class LocalMirror:
    """This process's own knowledge of deployments; see the module docstring.

    Every method is sync and cheap. Entries are keyed by deployment id, so the mirror
    holds at most one entry per configured deployment.
    """

    def __init__(self) -> None:
        self._by_id: dict[str, _Local] = {}

    def _get(self, deployment_id: str, now_ms: int) -> _Local:
        local = self._by_id.get(deployment_id)
        if local is None:
            local = self._by_id[deployment_id] = _Local()
        local.roll(now_ms)
        return local

    # ------------------------------------------------------------------ learning

    def observe(self, group: GroupState, now_ms: int) -> None:
        """Adopt what a Redis read returned (it includes other processes' usage).

        Counters merge by maximum, not sum: Redis already holds what this process
        recorded once its post-call writes have settled.
        """
        for s in group.deployments:
            local = self._get(s.id, now_ms)
            local.rpm_used = max(local.rpm_used, s.rpm_used)
            local.tpm_used = max(local.tpm_used, s.tpm_used)
            local.fails = max(local.fails, s.fails)
            local.cooldown_until_ms = max(local.cooldown_until_ms, s.cooldown_until_ms)
            if s.latency_ms is not None:
                local.latency_ms = s.latency_ms

    def note_success(self, deployment_id: str, *, now_ms: int, latency_ms: float) -> None:
        """A call succeeded: one more request this minute, and a latency sample."""
        local = self._get(deployment_id, now_ms)
        local.rpm_used += 1
        local.latency_ms = (
            latency_ms
            if local.latency_ms is None
            else LATENCY_ALPHA * latency_ms + (1 - LATENCY_ALPHA) * local.latency_ms
        )

    def note_tokens(self, deployment_id: str, *, now_ms: int, tokens: int) -> None:
        """Tokens a successful call used (known only once its response has ended)."""
        self._get(deployment_id, now_ms).tpm_used += tokens

    def note_failure(
        self, deployment_id: str, *, now_ms: int, allowed_fails: int, cooldown_s: float
    ) -> bool:
        """A call failed with a retryable error; returns whether a cooldown started."""
        local = self._get(deployment_id, now_ms)
        local.fails += 1
        if cooldowns.failure_starts_cooldown(
            local.fails, allowed_fails=allowed_fails, cooldown_s=cooldown_s
        ):
            until_ms = now_ms + round(cooldown_s * 1000)
            local.cooldown_until_ms = max(local.cooldown_until_ms, until_ms)
            return True
        return False

    def begin(self, deployment_id: str) -> None:
        """A call of this process to the deployment starts."""
        local = self._by_id.get(deployment_id)
        if local is None:
            local = self._by_id[deployment_id] = _Local()
        local.in_flight += 1

    def end(self, deployment_id: str) -> None:
        """A call started with :meth:`begin` ended (however it ended)."""
        local = self._by_id.get(deployment_id)
        if local is not None and local.in_flight > 0:
            local.in_flight -= 1

    # ------------------------------------------------------------------ views

    def cooling(self, now_ms: int) -> int:
        """How many deployments this process knows to be cooling down at ``now_ms``
        (its own failures and the cooldowns Redis reads returned)."""
        return sum(1 for local in self._by_id.values()
                   if cooldowns.is_cooling(local.cooldown_until_ms, now_ms))


    def snapshot(
        self, group: str, deployments: Sequence[Deployment], now_ms: int
    ) -> GroupState:
        """A degraded :class:`GroupState` from local knowledge alone."""
        states = []
        for d in deployments:
            local = self._get(d.id, now_ms)
            states.append(
                DeploymentState(
                    deployment=d,
                    rpm_used=local.rpm_used,
                    tpm_used=local.tpm_used,
                    fails=local.fails,
                    cooldown_until_ms=local.cooldown_until_ms
                    if cooldowns.is_cooling(local.cooldown_until_ms, now_ms)
                    else 0,
                    in_flight=local.in_flight,
                    latency_ms=local.latency_ms,
                )
            )
        return GroupState(group=group, deployments=tuple(states), degraded=True)

    def overlay(self, group: GroupState, now_ms: int) -> GroupState:
        """``group`` with what this process learned since it was read.

        Counters and cooldowns take the larger of the two; in-flight counts stay those of
        ``group`` unless it is degraded (then they are this process's own, current ones).
        """
        states = []
        changed = False
        for s in group.deployments:
            local = self._get(s.id, now_ms)
            in_flight = local.in_flight if group.degraded else s.in_flight
            latency_ms = s.latency_ms if s.latency_ms is not None else local.latency_ms
            if (local.rpm_used <= s.rpm_used and local.tpm_used <= s.tpm_used
                    and local.fails <= s.fails and local.cooldown_until_ms <= s.cooldown_until_ms
                    and in_flight == s.in_flight and latency_ms == s.latency_ms):
                states.append(s)  # nothing newer here (most requests): no copy
                continue
            changed = True
            states.append(DeploymentState(
                deployment=s.deployment,
                rpm_used=max(s.rpm_used, local.rpm_used),
                tpm_used=max(s.tpm_used, local.tpm_used),
                fails=max(s.fails, local.fails),
                cooldown_until_ms=max(s.cooldown_until_ms, local.cooldown_until_ms),
                in_flight=in_flight,
                latency_ms=latency_ms,
            ))
        return GroupState(group=group.group, deployments=tuple(states),
                          degraded=group.degraded) if changed else group
