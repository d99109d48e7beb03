"""triogate.batch against a real Redis-compatible server."""

from __future__ import annotations

import pytest
import trio

from triogate.batch import (
    Batch,
    CommandError,
    MemoryTracer,
    RespBackend,
    Script,
    open_batch_scope,
)

pytestmark = pytest.mark.integration

ECHO_SUM = Script.from_source(
    "echo_sum",
    "-- test script: returns the sum of its arguments\n"
    "local s = 0\nfor _, v in ipairs(ARGV) do s = s + tonumber(v) end\nreturn s\n",
)


async def test_participants_share_one_pipeline_on_a_real_server(redis: RespBackend) -> None:
    await redis.execute([("SET", "a", "1"), ("SET", "b", "2")])

    async def read(batch: Batch, key: str) -> object:
        return await batch.call("GET", keys=[key], owner=f"read-{key}")

    before = redis.statistics().pipelines
    tracer = MemoryTracer()
    with trio.fail_after(5):
        async with open_batch_scope({"default": redis}, tracer=tracer, trace_id="t") as scope:
            a = scope.start_participant(read, scope.batch, "a")
            b = scope.start_participant(read, scope.batch, "b")
            c = scope.start_participant(read, scope.batch, "missing")
    assert (a.result(), b.result(), c.result()) == (b"1", b"2", None)
    assert redis.statistics().pipelines - before == 1
    assert tracer.summary("t").waits_before == 1


async def test_an_error_reply_fails_only_its_owner_on_a_real_server(redis: RespBackend) -> None:
    await redis.execute([("HSET", "h", "f", "v")])
    with trio.fail_after(5):
        async with open_batch_scope({"default": redis}) as scope:
            wrong = scope.batch.call("GET", keys=["h"], owner="wrong")
            right = scope.batch.call("HGET", keys=["h"], args=["f"], owner="right")
            assert await right == b"v"
            with pytest.raises(CommandError, match="WRONGTYPE"):
                await wrong


async def test_noscript_falls_back_to_eval_after_script_flush(redis: RespBackend) -> None:
    async def run_round() -> tuple[object, object, MemoryTracer]:
        tracer = MemoryTracer()
        async with open_batch_scope({"default": redis}, tracer=tracer, trace_id="t") as scope:
            script = scope.batch.call(ECHO_SUM, args=[1, 2, 3], owner="scripted")
            plain = scope.batch.call("ECHO", args=["hi"], owner="plain")
            return await script, await plain, tracer

    with trio.fail_after(5):
        await redis.execute([("SCRIPT", "FLUSH")])
        total, echoed, tracer = await run_round()
        assert (total, echoed) == (6, b"hi")
        # The retry carried the script's command alone.
        retries = [r for r in tracer.records("t") if r.retry]
        assert [r.owners for r in retries] == [("scripted",)]
        # Loaded now: no retry.
        _, _, tracer = await run_round()
        assert not [r for r in tracer.records("t") if r.retry]
        await redis.execute([("SCRIPT", "FLUSH")])
        total, _, tracer = await run_round()
        assert total == 6
        assert [r.owners for r in tracer.records("t") if r.retry] == [("scripted",)]


async def test_resp_backend_round_trips_types(redis: RespBackend) -> None:
    with trio.fail_after(5):
        replies = await redis.execute(
            [
                ("SET", "n", 41),
                ("INCRBY", "n", 1),
                ("MGET", "n", "none"),
                ("EVAL", "return {1, 'two', {3}}", 0),
                ("SET", "bin", b"\x00\xff"),
                ("GET", "bin"),
            ]
        )
    assert replies == [b"OK", 42, [b"42", None], [1, b"two", [3]], b"OK", b"\x00\xff"]


async def test_a_pipeline_larger_than_the_socket_buffer_goes_out_whole(
    redis: RespBackend,
) -> None:
    """The round trip writes the socket directly; what the kernel does not take at once
    (8 MiB here) follows through the stream, and the replies still match their commands."""
    big = b"x" * (8 * 1024 * 1024)
    with trio.fail_after(10):
        replies = await redis.execute(
            [("SET", "big", big), ("STRLEN", "big"), ("GETRANGE", "big", 0, 3)])
    assert replies == [b"OK", len(big), b"xxxx"]
    with trio.fail_after(10):
        assert await redis.execute([("GET", "big")]) == [big]  # many reads for one reply


async def test_a_cancelled_pipeline_is_not_sent(redis: RespBackend) -> None:
    """A free pool slot is taken without a scheduler pass; cancellation is still checked
    before the pipeline leaves, so a cancelled owner never has a write it did not see."""
    await redis.execute([("SET", "counted", "0")])
    with trio.CancelScope() as scope:
        scope.cancel()
        await redis.execute([("INCR", "counted")])
    assert scope.cancelled_caught
    with trio.fail_after(5):
        assert await redis.execute([("GET", "counted")]) == [b"0"]
