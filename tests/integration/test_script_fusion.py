"""Script fusion against a real server: one EVALSHA per pipeline, every owner its own reply.

Each test sends the same round twice on one server, once with fusion off (one EVALSHA
per call, what the server itself answers) and once with it on, from the same data, and
compares reply for reply: values, nils, error replies returned in the middle, errors
raised in the middle (Lua runtime errors, ``error(...)``, a failed ``redis.call``),
with plain commands in between. The server's own ``commandstats`` say how many script
commands it ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import (
    BackendUnavailable,
    Command,
    CommandError,
    MemoryTracer,
    RespBackend,
    Script,
    open_batch_scope,
)
from triogate.batch._flush import PipelineSent, send_round

if TYPE_CHECKING:
    from collections.abc import Sequence

pytestmark = pytest.mark.integration

PUSH = Script.from_source(
    "push", "-- appends ARGV[1] to the list KEYS[1]\nreturn redis.call('RPUSH', KEYS[1], ARGV[1])\n"
)
SHAPES = Script.from_source(
    "shapes",
    "-- returns a value of the shape ARGV[1] names\n"
    "local shape = ARGV[1]\n"
    "if shape == 'nil' then return nil end\n"
    "if shape == 'false' then return false end\n"
    "if shape == 'true' then return true end\n"
    "if shape == 'float' then return 3.7 end\n"
    "if shape == 'status' then return redis.status_reply('FINE') end\n"
    "if shape == 'nested' then return {1, false, 'x', {redis.error_reply('INNER e')}} end\n"
    "if shape == 'returned' then return redis.error_reply('XERR returned in the middle') end\n"
    "if shape == 'raised' then error('boom') end\n"
    "if shape == 'raised-table' then error({err = 'MYERR raised as a table'}) end\n"
    "if shape == 'runtime' then local t = nil; return t.x end\n"
    "if shape == 'keys' then return {#KEYS, #ARGV, KEYS[1] or false} end\n"
    "return shape\n",
)
WRONG = Script.from_source(
    "wrong", "-- a redis.call that fails\nlocal x = 1\nreturn redis.call('INCR', KEYS[1])\n"
)


def _call(script: Script, keys: Sequence[str] = (), args: Sequence[str | int] = (),
          owner: str = "o") -> Command:
    return Command(name="EVALSHA", keys=tuple(keys), args=tuple(args), owner=owner,
                   backend="default", script=script)


def _plain(name: str, *args: str) -> Command:
    return Command(name=name, keys=args[:1], args=args[1:], owner="plain", backend="default")


def _same(reply: object) -> object:
    """A reply in a comparable form (exceptions by class and text)."""
    if isinstance(reply, BaseException):
        return (type(reply).__name__, str(reply))
    if isinstance(reply, list):
        return [_same(r) for r in reply]
    return reply


async def _round(backend: RespBackend, commands: Sequence[Command],
                 sent: list[PipelineSent] | None = None) -> list[object]:
    replies: list[object] = [None] * len(commands)

    def deliver(i: int, reply: object) -> None:
        replies[i] = reply

    with trio.fail_after(5):
        await send_round(commands, {"default": backend}, deliver,
                         sent=None if sent is None else sent.append)
    return replies


async def _script_calls(backend: RespBackend) -> dict[str, int]:
    (info,) = await backend.execute([("INFO", "commandstats")])
    assert isinstance(info, bytes)
    counts = {}
    for line in info.decode().splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_script|load:")):
            name, _, rest = line.partition(":")
            counts[name.removeprefix("cmdstat_")] = int(rest.split(",")[0].split("=")[1])
    return counts


async def _compare(redis: RespBackend, commands: Sequence[Command], setup: Sequence[tuple[str, ...]]
                   ) -> tuple[list[object], dict[str, int]]:
    """Run ``commands`` unfused then fused from the same data; assert equal replies."""
    lone = RespBackend(redis.url, command_timeout_s=5.0, fuse_scripts=False)
    try:
        await redis.execute([("FLUSHALL",), *setup])
        await _round(lone, commands)  # loads every script (NOSCRIPT, then EVAL)
        await redis.execute([("FLUSHALL",), *setup])
        expected = await _round(lone, commands)
        await redis.execute([("FLUSHALL",), *setup, ("CONFIG", "RESETSTAT")])
        got = await _round(redis, commands)
        calls = await _script_calls(redis)
    finally:
        await lone.aclose()
    assert _same(got) == _same(expected)
    return got, calls


async def test_every_reply_shape_survives_fusion_with_plain_commands_between(
    redis: RespBackend,
) -> None:
    shapes = ["value", "nil", "false", "true", "float", "status", "nested", "returned",
              "raised", "raised-table", "runtime", "keys"]
    commands: list[Command] = []
    for i, shape in enumerate(shapes):
        commands.append(_call(SHAPES, keys=[f"k{i}"], args=[shape], owner=shape))
        if i % 3 == 0:
            commands.append(_plain("GET", "s"))
    commands.insert(5, _call(WRONG, keys=["s"], owner="wrong"))
    commands.insert(7, _call(PUSH, keys=["list"], args=["after-an-error"], owner="push"))
    got, calls = await _compare(redis, commands, [("SET", "s", "text")])
    assert calls == {"script|load": 1, "evalsha": 1}
    by_owner = {c.owner: r for c, r in zip(commands, got, strict=True) if c.owner != "plain"}
    assert by_owner["value"] == b"value"
    assert by_owner["nil"] is None and by_owner["false"] is None
    assert (by_owner["true"], by_owner["float"], by_owner["status"]) == (1, 3, b"FINE")
    nested = by_owner["nested"]
    assert isinstance(nested, list) and nested[:3] == [1, None, b"x"]
    assert isinstance(nested[3][0], CommandError) and nested[3][0].reply == "INNER e"
    assert _same(by_owner["returned"]) == ("CommandError", "XERR returned in the middle")
    raised = by_owner["raised"]
    assert isinstance(raised, CommandError)
    assert raised.reply == (f"ERR user_script:10: boom script: {SHAPES.sha}, "
                            "on @user_script:10.")
    wrong = by_owner["wrong"]
    assert isinstance(wrong, CommandError) and wrong.reply.startswith("ERR value is not an")
    assert wrong.reply.endswith(f"script: {WRONG.sha}, on @user_script:3.")
    assert by_owner["keys"] == [1, 1, b"k11"]
    assert by_owner["push"] == 1  # ran after the failed calls before it


async def test_calls_run_in_declaration_order_atomically(redis: RespBackend) -> None:
    commands = [_call(PUSH, keys=["order"], args=[a], owner=a) for a in "abcab"]
    commands.insert(2, _call(SHAPES, keys=["x"], args=["raised"], owner="error"))
    got, calls = await _compare(redis, commands, [])
    assert calls == {"script|load": 1, "evalsha": 1}
    assert [r for r in got if not isinstance(r, CommandError)] == [1, 2, 3, 4, 5]
    assert await redis.execute([("LRANGE", "order", 0, -1)]) == [[b"a", b"b", b"c", b"a", b"b"]]


async def test_noscript_after_script_flush_retries_the_fused_script_with_eval(
    redis: RespBackend,
) -> None:
    commands = [_call(PUSH, keys=["l"], args=["1"], owner="a"),
                _plain("ECHO", "hi"),
                _call(SHAPES, keys=["k"], args=["nil"], owner="b"),
                _call(SHAPES, keys=["k"], args=["returned"], owner="c")]
    sent: list[PipelineSent] = []
    await redis.execute([("CONFIG", "RESETSTAT")])
    first = await _round(redis, commands, sent)
    await redis.execute([("SCRIPT", "FLUSH")])
    second = await _round(redis, commands, sent)
    third = await _round(redis, commands)
    for replies, length in ((first, 1), (second, 2), (third, 3)):
        assert _same(replies) == [length, b"hi", None,
                                  ("CommandError", "XERR returned in the middle")]
    # First use: SCRIPT LOAD of the fused script in the same pipeline, no NOSCRIPT. After
    # the flush: NOSCRIPT, then one EVAL of the fused source for its three owners.
    assert await _script_calls(redis) == {"script|load": 1, "evalsha": 3, "eval": 1}
    # The flush reports logical commands: all four, then the three it retried.
    assert [(p.indices, p.retry) for p in sent] == [
        ((0, 1, 2, 3), False), ((0, 1, 2, 3), False), ((0, 2, 3), True)]


async def test_a_source_less_script_is_sent_alone_and_its_noscript_is_its_own(
    redis: RespBackend,
) -> None:
    bare = Script(name="push", source=b"", sha=PUSH.sha)  # as replayed from a journal
    commands = [_call(SHAPES, keys=["k"], args=["one"], owner="a"),
                _call(bare, keys=["l"], args=["x"], owner="bare"),
                _call(SHAPES, keys=["k"], args=["two"], owner="b")]
    await redis.execute([("CONFIG", "RESETSTAT")])
    replies = await _round(redis, commands)
    assert replies[0] == b"one" and replies[2] == b"two"
    assert isinstance(replies[1], CommandError) and replies[1].is_noscript
    await redis.execute([("SCRIPT", "LOAD", PUSH.source)])
    assert (await _round(redis, commands))[1] == 1
    # the fused SHAPES pair and the bare call, twice; the pair loaded in the first pipeline
    assert await _script_calls(redis) == {"script|load": 2, "evalsha": 4}


async def test_a_batch_round_is_one_wait_and_one_evalsha_with_logical_records(
    redis: RespBackend,
) -> None:
    async def one_round(trace_id: str, tracer: MemoryTracer) -> None:
        async with open_batch_scope({"default": redis}, tracer=tracer,
                                    trace_id=trace_id) as scope:
            handles = [scope.batch.call(PUSH, keys=[f"l{i}"], args=[i], owner=f"p{i}")
                       for i in range(5)]
            get = scope.batch.call("GET", keys=["l0"], owner="get")
            assert [await h for h in handles] == [1] * 5
            with pytest.raises(CommandError, match="WRONGTYPE"):
                await get  # declared last: runs after the fused call, which took p0's place

    tracer = MemoryTracer()
    with trio.fail_after(5):
        # Any two calls of PUSH load the fused script of the set {PUSH}: the one below.
        await _round(redis, [_call(PUSH, keys=["w"], args=["1"])] * 2)
        await redis.execute([("CONFIG", "RESETSTAT")])
        await one_round("r", tracer)
    summary = tracer.summary("r")
    assert (summary.waits_before, len(summary.records)) == (1, 1)
    assert summary.records[0].commands == ("EVALSHA push",) * 5 + ("GET",)
    assert summary.records[0].owners == ("p0", "p1", "p2", "p3", "p4", "get")
    assert await _script_calls(redis) == {"evalsha": 1}


async def test_a_pipeline_that_fails_as_a_whole_fails_every_member(redis: RespBackend) -> None:
    dead = RespBackend("redis://127.0.0.1:1", command_timeout_s=0.5)
    commands = [_call(PUSH, keys=["l"], args=["1"], owner="a"),
                _call(SHAPES, keys=["k"], args=["x"], owner="b")]
    replies = await _round(dead, commands)
    assert all(isinstance(r, BackendUnavailable) for r in replies)
    assert replies[0] is not replies[1]
