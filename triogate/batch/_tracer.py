"""Flush records: what left, for whom, when, and how long it took.

Every flush of a batch scope or of the settler is recorded as one :class:`FlushRecord`
per backend pipeline. A *wait* is a round: the pipelines of one round leave together
and are awaited together, so a round to two backends is still one wait. The round-trip
harness and the integration tests count waits from these records, never by hand.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol, final

import attrs

#: The phases of a request, relative to the model call.
BEFORE = "before"
AFTER = "after"


@final
@attrs.frozen(kw_only=True)
class FlushRecord:
    """One pipeline sent to one backend.

    Attributes:
        trace_id: the request (or other unit of work) the commands belong to.
        phase: ``"before"`` or ``"after"`` the model call.
        round: 1-based round of that trace and phase; records sharing it were one wait.
        backend: the backend's name.
        commands: command labels, in pipeline order (only this trace's commands).
        owners: the owner of each command, in the same order.
        duration_s: wall time of the pipeline, on Trio's clock.
        shared_with: how many traces shared this network round trip (group commit).
        retry: True for the ``EVAL`` retry of scripts the server did not know.
        ok: False if the pipeline failed as a whole.
    """

    trace_id: str
    phase: str
    round: int
    backend: str
    commands: tuple[str, ...]
    owners: tuple[str, ...]
    duration_s: float
    shared_with: int = 1
    retry: bool = False
    ok: bool = True


@final
@attrs.frozen(kw_only=True)
class TraceSummary:
    """Waits of one trace: rounds before and after the model call, and their records."""

    trace_id: str
    waits_before: int
    waits_after: int
    records: tuple[FlushRecord, ...]

    @property
    def waits(self) -> int:
        """Waits in all."""
        return self.waits_before + self.waits_after


class Tracer(Protocol):
    """Receives every flush record. Implementations must not block: ``record`` is sync."""

    def record(self, record: FlushRecord) -> None: ...


@final
class MemoryTracer:
    """Keeps the records of the last ``max_traces`` traces in memory.

    Waits are counted per trace and phase as distinct rounds; NOSCRIPT retries count as a
    wait of their own because the owner really waits again.
    """

    def __init__(self, *, max_traces: int = 10_000) -> None:
        self._max = max_traces
        self._traces: OrderedDict[str, list[FlushRecord]] = OrderedDict()

    def record(self, record: FlushRecord) -> None:
        records = self._traces.get(record.trace_id)
        if records is None:
            records = self._traces[record.trace_id] = []
            if len(self._traces) > self._max:
                self._traces.popitem(last=False)
        records.append(record)

    def records(self, trace_id: str) -> tuple[FlushRecord, ...]:
        """Every record of ``trace_id``, oldest first."""
        return tuple(self._traces.get(trace_id, ()))

    def summary(self, trace_id: str) -> TraceSummary:
        """Count the waits of ``trace_id`` before and after the model call."""
        records = self.records(trace_id)

        def waits(phase: str) -> int:
            return len({(r.round, r.retry) for r in records if r.phase == phase})

        return TraceSummary(
            trace_id=trace_id,
            waits_before=waits(BEFORE),
            waits_after=waits(AFTER),
            records=records,
        )

    def clear(self) -> None:
        """Forget every trace."""
        self._traces.clear()
