"""OpenTelemetry traces (``callbacks: [otel]``): one span per request, exported as OTLP/JSON.

Each request is a trace whose id is the request's trace id. Its root span covers the
request from arrival to settlement; children are each Redis wait (one per flush record:
the batch library reports them through :meth:`SpanExporter.record`, the ``Tracer``
protocol), the model call (with one child per attempt) and settlement. Spans of one
request may leave in different exports (the post-call wait happens after the response):
they join up by trace and parent ids at the collector, as OTLP intends.

Recording is sync and never blocks: spans go into a bounded queue (dropped and counted
when it is full). :meth:`SpanExporter.run`, a task in the app nursery, sends them in
batches over HTTP (OTLP/JSON, the protocol's documented JSON mapping: ids in hex,
64-bit integers as strings), each POST bounded in time; a failed export is logged and
dropped, never retried forever. :meth:`SpanExporter.aclose` ends the queue and ``run``
drains what is left before it returns. No OpenTelemetry SDK: its exporters use threads
of their own, which a trio app cannot own.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, final

import attrs
import httpx
import orjson
import trio

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from triogate.batch import FlushRecord, Tracer
    from triogate.config import OtelSettings
    from triogate.routing.router import Attempt

logger = logging.getLogger("triogate.otel")

SERVER, CLIENT, INTERNAL = 2, 3, 1
STATUS_OK, STATUS_ERROR = 1, 2


def _attr(key: str, value: str | int | float | bool) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def root_span_id(trace_id: str) -> str:
    """The root span's id: fixed by the trace id, so children can name it in advance."""
    return trace_id[:16]


@final
@attrs.frozen(kw_only=True)
class RequestSpans:
    """What a finished request tells the exporter (times on Trio's clock, seconds).

    Attributes:
        trace_id: the request's 32-hex id.
        route, group: the API and the model group.
        status: how it ended (``success``, ``error``, ``rejected``, ``cache_hit``...).
        http_status: what the client got.
        started_s: arrival; admitted_s: end of admission; settle_started_s: start of
            settlement; ended_s: end of settlement.
        attempts: the model-call attempts, in order.
        deployment: the deployment that answered, if any.
        input_tokens, output_tokens, cost_nanousd: usage and cost.
    """

    trace_id: str
    route: str
    group: str
    status: str
    http_status: int
    started_s: float
    admitted_s: float | None
    settle_started_s: float
    ended_s: float
    attempts: Sequence[Attempt] = ()
    deployment: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_nanousd: int = 0


@final
@attrs.frozen(kw_only=True)
class ExporterStatistics:
    queued: int
    exported: int
    dropped: int
    failed_exports: int


@final
class SpanExporter:
    """Collects spans and exports them; see the module docstring.

    Args:
        settings: endpoint, headers, service name, queue and batch sizes.
        client: the HTTP client to post with (owned by the caller).
        inner: another tracer that must see every flush record too (the in-memory one).
        wall_ns: wall-clock nanoseconds (injectable).
    """

    def __init__(self, settings: OtelSettings, client: httpx.AsyncClient, *,
                 inner: Tracer | None = None, wall_ns: Callable[[], int] = time.time_ns
                 ) -> None:
        self._settings = settings
        self._client = client
        self._inner = inner
        self._wall_ns = wall_ns
        self._send, self._receive = trio.open_memory_channel[dict[str, Any]](
            settings.queue_spans)
        self._exported = 0
        self._dropped = 0
        self._failed = 0
        self._finished = trio.Event()

    def statistics(self) -> ExporterStatistics:
        return ExporterStatistics(queued=self._send.statistics().current_buffer_used,
                                  exported=self._exported, dropped=self._dropped,
                                  failed_exports=self._failed)

    # ------------------------------------------------------------------ recording

    def _ns(self, trio_s: float) -> int:
        """A Trio-clock time as wall-clock nanoseconds."""
        return self._wall_ns() - round((trio.current_time() - trio_s) * 1e9)

    def _submit(self, span: dict[str, Any]) -> None:
        try:
            self._send.send_nowait(span)
        except (trio.WouldBlock, trio.ClosedResourceError):
            self._dropped += 1

    def _span(self, trace_id: str, name: str, start_ns: int, end_ns: int, *,
              parent: str | None, kind: int = INTERNAL, span_id: str | None = None,
              attributes: Sequence[dict[str, Any]] = (), ok: bool = True) -> None:
        span: dict[str, Any] = {
            "traceId": trace_id, "spanId": span_id or secrets.token_hex(8), "name": name,
            "kind": kind, "startTimeUnixNano": str(start_ns),
            "endTimeUnixNano": str(max(start_ns, end_ns)),
            "attributes": list(attributes),
            "status": {"code": STATUS_OK if ok else STATUS_ERROR},
        }
        if parent is not None:
            span["parentSpanId"] = parent
        self._submit(span)

    def record(self, record: FlushRecord) -> None:
        """The batch library's ``Tracer`` hook: one span per Redis pipeline. Sync."""
        if self._inner is not None:
            self._inner.record(record)
        if len(record.trace_id) != 32:
            return  # not a request's trace (replays, admin work)
        end_ns = self._wall_ns()
        self._span(
            record.trace_id, f"redis wait {record.phase} #{record.round}",
            end_ns - round(record.duration_s * 1e9), end_ns,
            parent=root_span_id(record.trace_id), kind=CLIENT, ok=record.ok,
            attributes=[
                _attr("db.system", "redis"), _attr("triogate.phase", record.phase),
                _attr("triogate.round", record.round), _attr("triogate.backend",
                                                             record.backend),
                _attr("triogate.commands", len(record.commands)),
                _attr("triogate.owners", ",".join(sorted(set(record.owners)))),
                _attr("triogate.shared_with", record.shared_with),
            ],
        )

    def request_done(self, spans: RequestSpans) -> None:
        """The request's root span, its model call (and attempts), its settlement. Sync."""
        root = root_span_id(spans.trace_id)
        trace = spans.trace_id
        ok = spans.http_status < 500
        if spans.admitted_s is not None and spans.attempts:
            call = secrets.token_hex(8)
            cursor = spans.admitted_s
            for attempt in spans.attempts:
                self._span(trace, "model attempt", self._ns(cursor),
                           self._ns(cursor + attempt.latency_s), parent=call, kind=CLIENT,
                           ok=attempt.ok, attributes=[
                               _attr("triogate.deployment", attempt.deployment_id),
                               *([_attr("error.type", type(attempt.error).__name__)]
                                 if attempt.error is not None else [])])
                cursor += attempt.latency_s
            self._span(trace, "model call", self._ns(spans.admitted_s),
                       self._ns(spans.settle_started_s), parent=root, span_id=call,
                       ok=any(a.ok for a in spans.attempts), attributes=[
                           _attr("gen_ai.request.model", spans.group),
                           _attr("gen_ai.usage.input_tokens", spans.input_tokens),
                           _attr("gen_ai.usage.output_tokens", spans.output_tokens),
                           _attr("triogate.attempts", len(spans.attempts))])
        self._span(trace, "settlement", self._ns(spans.settle_started_s),
                   self._ns(spans.ended_s), parent=root)
        attributes = [
            _attr("http.route", spans.route), _attr("http.response.status_code",
                                                    spans.http_status),
            _attr("gen_ai.request.model", spans.group), _attr("triogate.status", spans.status),
            _attr("triogate.cost_nanousd", spans.cost_nanousd),
        ]
        if spans.deployment is not None:
            attributes.append(_attr("triogate.deployment", spans.deployment))
        self._span(trace, f"{spans.route} {spans.group}", self._ns(spans.started_s),
                   self._ns(spans.ended_s), parent=None, kind=SERVER, span_id=root,
                   attributes=attributes, ok=ok)

    # ------------------------------------------------------------------ exporting

    def _payload(self, spans: list[dict[str, Any]]) -> bytes:
        return orjson.dumps({"resourceSpans": [{
            "resource": {"attributes": [_attr("service.name", self._settings.service_name)]},
            "scopeSpans": [{"scope": {"name": "triogate"}, "spans": spans}],
        }]})

    async def _export(self, spans: list[dict[str, Any]]) -> None:
        try:
            with trio.fail_after(self._settings.timeout_s):
                response = await self._client.post(
                    self._settings.endpoint, content=self._payload(spans),
                    headers={"content-type": "application/json", **self._settings.headers})
            if response.status_code >= 300:
                raise httpx.HTTPStatusError(f"status {response.status_code}",
                                            request=response.request, response=response)
        except (httpx.HTTPError, trio.TooSlowError, OSError) as exc:
            self._failed += 1
            logger.warning("span export failed; %d spans dropped: %s", len(spans),
                           type(exc).__name__)
        else:
            self._exported += len(spans)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Export batches until :meth:`aclose`, then what is left; a task of the app nursery."""
        task_status.started()
        try:
            await self._drain()
        finally:
            self._finished.set()

    async def _drain(self) -> None:
        async with self._receive:
            closed = False
            while not closed:
                batch: list[dict[str, Any]] = []
                try:
                    batch.append(await self._receive.receive())
                except trio.EndOfChannel:
                    return
                with trio.move_on_after(self._settings.interval_s):
                    while len(batch) < self._settings.batch_spans:
                        try:
                            batch.append(await self._receive.receive())
                        except trio.EndOfChannel:
                            closed = True
                            break
                await self._export(batch)

    async def aclose(self) -> None:
        """No more spans: wait for ``run`` to export what is queued and return."""
        await self._send.aclose()
        await self._finished.wait()
