"""The overview's figures, read from the metrics registry and the owners' ``statistics()``.

:class:`Sampler` keeps the last minute of registry snapshots (in memory, per process; at
most one a second), so rates and latency percentiles are "over the last minute" rather
than "since start": the difference of two cumulative histograms is a histogram of the
requests in between.
"""

from __future__ import annotations

import collections
import contextlib
import os
import socket
from typing import TYPE_CHECKING, Any, final

import attrs
import orjson

from triogate.batch import BackendUnavailable

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from triogate.api.services import Services

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]
WINDOW_S = 60.0


def snapshot(services: Services) -> Sample:
    """Every sample of the registry, keyed by (name, sorted labels)."""
    out: Sample = {}
    for family in services.metrics.registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def diff(new: Sample, old: Sample) -> Sample:
    """Counters and histogram buckets of ``new`` minus ``old`` (what happened in between)."""
    return {k: v - old.get(k, 0.0) for k, v in new.items()}


@final
class Sampler:
    """Snapshots of the last minute, owned by the dashboard's route table (one per process)."""

    def __init__(self, maxlen: int = 120) -> None:
        self._samples: collections.deque[tuple[float, Sample]] = collections.deque(maxlen=maxlen)

    def window(self, now_s: float, current: Sample) -> tuple[float, Sample]:
        """(seconds covered, what happened in them): against the oldest snapshot of the
        last minute; since start (span 0) when there is none yet."""
        while self._samples and now_s - self._samples[0][0] > WINDOW_S:
            self._samples.popleft()
        if not self._samples or now_s - self._samples[-1][0] >= 1.0:
            self._samples.append((now_s, current))
        start, old = self._samples[0]
        if now_s - start < 1.0:
            return 0.0, current
        return now_s - start, diff(current, old)


def total(sample: Sample, name: str, **match: str) -> float:
    return sum(v for (n, labels), v in sample.items()
               if n == name and all((k, m) in labels for k, m in match.items()))


def buckets(sample: Sample, name: str, **match: str) -> list[tuple[float, float]]:
    """Cumulative ``(upper bound, count)`` of a histogram, summed over other labels."""
    out: dict[float, float] = {}
    for (n, labels), v in sample.items():
        if n != f"{name}_bucket" or not all((k, m) in labels for k, m in match.items()):
            continue
        le = dict(labels)["le"]
        bound = float("inf") if le == "+Inf" else float(le)
        out[bound] = out.get(bound, 0.0) + v
    return sorted(out.items())


def quantile(cumulative: Iterable[tuple[float, float]], q: float) -> float | None:
    """Prometheus's ``histogram_quantile``: linear inside the bucket; None without data."""
    points = list(cumulative)
    if not points or points[-1][1] <= 0:
        return None
    rank = q * points[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in points:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def per_bucket(cumulative: list[tuple[float, float]]) -> list[tuple[str, float]]:
    """Cumulative buckets → ``(label, count)`` per bucket (``"≤ 0"``, ``"1"``, ``"> 20"``)."""
    out: list[tuple[str, float]] = []
    previous_bound, previous = None, 0.0
    for bound, count in cumulative:
        if bound == float("inf"):
            name = f"> {previous_bound:g}"
        elif previous_bound is not None and bound - previous_bound > 1:
            name = f"{previous_bound + 1:g}-{bound:g}"
        else:
            name = f"{bound:g}"
        out.append((name, max(0.0, count - previous)))
        previous_bound, previous = bound, count
    return out


@final
@attrs.frozen(kw_only=True)
class Overview:
    """The overview page's figures (None = no data yet)."""

    pid: int
    window_s: float
    requests: float
    errors: float
    duration: list[tuple[float, float]]
    ttft: list[tuple[float, float]]
    requests_per_s: float | None
    error_rate: float | None
    p50_s: float | None
    p99_s: float | None
    ttft_p50_s: float | None
    waits_before: list[tuple[str, float]]
    waits_after: list[tuple[str, float]]
    degraded: Mapping[str, float]
    settler_queue: int
    journal_pending: int
    spend_log_queue: int
    redis_ok: bool


def overview(services: Services, sampler: Sampler, now_s: float) -> Overview:
    """The figures of this process (its pid names it when there are several workers)."""
    current = snapshot(services)
    span, recent = sampler.window(now_s, current)
    requests = total(recent, "triogate_requests_total")
    errors = sum(v for (n, labels), v in recent.items()
                 if n == "triogate_requests_total" and dict(labels).get("status", "2")[0] in "45")
    settler = services.settler.statistics()
    spend_logs = services.spend_logs.statistics().queued if services.spend_logs else 0
    degraded: dict[str, float] = {}
    for (n, labels), v in current.items():
        if n == "triogate_degraded_decisions_total" and v:
            check = dict(labels).get("check", "-")
            degraded[check] = degraded.get(check, 0.0) + v
    duration = buckets(recent, "triogate_request_duration_seconds")
    ttft = buckets(recent, "triogate_time_to_first_token_seconds")
    return Overview(
        pid=os.getpid(),
        window_s=span,
        requests=requests,
        errors=errors,
        duration=duration,
        ttft=ttft,
        requests_per_s=requests / span if span else None,
        error_rate=errors / requests if requests else None,
        p50_s=quantile(duration, 0.5),
        p99_s=quantile(duration, 0.99),
        ttft_p50_s=quantile(ttft, 0.5),
        waits_before=per_bucket(buckets(current, "triogate_redis_waits_per_request",
                                        phase="before")),
        waits_after=per_bucket(buckets(current, "triogate_redis_waits_per_request",
                                       phase="after")),
        degraded=degraded,
        settler_queue=settler.queued,
        journal_pending=settler.journal_pending,
        spend_log_queue=spend_logs,
        redis_ok=services.health.redis_ok,
    )


#: Each process's latest overview figures, by host and pid, for the per-worker table.
WORKERS_KEY = "tg:ui:workers"
WORKER_TTL_MS = 60_000
HOST = socket.gethostname()


def _gone(row: Mapping[str, Any]) -> bool:
    """Whether ``row`` is of a process of this host that has exited (a restarted
    gateway's old workers leave at once, not after a minute)."""
    if row.get("host") != HOST or row.get("pid") == os.getpid():
        return False
    try:
        pid = int(row.get("pid") or 0)
        if pid <= 0:
            return False
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError, OverflowError):
        return False
    return False


def _bounds(cumulative: list[tuple[float, float]]) -> list[list[Any]]:
    return [[repr(bound), count] for bound, count in cumulative]  # JSON has no infinity


def worker_row(o: Overview, now_ms: int) -> dict[str, Any]:
    """What a process publishes for the others: its table row, and the counts and
    histograms that :func:`combine` adds up."""
    return {"pid": o.pid, "host": HOST, "at_ms": now_ms, "rps": o.requests_per_s,
            "errors": o.error_rate,
            "p50_s": o.p50_s, "p99_s": o.p99_s, "settler": o.settler_queue,
            "journal": o.journal_pending, "spend_log": o.spend_log_queue,
            "degraded": sum(o.degraded.values()), "window_s": o.window_s,
            "n": o.requests, "n_errors": o.errors, "duration": _bounds(o.duration),
            "ttft": _bounds(o.ttft), "waits_before": o.waits_before,
            "waits_after": o.waits_after}


@final
@attrs.frozen(kw_only=True)
class Combined:
    """The overview's cards and histograms over every process that reported."""

    processes: int
    window_s: float
    requests: float
    requests_per_s: float | None
    error_rate: float | None
    p50_s: float | None
    p99_s: float | None
    ttft_p50_s: float | None
    waits_before: list[tuple[str, float]]
    waits_after: list[tuple[str, float]]


def _sum_buckets(rows: Iterable[Any]) -> list[tuple[float, float]]:
    out: dict[float, float] = {}
    for row in rows:
        for bound, count in row or ():
            out[float(bound)] = out.get(float(bound), 0.0) + float(count)
    return sorted(out.items())


def _sum_labels(rows: Iterable[Any]) -> list[tuple[str, float]]:
    out: dict[str, float] = {}
    for row in rows:
        for label, count in row or ():
            out[str(label)] = out.get(str(label), 0.0) + float(count)
    return list(out.items())  # every process has the same buckets, in the same order


def combine(rows: list[dict[str, Any]]) -> Combined:
    """Add up the processes' rows (from :func:`worker_row`): requests a second and
    counts are sums; percentiles come from the summed histograms, as Prometheus's
    ``histogram_quantile(sum by (le) ...)`` would give."""
    requests = sum(float(r.get("n") or 0) for r in rows)
    errors = sum(float(r.get("n_errors") or 0) for r in rows)
    rates = [float(r["rps"]) for r in rows if r.get("rps") is not None]
    duration = _sum_buckets(r.get("duration") for r in rows)
    ttft = _sum_buckets(r.get("ttft") for r in rows)
    return Combined(
        processes=len(rows),
        window_s=max((float(r.get("window_s") or 0) for r in rows), default=0.0),
        requests=requests,
        requests_per_s=sum(rates) if rates else None,
        error_rate=errors / requests if requests else None,
        p50_s=quantile(duration, 0.5),
        p99_s=quantile(duration, 0.99),
        ttft_p50_s=quantile(ttft, 0.5),
        waits_before=_sum_labels(r.get("waits_before") for r in rows),
        waits_after=_sum_labels(r.get("waits_after") for r in rows))


async def share_workers(services: Services, o: Overview, now_ms: int
                        ) -> list[dict[str, Any]]:
    """Publish this process's figures and read every process's (one Redis round trip).

    Workers publish when they serve the overview (it refreshes itself, and the kernel
    spreads the refreshes over the workers), so rows are at most a minute old; older ones
    are dropped. Redis unreachable: this process's row alone.
    """
    mine = worker_row(o, now_ms)
    try:
        replies = await services.backends["counters"].execute([
            ("HSET", WORKERS_KEY, f"{HOST}:{o.pid}", orjson.dumps(mine)),
            ("PEXPIRE", WORKERS_KEY, WORKER_TTL_MS * 2),
            ("HGETALL", WORKERS_KEY),
        ])
    except BackendUnavailable:
        return [mine]
    found = replies[2]
    if not isinstance(found, list):
        return [mine]
    rows: list[dict[str, Any]] = []
    stale: list[bytes] = []
    for field, value in zip(found[::2], found[1::2], strict=True):
        try:
            row = orjson.loads(value)
        except (orjson.JSONDecodeError, TypeError):
            continue
        if (not isinstance(row, dict) or now_ms - int(row.get("at_ms", 0)) > WORKER_TTL_MS
                or _gone(row)):
            stale.append(field)
            continue
        rows.append(row)
    if stale:
        with contextlib.suppress(BackendUnavailable):
            await services.backends["counters"].execute([("HDEL", WORKERS_KEY, *stale)])
    return sorted(rows, key=lambda r: (str(r.get("host", "")), int(r.get("pid", 0))))
