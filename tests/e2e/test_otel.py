"""OpenTelemetry: one trace per request (root, Redis waits, model call, settlement),
exported as OTLP/JSON to a receiver the test runs, drained on shutdown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import openai
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, gateway_config, running_gateway
from tests.e2e.otlp_receiver import open_receiver
from triogate import config_litellm
from triogate.config import OtelSettings, parse_config
from triogate.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.batch import RespBackend
    from triogate.testing.fakeupstream import FakeUpstream

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

HI = [{"role": "user", "content": "say something short"}]


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}


async def test_a_request_is_one_trace_with_its_waits_call_and_settlement(
    tmp_path: Path, redis: RespBackend, redis_url: str, upstream: FakeUpstream
) -> None:
    async with open_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
               "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme", "OTEL_SERVICE_NAME": "gw-test"}
        config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                                litellm_settings={"callbacks": ["otel"]})
        config = attrs.evolve(config, otel=OtelSettings(**config_litellm.otel(env)))
        assert config.otel is not None
        with trio.fail_after(60):
            async with running_gateway(config) as gateway:
                client = openai.AsyncOpenAI(base_url=gateway.openai_base, api_key=MASTER_KEY,
                                            max_retries=0)
                raw = await client.chat.completions.with_raw_response.create(
                    model="gpt-test", messages=HI)
                trace_id = raw.headers["x-litellm-call-id"]
            # The gateway has shut down: everything it held was exported.
        spans = [s for s in receiver.spans() if s["traceId"] == trace_id]
    _, headers, body = receiver.posts[0]
    assert headers["x-tenant"] == "acme"
    assert body["resourceSpans"][0]["resource"]["attributes"][0]["value"] == {
        "stringValue": "gw-test"}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    (root,) = by_name["chat gpt-test"]
    assert "parentSpanId" not in root and root["kind"] == 2
    assert _attrs(root)["http.response.status_code"] == "200"
    waits = by_name["redis wait before #1"] + by_name["redis wait after #1"]
    assert len(waits) == 2 and all(w["parentSpanId"] == root["spanId"] for w in waits)
    (call,) = by_name["model call"]
    assert call["parentSpanId"] == root["spanId"]
    (attempt,) = by_name["model attempt"]
    assert attempt["parentSpanId"] == call["spanId"]
    (settle,) = by_name["settlement"]
    assert settle["parentSpanId"] == root["spanId"]
    starts = [int(s["startTimeUnixNano"]) for s in (root, call, settle)]
    assert starts == sorted(starts)
    assert int(root["endTimeUnixNano"]) >= int(settle["endTimeUnixNano"]) - 1_000_000


def test_only_otlp_over_http_json_is_accepted() -> None:
    raw = {"litellm_settings": {"callbacks": ["otel"]}}
    default = parse_config(raw).otel
    assert default is not None and default.endpoint == "http://localhost:4318/v1/traces"
    full = parse_config(raw, environ={
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:1/custom"}).otel
    assert full is not None and full.endpoint == "http://c:1/custom"
    with pytest.raises(ConfigError, match="http/json"):
        parse_config(raw, environ={"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert parse_config({}).otel is None
