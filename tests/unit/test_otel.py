"""The span exporter: bounded queue, batches, drained on close, failures counted."""

from __future__ import annotations

import httpx
import orjson
import trio

from triogate.batch import FlushRecord
from triogate.config import OtelSettings
from triogate.otel import RequestSpans, SpanExporter, root_span_id

TRACE = "0123456789abcdef" * 2


def _record(round_: int = 1) -> FlushRecord:
    return FlushRecord(trace_id=TRACE, phase="before", round=round_, backend="redis",
                       commands=("EVALSHA",), owners=("routing",), duration_s=0.001)


async def test_spans_are_batched_and_drained_on_close() -> None:
    posts: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(orjson.loads(request.content))
        return httpx.Response(200, json={})

    settings = OtelSettings(endpoint="http://otel/v1/traces", batch_spans=3, interval_s=60)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client, \
            trio.open_nursery() as nursery:
        exporter = SpanExporter(settings, client)
        await nursery.start(exporter.run)
        for i in range(4):
            exporter.record(_record(i + 1))
        exporter.record(FlushRecord(trace_id="replay", phase="after", round=1,
                                    backend="redis", commands=(), owners=(),
                                    duration_s=0))  # not a request: no span
        now = trio.current_time()
        exporter.request_done(RequestSpans(
            trace_id=TRACE, route="chat", group="g", status="rejected", http_status=429,
            started_s=now - 0.01, admitted_s=now - 0.005, settle_started_s=now,
            ended_s=now))
        with trio.fail_after(5):
            await exporter.aclose()
    stats = exporter.statistics()
    assert (stats.exported, stats.dropped, stats.failed_exports) == (6, 0, 0)
    assert [len(p["resourceSpans"][0]["scopeSpans"][0]["spans"]) for p in posts  # type: ignore[index]
            ] == [3, 3]
    root = [s for p in posts for s in p["resourceSpans"][0]["scopeSpans"][0]["spans"]  # type: ignore[index]
            if "parentSpanId" not in s]
    assert [r["spanId"] for r in root] == [root_span_id(TRACE)]
    assert root[0]["status"] == {"code": 1}  # a 429 is not a server error


async def test_a_full_queue_drops_and_a_failed_export_is_counted() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503)

    settings = OtelSettings(endpoint="http://otel/v1/traces", queue_spans=2, interval_s=0.01)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        exporter = SpanExporter(settings, client)
        for i in range(3):
            exporter.record(_record(i + 1))
        assert exporter.statistics().dropped == 1
        async with trio.open_nursery() as nursery:
            await nursery.start(exporter.run)
            with trio.fail_after(5):
                await exporter.aclose()
    assert exporter.statistics().failed_exports == 1
    assert exporter.statistics().exported == 0
