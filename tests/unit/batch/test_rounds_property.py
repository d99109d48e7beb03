"""Property: over random dependency graphs and timings, flushes == depth of the chain."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from triogate.batch import Batch, MemoryTracer, open_batch_scope
from triogate.batch.testing import RecordingBackend

if TYPE_CHECKING:
    from triogate.batch import Participant


@st.composite
def graphs(draw: st.DrawFn) -> list[tuple[list[int], float, int]]:
    """Nodes as (dependencies among earlier nodes, busy time before declaring, commands)."""
    size = draw(st.integers(1, 8))
    nodes = []
    for i in range(size):
        deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        busy = draw(st.sampled_from([0.0, 0.0, 0.1, 1.0, 2.5]))
        commands = draw(st.integers(0, 3))
        nodes.append((deps, busy, commands))
    return nodes


def depth(nodes: list[tuple[list[int], float, int]]) -> int:
    """Rounds needed: a node's commands leave one round after its deepest dependency's."""
    levels: list[int] = []
    for deps, _, commands in nodes:
        base = max((levels[d] for d in deps), default=0)
        levels.append(base + (1 if commands else 0))
    return max(levels, default=0)


@settings(max_examples=200, deadline=None)
@given(nodes=graphs(), yields=st.lists(st.integers(0, 3), min_size=8, max_size=8))
def test_flushes_equal_the_depth_of_the_dependency_chain(
    nodes: list[tuple[list[int], float, int]], yields: list[int]
) -> None:
    async def node(
        batch: Batch, i: int, deps: list[Participant[None]], busy: float, commands: int
    ) -> None:
        for dep in deps:
            await dep.wait()
        for _ in range(yields[i]):  # perturb the interleaving
            await trio.lowlevel.checkpoint()
        if busy:
            await trio.sleep(busy)
        handles = [batch.call("GET", keys=[f"{i}:{c}"], owner=f"n{i}") for c in range(commands)]
        for handle in handles:
            await handle

    async def main() -> int:
        tracer = MemoryTracer()
        async with open_batch_scope(
            {"default": RecordingBackend(delay_s=0.01)}, tracer=tracer, trace_id="t"
        ) as scope:
            started: list[Participant[None]] = []
            for i, (deps, busy, commands) in enumerate(nodes):
                started.append(
                    scope.start_participant(
                        node, scope.batch, i, [started[d] for d in deps], busy, commands
                    )
                )
        assert tracer.summary("t").waits_before == scope.statistics().rounds
        return scope.statistics().rounds

    clock = trio.testing.MockClock(autojump_threshold=0)
    rounds = trio.run(main, clock=clock, strict_exception_groups=True)
    assert rounds == depth(nodes)
