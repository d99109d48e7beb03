"""Budget alerts: a soft budget crossed, or 50 %, 80 % or 100 % of a hard budget, posted
to the operator's webhook (``general_settings.alerting: ["webhook"]`` with
``alerting_webhook_url``) as LiteLLM's webhook event, with Slack's ``text`` field too.

Never on a request's path: settlement calls :meth:`Alerts.observe` (sync, no I/O), which
compares each tracked principal's spend (as admission saw it, plus this request's cost)
with its thresholds and puts what is newly crossed on a bounded channel; when the
channel is full the alert is dropped and counted. One task in the app nursery
(:meth:`Alerts.run`) posts them, retrying a failed post a few times.

One alert per principal, budget period and threshold: the process remembers what it
sent, and the task claims each alert in Redis first (``SET NX`` on a key of the
principal's hash tag that lives as long as the period), so that several workers send it
once. When Redis does not answer, the alert is sent anyway (a duplicate beats a miss).

At shutdown the task gets the grace period to post what is queued; what is left is
dropped, counted and logged.
"""

from __future__ import annotations

import collections
import logging
from decimal import Decimal
from typing import TYPE_CHECKING, Any, final

import attrs
import httpx
import trio

from triogate.batch import BatchError, open_batch_scope
from triogate.governance.keys import PREFIX, principal_tag
from triogate.governance.principals import KEY_MODEL, PROXY, TEAM_MODEL

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from triogate.batch import Backend
    from triogate.governance.budgets import BudgetHold, BudgetOutcome

logger = logging.getLogger("triogate.governance.alerts")

#: Fractions of a hard budget that raise an alert, in percent.
THRESHOLDS = (50, 80, 100)
#: LiteLLM's ``event_group`` per principal kind.
_GROUPS = {"key": "key", "team": "team", "user": "user", "end_user": "customer",
           "tag": "tag", PROXY: "proxy", KEY_MODEL: "key", TEAM_MODEL: "team"}
_REMEMBERED = 10_000


@final
@attrs.frozen(kw_only=True)
class Alert:
    """One crossing, as queued for the webhook."""

    kind: str
    id: str
    label: str
    period: int
    period_end_ms: int | None
    threshold: str  # "soft", or "50" / "80" / "100"
    spend_nanousd: int
    max_budget_nanousd: int | None
    soft_budget_nanousd: int | None
    at_ms: int

    @property
    def claim_key(self) -> str:
        return f"{PREFIX}:{principal_tag(self.kind, self.id)}:alert:{self.period}:{self.threshold}"

    def payload(self) -> dict[str, Any]:
        """LiteLLM's webhook event (``spend``, ``max_budget``, ``token``, ``event``,
        ``event_group``, ``event_message`` ...) plus Slack's ``text``."""
        group = _GROUPS.get(self.kind, self.kind)
        if self.threshold == "soft":
            event, what = "soft_budget_crossed", "Soft Budget Crossed"
        elif self.threshold == "100":
            event, what = "budget_crossed", "Budget Crossed"
        else:
            event, what = "threshold_crossed", f"{self.threshold}% Threshold Crossed"
        owner = self.id.rsplit(":", 1)[0] if self.kind in (KEY_MODEL, TEAM_MODEL) else self.id
        message = f"{group.capitalize()} Budget: {what}"
        limit = self.soft_budget_nanousd if self.threshold == "soft" else self.max_budget_nanousd
        text = (f"{message}: {self.label} has spent {_usd(self.spend_nanousd)} of "
                f"{_usd(limit)} in this period")
        return {
            "spend": _float(self.spend_nanousd),
            "max_budget": _float(self.max_budget_nanousd),
            "soft_budget": _float(self.soft_budget_nanousd),
            "token": owner if group == "key" else None,
            # A key without an alias is labelled by its hash's start: no alias then.
            "key_alias": self.label if self.kind == "key" and not self.id.startswith(
                self.label) else None,
            "team_id": owner if group == "team" else None,
            "user_id": owner if group == "user" else None,
            "customer_id": owner if group == "customer" else None,
            "user_email": None,
            "projected_exceeded_date": None,
            "projected_spend": None,
            "event": event,
            "event_group": group,
            "event_message": message,
            "text": text,
        }


def _float(nanousd: int | None) -> float | None:
    return None if nanousd is None else float(Decimal(nanousd).scaleb(-9))


def _usd(nanousd: int | None) -> str:
    return "no limit" if nanousd is None else f"${Decimal(nanousd).scaleb(-9).normalize():f}"


def crossed(hold: BudgetHold, spend_nanousd: int) -> list[str]:
    """The thresholds ``spend_nanousd`` reaches for ``hold``'s principal: ``soft``, and
    the highest of :data:`THRESHOLDS` (the lower ones are implied)."""
    out = []
    soft = hold.soft_budget_nanousd
    if soft is not None and spend_nanousd >= soft:
        out.append("soft")
    if hold.hard and hold.max_budget_nanousd > 0:
        reached = [t for t in THRESHOLDS if spend_nanousd * 100 >= t * hold.max_budget_nanousd]
        if reached:
            out.append(str(reached[-1]))
    return out


@final
class Alerts:
    """The alert queue and its sender."""

    def __init__(self, url: str, client: httpx.AsyncClient, clock_ms: Callable[[], int], *,
                 backends: Mapping[str, Backend] | None = None, backend: str = "counters",
                 queue_size: int = 256, attempts: int = 3, backoff_s: float = 0.5,
                 timeout_s: float = 5.0, retention_ms: int = 86_400_000) -> None:
        self._url = url
        self._client = client
        self._clock_ms = clock_ms
        self._backends = backends
        self._backend = backend
        self._send, self._receive = trio.open_memory_channel[Alert](queue_size)
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._timeout_s = timeout_s
        self._retention_ms = retention_ms
        self._seen: collections.OrderedDict[tuple[str, str, int, str], None] = (
            collections.OrderedDict())
        #: The last alerts queued (newest last), for the dashboard.
        self.recent: collections.deque[Alert] = collections.deque(maxlen=50)
        self.delivered = self.failed = self.dropped = 0
        self._idle = trio.Event()
        self._idle.set()

    def observe(self, outcome: BudgetOutcome, cost_nanousd: int) -> None:
        """Queue an alert for each threshold a request's cost made a principal reach
        (sync, no I/O; a full queue drops and counts)."""
        reservation = outcome.reservation
        if reservation is None:
            return
        for hold in reservation.holds:
            spend = hold.spend_nanousd + cost_nanousd
            for threshold in crossed(hold, spend):
                key = (hold.kind, hold.id, hold.period, threshold)
                if key in self._seen:
                    continue
                self._seen[key] = None
                if len(self._seen) > _REMEMBERED:
                    self._seen.popitem(last=False)
                alert = Alert(kind=hold.kind, id=hold.id, label=hold.label, period=hold.period,
                              period_end_ms=hold.period_end_ms, threshold=threshold,
                              spend_nanousd=spend,
                              max_budget_nanousd=hold.max_budget_nanousd if hold.hard else None,
                              soft_budget_nanousd=hold.soft_budget_nanousd,
                              at_ms=self._clock_ms())
                try:
                    self._send.send_nowait(alert)
                except (trio.WouldBlock, trio.ClosedResourceError):
                    self.dropped += 1
                    logger.warning("budget alert dropped (queue full or closed)",
                                   extra={"event_group": _GROUPS.get(hold.kind, hold.kind)})
                    continue
                self._idle = trio.Event() if self._idle.is_set() else self._idle
                self.recent.append(alert)

    @property
    def queued(self) -> int:
        return self._receive.statistics().current_buffer_used

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Post queued alerts until :meth:`close`; what is left when cancelled is dropped
        and counted."""
        task_status.started()
        in_flight = 0
        try:
            async for alert in self._receive:
                in_flight = 1
                if await self._claim(alert):
                    await self._post(alert)
                in_flight = 0
                if not self.queued:
                    self._idle.set()
        finally:
            left = self.queued + in_flight  # counted before closing drops the buffer
            self._receive.close()
            if left:
                self.dropped += left
                logger.error("%d budget alert(s) not sent before shutdown", left)
            self._idle.set()

    def close(self) -> None:
        """No more alerts: :meth:`run` ends once the queue is posted."""
        self._send.close()

    async def wait_drained(self) -> None:
        """Until every queued alert was posted (or given up)."""
        await self._idle.wait()

    async def _claim(self, alert: Alert) -> bool:
        """Whether this process sends ``alert`` (``SET NX`` in Redis; True when Redis does
        not answer)."""
        if self._backends is None:
            return True
        args: list[str | int] = ["1", "NX"]
        if alert.period_end_ms is not None:
            args += ["PX", max(alert.period_end_ms - alert.at_ms, 0) + self._retention_ms]
        try:
            with trio.fail_after(self._timeout_s):
                async with open_batch_scope(self._backends, host=True, tasks=False) as scope:
                    reply = await scope.batch.call("SET", keys=[alert.claim_key], args=args,
                                                   backend=self._backend, owner="alerts")
        except (BatchError, trio.TooSlowError) as exc:
            logger.warning("budget alert not claimed in Redis (%s); sending it anyway",
                           type(exc).__name__)
            return True
        return reply is not None

    async def _post(self, alert: Alert) -> None:
        payload = alert.payload()
        for attempt in range(1, self._attempts + 1):
            try:
                with trio.fail_after(self._timeout_s):
                    response = await self._client.post(self._url, json=payload)
                if 200 <= response.status_code < 300:
                    self.delivered += 1
                    return
                problem = f"status {response.status_code}"
            except (httpx.HTTPError, trio.TooSlowError) as exc:
                problem = type(exc).__name__
            logger.warning("budget alert post failed (%s), attempt %d of %d", problem,
                           attempt, self._attempts)
            if attempt < self._attempts:
                await trio.sleep(self._backoff_s * 2 ** (attempt - 1))
        self.failed += 1
        logger.error("budget alert not delivered", extra={"event": payload["event"]})
