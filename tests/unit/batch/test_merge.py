"""Merged calls (``batch/_merge.py``): grouping, bounds, replies, and what fails how."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from triogate.batch import BackendUnavailable, Command, CommandError, Merge, Script
from triogate.batch._merge import plan_merges, send_merged
from triogate.batch.testing import RecordingBackend

if TYPE_CHECKING:
    from triogate.batch._backend import Wire

ONE = Script.from_source("one", "return 1")
MANY = Script.from_source("many", "return 2")
MERGE = Merge(single=ONE, merged=MANY, max_calls=3)


def call(key: str, *args: object, script: Script = ONE) -> Command:
    return Command(name="EVALSHA", keys=(key,), args=tuple(args), owner="o",  # type: ignore[arg-type]
                   backend="default", script=script)


def test_calls_with_the_same_script_and_keys_merge_at_their_first_place() -> None:
    other = Script.from_source("other", "return 3")
    commands = [call("a", 1), call("b", 2), call("a", 3, 4), call("a", 5, script=other),
                call("a", 6), call("a", 7), call("a", 8), call("b", 9)]
    planned = plan_merges(commands, {ONE.sha: MERGE})
    assert [(members, merge is not None) for _, members, merge in planned] == [
        ((0, 2, 4), True),  # at most max_calls (3) a merged call
        ((1, 7), True),
        ((3,), False),  # another script
        ((5, 6), True),  # the rest of "a", in order
    ]
    merged = planned[0][0]
    assert merged.script is MANY and merged.keys == ("a",)
    assert merged.args == (1, 1, 2, 3, 4, 1, 6)  # per call: its count, its arguments


def test_a_group_below_min_calls_goes_as_single_calls_at_its_place() -> None:
    merge = Merge(single=ONE, merged=MANY, min_calls=3)
    commands = [call("a", 1), call("b", 2), call("a", 3), call("b", 4), call("b", 5)]
    planned = plan_merges(commands, {ONE.sha: merge})
    assert [(members, m is not None) for _, members, m in planned] == [
        ((0,), False), ((2,), False), ((1, 3, 4), True)]


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="min_calls"):
        Merge(single=ONE, merged=MANY, max_calls=1)
    with pytest.raises(ValueError, match="min_calls"):
        Merge(single=ONE, merged=MANY, min_calls=5, max_calls=4)


@pytest.mark.parametrize(("merged_reply", "expected"), [
    ([10, 20], [10, 20]),  # each owner its own reply
    (CommandError("ERR refused"), ["alone", "alone"]),  # sent again alone
    ([10], ["alone", "alone"]),  # not one reply per call: sent again alone
    (CommandError("BUSY script running"), ["BUSY", "BUSY"]),  # transient: every call's
])
async def test_replies_and_failures(merged_reply: object, expected: list[object]) -> None:
    def respond(wire: Wire) -> object:
        if wire[1] == MANY.sha:
            return merged_reply
        return "alone"

    backend = RecordingBackend(respond=respond)
    got: dict[int, object] = {}
    alone = await send_merged([call("a", 1), call("a", 2)], {"default": backend},
                              got.__setitem__, merges={ONE.sha: MERGE})
    replies = [got[0], got[1]]
    replies = [r.reply.split()[0] if isinstance(r, CommandError) else r for r in replies]
    assert replies == expected
    assert alone == (2 if expected[0] == "alone" else 0)


async def test_an_unavailable_backend_fails_every_call() -> None:
    class Down(RecordingBackend):
        async def execute(self, commands: object) -> list[object]:
            raise BackendUnavailable("default", "down")

    got: dict[int, object] = {}
    await send_merged([call("a", 1), call("a", 2)], {"default": Down()}, got.__setitem__,
                      merges={ONE.sha: MERGE})
    assert all(isinstance(r, BackendUnavailable) for r in got.values()) and len(got) == 2
