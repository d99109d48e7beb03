"""The round-trip harness's results: per request, per shape, and the whole table.

Pure and synchronous (no I/O but :meth:`RoundTripReport.write`). A request's waits are
its *rounds*: the tracer records one :class:`~triogate.batch.FlushRecord` per backend
pipeline, and the pipelines of one round (same phase, round number and retry flag) leave
and are awaited together, so they are one wait however many backends they reach.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import orjson

from triogate.batch import AFTER, BEFORE

if TYPE_CHECKING:
    from triogate.batch import TraceSummary

#: The project's budget: one wait before the model call and one after, identity cached.
CACHED_BUDGET = (1, 1)
#: At most this many waits in all when the identity must be refreshed from Redis.
REFRESH_BUDGET_TOTAL = 3


@attrs.frozen(kw_only=True)
class Round:
    """One wait: the pipelines that left together, with this request's commands in them.

    Attributes:
        phase: ``"before"`` or ``"after"`` the model call.
        number: 1-based round within the phase.
        retry: the EVAL retry of scripts the server did not know (a wait of its own).
        commands: command labels, in pipeline order, over every backend of the round.
        owners: the owner of each command, same order.
        backends: the backend names the round went to.
        duration_s: the longest pipeline of the round (Trio's clock).
        shared_with: most traces that shared one of its network round trips.
    """

    phase: str
    number: int
    retry: bool
    commands: tuple[str, ...]
    owners: tuple[str, ...]
    backends: tuple[str, ...]
    duration_s: float
    shared_with: int


@attrs.frozen(kw_only=True)
class RequestTrace:
    """The waits of one traced request."""

    trace_id: str
    cache: str | None
    waits_before: int
    waits_after: int
    rounds: tuple[Round, ...]

    @property
    def waits(self) -> int:
        return self.waits_before + self.waits_after

    def phase(self, phase: str) -> tuple[Round, ...]:
        return tuple(r for r in self.rounds if r.phase == phase)


def trace_of(summary: TraceSummary, *, cache: str | None) -> RequestTrace:
    """Group a trace's flush records into rounds (one wait each)."""
    grouped: dict[tuple[str, int, bool], list[Any]] = {}
    for record in summary.records:
        grouped.setdefault((record.phase, record.round, record.retry), []).append(record)
    rounds = tuple(
        Round(phase=phase, number=number, retry=retry,
              commands=tuple(c for r in records for c in r.commands),
              owners=tuple(o for r in records for o in r.owners),
              backends=tuple(dict.fromkeys(r.backend for r in records)),
              duration_s=max(r.duration_s for r in records),
              shared_with=max(r.shared_with for r in records))
        for (phase, number, retry), records in grouped.items()
    )
    return RequestTrace(trace_id=summary.trace_id, cache=cache,
                        waits_before=summary.waits_before, waits_after=summary.waits_after,
                        rounds=rounds)


def _owners_text(owners: tuple[str, ...]) -> str:
    counts = Counter(owners)
    return ", ".join(f"{o} x{n}" if n > 1 else o for o, n in sorted(counts.items()))


@attrs.frozen(kw_only=True)
class ShapeResult:
    """Every traced request of one shape.

    Attributes:
        reference: the established gateway's waits, before and after its batching work
            (quoted, not measured).
        refresh: the identity cache was expired before each request.
        cache_hit: each traced request was a response-cache hit.
    """

    name: str
    strategy: str
    path: str
    reference: tuple[str, str]
    refresh: bool = False
    cache_hit: bool = False
    requests: tuple[RequestTrace, ...]

    @property
    def median_before(self) -> float:
        return statistics.median(r.waits_before for r in self.requests)

    @property
    def median_after(self) -> float:
        return statistics.median(r.waits_after for r in self.requests)

    @property
    def median_total(self) -> float:
        return statistics.median(r.waits for r in self.requests)

    @property
    def consistent(self) -> bool:
        """Every request had the same waits and the same commands in each."""
        first = self.requests[0]
        return all(_signature(r) == _signature(first) for r in self.requests)

    @property
    def typical(self) -> RequestTrace:
        """The most common request (by waits and commands per wait)."""
        counts = Counter(_signature(r) for r in self.requests)
        common = counts.most_common(1)[0][0]
        return next(r for r in self.requests if _signature(r) == common)

    def commands_text(self) -> str:
        typical = self.typical

        def per(phase: str) -> str:
            return "+".join(str(len(r.commands)) for r in typical.phase(phase)) or "0"

        return f"{per(BEFORE)} / {per(AFTER)}"

    def owners_text(self) -> str:
        before = self.typical.phase(BEFORE)
        if len(before) == 1:
            return _owners_text(before[0].owners)
        return "; ".join(f"{r.number}{' (retry)' if r.retry else ''}: {_owners_text(r.owners)}"
                         for r in before)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "path": self.path, "routing_strategy": self.strategy,
            "median_waits_before": self.median_before, "median_waits_after": self.median_after,
            "median_waits": self.median_total, "consistent": self.consistent,
            "identity_refresh": self.refresh, "cache_hit": self.cache_hit,
            "reference_before_batching": self.reference[0],
            "reference_after_batching": self.reference[1],
            "requests": [attrs.asdict(r) for r in self.requests],
        }


def _signature(trace: RequestTrace) -> tuple[Any, ...]:
    return tuple((r.phase, r.number, r.retry, len(r.commands)) for r in trace.rounds)


def _number(value: float) -> str:
    return f"{value:g}"


@attrs.frozen(kw_only=True)
class RoundTripReport:
    """The whole run: one :class:`ShapeResult` per row of the table."""

    requests_per_shape: int
    results: tuple[ShapeResult, ...]
    created_at_s: float = attrs.Factory(time.time)

    def budget_violations(self) -> list[str]:
        """Requests over the project's budget (every request, not only the medians)."""
        problems = []
        for result in self.results:
            for r in result.requests:
                if result.refresh and r.waits > REFRESH_BUDGET_TOTAL:
                    problems.append(f"{result.name}: {r.waits} waits (at most "
                                    f"{REFRESH_BUDGET_TOTAL}), trace {r.trace_id}")
                if not result.refresh and (r.waits_before, r.waits_after) != CACHED_BUDGET:
                    problems.append(f"{result.name}: {r.waits_before}+{r.waits_after} waits "
                                    f"(budget 1+1), trace {r.trace_id}")
        return problems

    def markdown(self) -> str:
        """The table, with what it means underneath."""
        lines = [
            "| shape | triogate before | after | total | commands per wait (before / after)"
            " | owners of the before round | reference before → after |",
            "|---|---:|---:|---:|---|---|---|",
        ]
        for r in self.results:
            varies = "" if r.consistent else " (varies)"
            lines.append(
                f"| {r.name} | {_number(r.median_before)} | {_number(r.median_after)} | "
                f"{_number(r.median_total)}{varies} | {r.commands_text()} | "
                f"{r.owners_text()} | {r.reference[0]} → {r.reference[1]} |"
            )
        lines += [
            "",
            f"Waits on Redis per request (medians of {self.requests_per_shape} traced "
            "requests per shape, after one warm-up), counted from the tracer's records of "
            "real pipeline flushes: one wait per round, however many commands and backends "
            "it carries. *Before* and *after* are relative to the model call. "
            "Commands per wait counts this request's commands in each round "
            "(`a+b` = two rounds). Owners of refresh rows are listed per round.",
            "",
            "Governance on for every row: key, team and end-user budgets, TPM/RPM limits "
            "on key and team, the Redis response cache (every row a miss but the cache-hit "
            "one), usage-based routing over two mock deployments (simple-shuffle in its "
            "row). The proxy budget row's gateway also has a proxy-wide budget and a "
            "pre-call guardrail (e-mail masking), and its key a budget for the group. "
            "The reference column is an established Python gateway's count for the "
            "same shapes, before and after its own batching work (waits on Redis, a "
            "pipeline or a Lua script counting as one); it is quoted, not measured here.",
            "",
            f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(self.created_at_s))}, "
            f"Python {platform.python_version()} on {platform.machine()}.",
        ]
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "requests_per_shape": self.requests_per_shape,
            "created_at_s": self.created_at_s,
            "python": sys.version.split()[0],
            "budget_violations": self.budget_violations(),
            "shapes": [r.to_json() for r in self.results],
        }

    def write(self, out_dir: Path) -> list[Path]:
        """Write ``roundtrips.md`` and ``roundtrips.json`` into ``out_dir``; their paths."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        md = out_dir / "roundtrips.md"
        js = out_dir / "roundtrips.json"
        md.write_text(self.markdown())
        js.write_bytes(orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
        return [md, js]
