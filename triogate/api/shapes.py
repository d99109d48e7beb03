"""The nested shapes of the model APIs, checked before admission.

Every field the gateway or a translator reads is checked here, so that a well-formed JSON
body of an unexpected shape gets a 400 naming the field (``messages[0].content[1].type``
in OpenAI's convention, ``messages.0.content.1.type`` in Anthropic's) instead of failing
inside a translator after admission. Fields nobody reads pass through untouched: the
upstream judges them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triogate.api.errors import ApiError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from triogate.api.errors import Style

#: Bound for integers the gateway reads (token counts, dimensions): well inside what
#: every upstream and the Redis scripts (integers < 2^53) accept.
MAX_INT = 2**31 - 1


class Path:
    """A field path, spelled the way the client's API spells it."""

    def __init__(self, style: Style, text: str = "") -> None:
        self.style = style
        self.text = text

    def __truediv__(self, part: str | int) -> Path:
        if isinstance(part, int):
            suffix = f".{part}" if self.style == "anthropic" else f"[{part}]"
        else:
            suffix = f".{part}" if self.text else part
        return Path(self.style, self.text + suffix)

    def fail(self, what: str) -> ApiError:
        """A 400 naming this field."""
        if self.style == "anthropic":
            return ApiError(400, f"{self.text}: {what}", param=self.text)
        return ApiError(400, f"field '{self.text}' {what}", param=self.text)


def obj(value: Any, path: Path) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise path.fail("must be an object")
    return value


def objects(value: Any, path: Path, *, optional: bool = True) -> list[Mapping[str, Any]]:
    """A list of objects (None allowed when ``optional``)."""
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise path.fail("must be a list of objects")
    for i, item in enumerate(value):
        obj(item, path / i)
    return value


def text(value: Any, path: Path, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise path.fail("must be a string")


def texts(value: Any, path: Path) -> None:
    """A string or a list of strings (``stop``)."""
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise path.fail("must be a string or a list of strings")


def fields(item: Mapping[str, Any], path: Path, *, strings: tuple[str, ...] = (),
           objs: tuple[str, ...] = ()) -> None:
    """Optional string and object fields of ``item``."""
    for name in strings:
        text(item.get(name), path / name)
    for name in objs:
        if item.get(name) is not None:
            obj(item[name], path / name)


def typed(value: Any, path: Path) -> Mapping[str, Any]:
    """An object whose ``type`` is a string (a content part, block, item or tool)."""
    item = obj(value, path)
    if not isinstance(item.get("type"), str):
        raise (path / "type").fail("must be a string")
    return item


def integer(body: Mapping[str, Any], name: str, path: Path, *, low: int = 1,
            high: int = MAX_INT) -> int | None:
    """An optional integer in [low, high] (bool is not an integer here)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise (path / name).fail("must be an integer")
    if not low <= value <= high:
        raise (path / name).fail(f"must be between {low} and {high}")
    return value


# --------------------------------------------------------------------------- chat


def _chat_parts(content: Any, path: Path) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise path.fail("must be a string or a list of parts")
    for i, raw in enumerate(content):
        part = typed(raw, path / i)
        fields(part, path / i, strings=("text", "refusal"), objs=("input_audio", "file"))
        if part["type"] == "image_url":
            url = obj(part.get("image_url"), path / i / "image_url")
            text(url.get("url"), path / i / "image_url" / "url", optional=False)
            text(url.get("detail"), path / i / "image_url" / "detail")


def chat(body: Mapping[str, Any]) -> None:
    """The fields of a chat completions request that the gateway or a translator reads."""
    root = Path("openai")
    for i, message in enumerate(objects(body.get("messages"), root / "messages")):
        at = root / "messages" / i
        _chat_parts(message.get("content"), at / "content")
        fields(message, at, strings=("name", "tool_call_id"))
        for j, call in enumerate(objects(message.get("tool_calls"), at / "tool_calls")):
            fields(call, at / "tool_calls" / j, strings=("id", "type"), objs=("function",))
            function = call.get("function") or {}
            text(function.get("name"), at / "tool_calls" / j / "function" / "name")
            if not isinstance(function.get("arguments"), (str, dict, type(None))):
                raise (at / "tool_calls" / j / "function" / "arguments").fail(
                    "must be a string")
    for i, tool in enumerate(objects(body.get("tools"), root / "tools")):
        fields(tool, root / "tools" / i, strings=("type",), objs=("function",))
        function = tool.get("function") or {}
        fields(function, root / "tools" / i / "function", strings=("name", "description"),
               objs=("parameters",))
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, str):
        fields(obj(choice, root / "tool_choice"), root / "tool_choice", strings=("type",),
               objs=("function",))
        fields(choice.get("function") or {}, root / "tool_choice" / "function",
               strings=("name",))
    texts(body.get("stop"), root / "stop")
    fields(body, root, objs=("response_format", "stream_options"))
    if body.get("parallel_tool_calls") is not None and not isinstance(
            body["parallel_tool_calls"], bool):
        raise (root / "parallel_tool_calls").fail("must be a boolean")
    integer(body, "n", root, high=128)
    integer(body, "max_tokens", root)
    integer(body, "max_completion_tokens", root)


# --------------------------------------------------------------------------- messages


def _blocks(content: Any, path: Path) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise path.fail("must be a string or a list of blocks")
    for i, raw in enumerate(content):
        block = typed(raw, path / i)
        at = path / i
        fields(block, at, strings=("text", "id", "name", "tool_use_id"), objs=("input",))
        if block["type"] == "image":
            source = obj(block.get("source"), at / "source")
            fields(source, at / "source", strings=("type", "media_type", "data", "url"))
        elif block["type"] == "tool_result":
            result = block.get("content")
            if result is not None and not isinstance(result, str):
                for j, inner in enumerate(objects(result, at / "content")):
                    fields(typed(inner, at / "content" / j), at / "content" / j,
                           strings=("text",))


def messages(body: Mapping[str, Any]) -> None:
    """The fields of an Anthropic messages request that the gateway or a translator reads."""
    root = Path("anthropic")
    for i, message in enumerate(objects(body.get("messages"), root / "messages")):
        _blocks(message.get("content"), root / "messages" / i / "content")
    system = body.get("system")
    if isinstance(system, list):
        for i, block in enumerate(system):
            fields(typed(block, root / "system" / i), root / "system" / i, strings=("text",))
    for i, tool in enumerate(objects(body.get("tools"), root / "tools")):
        fields(tool, root / "tools" / i, strings=("name", "description", "type"),
               objs=("input_schema",))
    if body.get("tool_choice") is not None:
        typed(body["tool_choice"], root / "tool_choice")
        fields(body["tool_choice"], root / "tool_choice", strings=("name",))
    stop = body.get("stop_sequences")
    if stop is not None and (not isinstance(stop, list)
                             or not all(isinstance(s, str) for s in stop)):
        raise (root / "stop_sequences").fail("must be a list of strings")
    integer(body, "top_k", root, low=0)


# --------------------------------------------------------------------------- responses


def _response_item(item: Mapping[str, Any], path: Path) -> None:
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        raise (path / "type").fail("must be a string")
    fields(item, path, strings=("role", "call_id", "name", "arguments", "id"))
    content = item.get("content")
    if kind == "message" and content is not None and not isinstance(content, str):
        for j, part in enumerate(objects(content, path / "content")):
            fields(typed(part, path / "content" / j), path / "content" / j,
                   strings=("text", "refusal", "image_url", "detail"))
    output = item.get("output")
    if kind == "function_call_output" and output is not None and not isinstance(output, str):
        for j, part in enumerate(objects(output, path / "output")):
            fields(part, path / "output" / j, strings=("text",))


def responses(body: Mapping[str, Any]) -> None:
    """The fields of a Responses API request that the gateway or a translator reads."""
    root = Path("openai")
    items = body.get("input")
    if isinstance(items, list):
        for i, item in enumerate(objects(items, root / "input")):
            _response_item(item, root / "input" / i)
    fields(body, root, strings=("previous_response_id",), objs=("text",))
    fmt = (body.get("text") or {}).get("format")
    if fmt is not None:
        fields(typed(fmt, root / "text" / "format"), root / "text" / "format",
               strings=("name", "description"), objs=("schema",))
    for i, tool in enumerate(objects(body.get("tools"), root / "tools")):
        fields(typed(tool, root / "tools" / i), root / "tools" / i,
               strings=("name", "description"), objs=("parameters",))
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, str):
        fields(obj(choice, root / "tool_choice"), root / "tool_choice",
               strings=("type", "name"))
    if body.get("parallel_tool_calls") is not None and not isinstance(
            body["parallel_tool_calls"], bool):
        raise (root / "parallel_tool_calls").fail("must be a boolean")
    integer(body, "max_output_tokens", root)


# --------------------------------------------------------------------------- embeddings


def embeddings(body: Mapping[str, Any]) -> None:
    """``dimensions`` and ``encoding_format`` (token ids are bounded by ``check_input``)."""
    root = Path("openai")
    integer(body, "dimensions", root, high=65_536)
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        raise (root / "encoding_format").fail("must be 'float' or 'base64'")
