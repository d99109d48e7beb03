"""Token estimates, for when an upstream reports no usage and for reservations.

triogate never loads a real tokenizer: tiktoken downloads its vocabularies at run time, and
a gateway must not depend on a network fetch to count. Four characters per token is the
usual rule of thumb for English text; it is an *estimate*, and every :class:`Usage` built
from it says so (``reported=False``). Images and other binary inputs are not counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

#: Characters per token in the estimate (OpenAI's rule of thumb for English).
CHARS_PER_TOKEN = 4

# Keys whose string values are not text the model reads as tokens (ids, roles, enums,
# image payloads). Everything else found in a message is counted.
_SKIPPED_KEYS = frozenset(
    {
        "type",
        "role",
        "id",
        "tool_call_id",
        "tool_use_id",
        "call_id",
        "image_url",
        "source",
        "cache_control",
        "status",
    }
)


def tokens_for_chars(chars: int) -> int:
    """Tokens that ``chars`` characters make: ceil(chars / 4), 0 for none."""
    return -(-chars // CHARS_PER_TOKEN) if chars > 0 else 0


def estimate_tokens(text: str) -> int:
    """Estimate the tokens of ``text``: ceil(len / 4), at least 1 for non-empty text."""
    return tokens_for_chars(len(text))


def count_output_tokens(text: str) -> int:
    """Tokens of generated text, counted when the upstream reported none."""
    return estimate_tokens(text)


def _strings(value: Any) -> Iterator[str]:
    """Every string the model would read inside a message, content part or item."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key not in _SKIPPED_KEYS:
                yield from _strings(item)


def _embedding_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return len(value) * CHARS_PER_TOKEN  # already tokens
    if isinstance(value, list):
        return sum(_embedding_chars(v) for v in value)
    return 0


def estimate_input_tokens(api: str, body: Mapping[str, Any]) -> int:
    """Estimate the prompt tokens of a request body in the shape of ``api``.

    Counts all text in ``messages``, ``system``, ``instructions`` and ``input``, and the
    JSON of ``tools`` (the model reads their schemas too).

    Args:
        api: "chat", "messages", "responses" or "embeddings".
        body: the decoded request body.

    Returns:
        The estimate; 0 only when the request carries no text at all.
    """
    if api in ("embeddings", "moderations"):
        return tokens_for_chars(_embedding_chars(body.get("input")))
    chars = 0
    for key in ("system", "instructions", "messages", "input"):
        chars += sum(len(s) for s in _strings(body.get(key)))
    tools = body.get("tools")
    if tools:
        chars += len(orjson.dumps(tools))
    return tokens_for_chars(chars)
