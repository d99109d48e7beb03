"""LiteLLM's ``drop_params``: leave out what a provider cannot take instead of a 400.

Translation refuses (``ValueError``, a 400 to the client) what the upstream's API cannot
express. With ``drop_params`` on (the config's ``litellm_settings.drop_params``, a
deployment's ``litellm_params.drop_params``, or the request's own ``drop_params``), those
parts are removed before translation instead: ``n`` > 1 and non-text, non-image content
for Anthropic, Bedrock, Gemini and Vertex AI models; Anthropic-only content blocks for
models that do not speak messages; built-in tools and file inputs of the Responses API.
Parameters the translation has no place for are already left out by it. Pure functions;
the client's body is never changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.providers.records import Api

_CHAT_PARTS_FOR_ANTHROPIC = frozenset({"text", "image_url"})
_MESSAGES_BLOCKS_FOR_CHAT = frozenset({"text", "image", "tool_use", "tool_result"})
_RESPONSES_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
#: Providers whose APIs take one answer and only text and images from a chat request.
_BLOCK_PROVIDERS = frozenset({"anthropic", "bedrock", "gemini", "vertex_ai"})


def _chat_part_ok(part: Any) -> bool:
    if not isinstance(part, dict) or part.get("type") not in _CHAT_PARTS_FOR_ANTHROPIC:
        return False
    if part.get("type") == "image_url":
        url = str((part.get("image_url") or {}).get("url", ""))
        return not url.startswith("data:") or ";base64," in url
    return True


def _block_ok(block: Any) -> bool:
    if not isinstance(block, dict) or block.get("type") not in _MESSAGES_BLOCKS_FOR_CHAT:
        return False
    if block.get("type") == "image":
        return (block.get("source") or {}).get("type") in ("base64", "url")
    return True


def _filter_content(messages: Any, keep: Any, *, roles: frozenset[str] | None = None) -> Any:
    if not isinstance(messages, list):
        return messages
    out = []
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), list) and (
                roles is None or message.get("role") in roles):
            message = {**message, "content": [p for p in message["content"] if keep(p)]}
        out.append(message)
    return out


def _responses_part_ok(role: Any) -> Any:
    def keep(part: Any) -> bool:
        if not isinstance(part, dict):
            return False
        if part.get("type") in _RESPONSES_TEXT_PARTS:
            return True
        return role == "user" and part.get("type") == "input_image" and bool(
            part.get("image_url"))
    return keep


def _responses(body: dict[str, Any]) -> dict[str, Any]:
    tools = body.get("tools")
    if isinstance(tools, list):
        body["tools"] = [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        if not body["tools"]:
            del body["tools"]
            body.pop("tool_choice", None)
    items = body.get("input")
    if isinstance(items, list):
        body["input"] = [
            {**item, "content": [p for p in item["content"]
                                 if _responses_part_ok(item.get("role"))(p)]}
            if isinstance(item, dict) and isinstance(item.get("content"), list) else item
            for item in items
        ]
    return body


def drop_unsupported(api: Api, body: Mapping[str, Any], provider: str) -> dict[str, Any]:
    """``body`` without what ``provider`` cannot take when the client speaks ``api``."""
    out = dict(body)
    if api == "responses":
        out = _responses(out)
    if provider in _BLOCK_PROVIDERS and api in ("chat", "responses"):
        if out.get("n") not in (None, 1):
            out.pop("n")
        out["messages"] = _filter_content(out.get("messages"), _chat_part_ok)
        if out["messages"] is None:
            del out["messages"]
    if provider != "anthropic" and api == "messages":
        out["messages"] = _filter_content(out.get("messages"), _block_ok)
        if out["messages"] is None:
            del out["messages"]
    return out
