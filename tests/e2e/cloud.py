"""What the cloud providers' end-to-end tests share (Gemini, Vertex AI, Bedrock)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.e2e.conftest import MASTER_KEY
from triogate.config import parse_config

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from triogate.config import GatewayConfig

#: A 1x1 PNG.
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJ"
           "RU5ErkJggg==")
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
USD = 1_000_000_000


def cloud_config(tmp_path: Path, redis_url: str, models: list[dict[str, Any]]) -> GatewayConfig:
    """A gateway serving ``models`` only, with the test defaults (tracing on)."""
    return parse_config({
        "model_list": models,
        "router_settings": {"num_retries": 0, "allowed_fails": 2, "cooldown_time": 60},
        "general_settings": {"master_key": MASTER_KEY},
        "triogate": {"state_dir": str(tmp_path / "state"), "tracing": True,
                     "redis": {"url": redis_url, "timeout_s": 2.0}, "shutdown_grace_s": 5}})


def error_of(response: httpx.Response, *, anthropic_shape: bool, secret: str
             ) -> dict[str, Any]:
    """The error object of an OpenAI- or Anthropic-shaped error answer, checked clean
    (no stack trace, not the upstream ``secret``)."""
    payload = response.json()
    if anthropic_shape:
        assert payload["type"] == "error"
    assert secret and "Traceback" not in response.text and secret not in response.text
    error: dict[str, Any] = payload["error"]
    return error
