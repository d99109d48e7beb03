"""Deployments and small helpers shared by the provider tests."""

from __future__ import annotations

from typing import Any

from triogate.config import Deployment, MockSettings, Price


def make_deployment(
    provider: str = "openai",
    *,
    upstream_model: str = "up-model",
    api_base: str | None = "http://upstream.test/v1",
    api_key: str | None = "sk-test-key",
    timeout_s: float = 30.0,
    stream_timeout_s: float | None = None,
    mock: MockSettings | None = None,
    mode: str = "chat",
) -> Deployment:
    """A Deployment as config.py would build it (only the fields providers read vary)."""
    return Deployment(
        id=f"{provider}-1",
        group="group-a",
        provider=provider,
        upstream_model=upstream_model,
        api_base=api_base,
        api_key=api_key,
        rpm=None,
        tpm=None,
        timeout_s=timeout_s,
        stream_timeout_s=stream_timeout_s if stream_timeout_s is not None else timeout_s,
        weight=1.0,
        price=Price(),
        mode=mode,
        mock=mock,
        info={},
    )


def chat_text(events: list[dict[str, Any]]) -> str:
    """The text of a chat chunk stream."""
    return "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices") or ())


def messages_text(events: list[dict[str, Any]]) -> str:
    """The text of an Anthropic event stream."""
    return "".join(
        e["delta"].get("text", "")
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    )


def responses_text(events: list[dict[str, Any]]) -> str:
    """The text of a Responses API event stream."""
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


STREAM_TEXT = {"chat": chat_text, "messages": messages_text, "responses": responses_text}


def completion_text(api: str, body: dict[str, Any]) -> str:
    """The text of a whole answer in ``api``'s shape."""
    if api == "chat":
        return body["choices"][0]["message"]["content"] or ""
    if api == "messages":
        return "".join(b["text"] for b in body["content"] if b["type"] == "text")
    return "".join(
        part["text"]
        for item in body["output"]
        if item["type"] == "message"
        for part in item["content"]
    )
