"""OpenAI chat-completion chunks, as the cloud streams' translators make them."""

from __future__ import annotations

from typing import Any


class ChatChunks:
    """Makes the chunks of one streamed chat completion (``id``, ``created``, ``model``
    the same on each); a stream translator subclasses it and adds ``feed``."""

    def __init__(self, *, created_s: int, model: str | None, chunk_id: str) -> None:
        self._created_s = created_s
        self._model = model
        self._id = chunk_id

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self._id, "object": "chat.completion.chunk", "created": self._created_s,
                "model": self._model, "choices": choices, **extra}

    def _delta(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return self._chunk([{"index": 0, "delta": delta, "finish_reason": finish,
                             "logprobs": None}])
