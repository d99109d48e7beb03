"""drop_params: what each provider cannot take is left out, the rest untouched."""

from __future__ import annotations

from triogate.providers.params import drop_unsupported
from triogate.providers.translate_chat_messages import chat_to_messages_request


def test_chat_to_anthropic_drops_n_and_unsendable_parts() -> None:
    body = {"model": "m", "n": 3, "temperature": 0.5, "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "hi"},
            {"type": "input_audio", "input_audio": {"data": "x"}},
            {"type": "image_url", "image_url": {"url": "data:image/png,raw"}},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}
    out = drop_unsupported("chat", body, "anthropic")
    assert "n" not in out and out["temperature"] == 0.5
    assert [p["type"] for p in out["messages"][0]["content"]] == ["text", "image_url"]
    assert body["n"] == 3 and len(body["messages"][0]["content"]) == 4  # not changed
    chat_to_messages_request(out)  # translates without a ValueError now


def test_chat_to_openai_is_unchanged() -> None:
    body = {"model": "m", "n": 3, "messages": [{"role": "user", "content": "hi"}]}
    assert drop_unsupported("chat", body, "openai") == body


def test_messages_to_openai_drops_anthropic_only_blocks() -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "document", "source": {}},
        {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}
    out = drop_unsupported("messages", body, "openai")
    assert out["messages"][0]["content"] == [{"type": "text", "text": "hi"}]
    assert drop_unsupported("messages", body, "anthropic") == body


def test_responses_drops_builtin_tools_and_files() -> None:
    body = {"model": "m", "tools": [{"type": "web_search"}], "tool_choice": "auto",
            "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "hi"}, {"type": "input_file", "file_id": "f"},
                {"type": "input_image", "file_id": "f"}]}]}
    out = drop_unsupported("responses", body, "openai")
    assert "tools" not in out and "tool_choice" not in out
    assert out["input"][0]["content"] == [{"type": "input_text", "text": "hi"}]
