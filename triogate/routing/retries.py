"""Retries and fallbacks: the policy as pure functions, and the one loop that applies it.

For each group in order (the requested group, then its fallbacks), the loop makes up to
``num_retries + 1`` attempts, each on a deployment chosen by ``pick`` (which avoids
deployments that failed in this request while others remain). Before a retry inside a
group it waits ``retry_after_s * 2**n`` on Trio's clock (n = 0 for the first retry,
capped). A retryable failure (:attr:`ProviderError.retryable`: timeouts, connect errors,
408, 429, 5xx) moves on; any other error is raised at once. A group with no deployment
that may be called is skipped. When everything is exhausted, the last provider error
is raised, or :class:`NoDeploymentAvailable` if no attempt could be made at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar, final

import attrs
import trio

from triogate.errors import ProviderError, ProviderStatusError
from triogate.routing.errors import NoDeploymentAvailable
from triogate.routing.records import Attempt as Attempt

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from triogate.config import Deployment

T = TypeVar("T")

#: Upper bound of one backoff wait, unless ``retry_after_s`` itself is larger.
MAX_BACKOFF_S = 30.0


@final
@attrs.frozen(kw_only=True)
class RouteResult(Generic[T]):
    """What ``Router.run`` returns on success.

    Attributes:
        value: what the successful ``call`` returned.
        deployment: the deployment that answered.
        attempts: every attempt, failed ones first, the successful one last.
        group_used: the group of that deployment (the request's, or a fallback).
    """

    value: T
    deployment: Deployment
    attempts: tuple[Attempt, ...]
    group_used: str


@final
@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How often to retry and how long to wait.

    Attributes:
        num_retries: retries per group after its first attempt.
        retry_after_s: the first backoff; each later retry in a group doubles it.
        max_backoff_s: cap of one wait (raised to ``retry_after_s`` if that is larger).
    """

    num_retries: int
    retry_after_s: float
    max_backoff_s: float = MAX_BACKOFF_S


def backoff_s(policy: RetryPolicy, retry: int) -> float:
    """The wait before retry number ``retry`` of a group (0-based): ``retry_after_s·2**n``."""
    cap_s = max(policy.max_backoff_s, policy.retry_after_s)
    return min(cap_s, policy.retry_after_s * 2.0 ** min(retry, 32))


def is_retryable(error: BaseException) -> bool:
    """Whether another attempt (another deployment) may succeed where this one failed."""
    return isinstance(error, ProviderError) and error.retryable


_CONTEXT_WINDOW = ("context_length_exceeded", "maximum context length", "context window",
                   "prompt is too long", "too many tokens")


def is_context_window_error(error: BaseException) -> bool:
    """Whether an upstream refused the request for being longer than its model takes."""
    if not isinstance(error, ProviderStatusError) or error.status not in (400, 413, 422):
        return False
    text = error.body.lower()
    return any(marker in text for marker in _CONTEXT_WINDOW)


async def run_with_fallbacks(
    groups: Sequence[str],
    call: Callable[[Deployment], Awaitable[T]],
    *,
    policy: RetryPolicy,
    pick: Callable[[str, frozenset[str]], Deployment],
    on_attempt: Callable[[Attempt], None],
    context_groups: Sequence[str] = (),
) -> RouteResult[T]:
    """Call deployments of ``groups`` in order until one succeeds; see the module docstring.

    Args:
        groups: the request's group, then its fallbacks.
        call: the model call on one deployment. For a stream it returns once the stream
            is open and its first event arrived; nothing is retried after that.
        policy: retry counts and backoff.
        pick: ``pick(group, failed_ids)`` returns a deployment or raises
            :class:`NoDeploymentAvailable` when none of that group may be called.
        on_attempt: told of every attempt as it ends (before any retry).
        context_groups: LiteLLM's ``context_window_fallbacks``: when an upstream says the
            prompt is too long for its model (:func:`is_context_window_error`), these
            groups are tried next, once, in place of the remaining ones.

    Raises:
        ProviderError: a non-retryable error at once; the last error when exhausted.
        NoDeploymentAvailable: no group had a deployment to call.
        Exception: anything else ``call`` raises, at once (it is not a provider failure).

    A checkpoint (it awaits ``call`` and sleeps between retries).
    """
    attempts: list[Attempt] = []
    last_error: ProviderError | None = None
    unavailable: NoDeploymentAvailable | None = None
    queue = list(groups)
    tried: set[str] = set()
    while queue:
        group = queue.pop(0)
        tried.add(group)
        failed: set[str] = set()
        for retry in range(policy.num_retries + 1):
            if retry:
                await trio.sleep(backoff_s(policy, retry - 1))
            try:
                deployment = pick(group, frozenset(failed))
            except NoDeploymentAvailable as exc:
                unavailable = exc if unavailable is None else _sooner(unavailable, exc)
                break
            started_s = trio.current_time()
            try:
                value = await call(deployment)
            except Exception as exc:  # Cancelled is not an Exception: it propagates
                attempt = Attempt(deployment.id, False, exc, trio.current_time() - started_s)
                attempts.append(attempt)
                on_attempt(attempt)
                if context_groups and is_context_window_error(exc):
                    assert isinstance(exc, ProviderError)
                    last_error = exc
                    queue = [g for g in context_groups if g not in tried]
                    context_groups = ()
                    break
                if not is_retryable(exc):
                    raise
                assert isinstance(exc, ProviderError)
                last_error = exc
                failed.add(deployment.id)
                continue
            attempt = Attempt(deployment.id, True, None, trio.current_time() - started_s)
            attempts.append(attempt)
            on_attempt(attempt)
            return RouteResult(
                value=value, deployment=deployment, attempts=tuple(attempts), group_used=group
            )
    if last_error is not None:
        raise last_error
    if unavailable is not None:
        raise unavailable
    raise NoDeploymentAvailable(groups[0] if groups else "", 0.0)


def _sooner(first: NoDeploymentAvailable, later: NoDeploymentAvailable) -> NoDeploymentAvailable:
    """Merge two groups' unavailability: the first group's name, the soonest retry."""
    reason = "limits" if "limits" in (first.reason, later.reason) else first.reason
    return NoDeploymentAvailable(
        first.group, min(first.retry_after_s, later.retry_after_s), reason=reason
    )
