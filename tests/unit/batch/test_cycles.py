"""A request's batch scope and post-call batch are freed by reference counting, not left
to the cyclic collector: its passes stop the loop and add to the one-connection tail."""

from __future__ import annotations

import gc
import weakref
from typing import TYPE_CHECKING

import pytest
import trio

from triogate.batch import (
    BatchClosed,
    Settler,
    open_batch_scope,
    open_post_call_batch,
    post_call_batch,
)
from triogate.batch.testing import RecordingBackend

if TYPE_CHECKING:
    from collections.abc import Iterator

    from triogate.batch import Batch


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _get(batch: Batch, key: str) -> object:
    return await batch.call("GET", keys=[key], owner="test")


async def test_a_closed_batch_scope_is_freed_at_once(no_collector: None) -> None:
    backends = {"default": RecordingBackend()}
    async with open_batch_scope(backends, host=True) as scope:
        scope.start_participant(_get, scope.batch, "a", name="a")
        await scope.run_inline(_get, scope.batch, "b", name="b")
        await scope.batch.call("GET", keys=["c"], owner="body")
    batch = scope.batch
    gone = weakref.ref(scope)
    del scope
    assert gone() is None
    with pytest.raises(BatchClosed):  # the batch still refuses late calls
        batch.call("GET", keys=["d"], owner="late")
    with pytest.raises(ValueError, match="backend"):
        batch.call("GET", keys=["d"], owner="late", backend="nowhere")


async def test_a_settled_post_call_batch_is_freed_at_once(no_collector: None) -> None:
    settler = Settler({"default": RecordingBackend(replies={"INCRBY": 1})})
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        with post_call_batch(settler, trace_id="r0") as post:
            handle = post.call("INCRBY", keys=["k"], args=[1], owner="budgets")
        async with open_post_call_batch(settler, trace_id="r1") as post1:
            handle1 = post1.call("INCRBY", keys=["k"], args=[1], owner="budgets")
        await post.wait_settled()
        await post1.wait_settled()
        await trio.lowlevel.checkpoint()  # the settler lets go of its last flush
        gone = [weakref.ref(post), weakref.ref(post1)]
        del post, post1
        nursery.cancel_scope.cancel()
    assert [ref() for ref in gone] == [None, None]
    assert await handle == 1  # still answers, as a checkpoint
    assert handle1.result() == 1
