"""A real HTTP server speaking Amazon Bedrock Runtime, for tests and benchmarks.

Written from the public API reference: ``Converse`` (``POST /model/{modelId}/converse``),
``ConverseStream`` (``/converse-stream``, answered in AWS's binary event stream) and
``InvokeModel`` (``/invoke``) for Titan and Cohere embedding models. Every request's SigV4
signature is checked with botocore's own signer (a wrong one is AWS's 403
``InvalidSignatureException``); requests are validated as Bedrock does (roles alternate
and start with the user, one member per content block, known fields only) and refused as
a ``ValidationException``. Errors carry ``x-amzn-ErrorType`` and ``{"message": ...}``.
Replies are :func:`~triogate.testing.fakeupstream.make_reply`'s (counted in words).

In tests::

    async with open_fake_bedrock() as fake:
        fake.fail_next(1, "ThrottlingException")
        ... fake.base_url, fake.access_key_id, fake.secret_access_key ...
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import datetime
import hashlib
import re
import struct
import zlib
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import attrs
import orjson
from botocore.auth import SigV4Auth  # type: ignore[import-untyped]
from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]
from botocore.credentials import Credentials  # type: ignore[import-untyped]

from triogate.testing.asgi import (
    http_body,
    send_events,
    send_json,
    serve_main,
    serving,
)
from triogate.testing.fakeupstream import _embedding, _text_pieces, make_reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.testing.asgi import Receive, Scope, Send

_ROUTE = re.compile(r"^/model/([^/]+)/(converse|converse-stream|invoke)$")
_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,"
                   r"\s*SignedHeaders=([^,]+),\s*Signature=([0-9a-f]{64})")
_FIELDS = {"messages", "system", "inferenceConfig", "toolConfig", "guardrailConfig",
           "additionalModelRequestFields", "additionalModelResponseFieldPaths",
           "promptVariables", "requestMetadata", "performanceConfig"}
_BLOCKS = {"text", "image", "document", "video", "toolUse", "toolResult", "guardContent",
           "reasoningContent", "cachePoint"}
_INFERENCE = {"maxTokens", "temperature", "topP", "stopSequences"}
ERRORS = {  # AWS error type -> HTTP status
    "ValidationException": 400,
    "AccessDeniedException": 403,
    "UnrecognizedClientException": 403,
    "InvalidSignatureException": 403,
    "ResourceNotFoundException": 404,
    "ModelTimeoutException": 408,
    "ThrottlingException": 429,
    "InternalServerException": 500,
    "ServiceUnavailableException": 503,
}
EMBEDDING_DIMENSIONS = 8


class AwsError(Exception):
    """Raised inside the fake to answer an AWS error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string ``headers`` (AWS's framing: prelude with its
    CRC32, headers of value type 7, payload, message CRC32)."""
    head = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        head += (bytes([len(raw_name)]) + raw_name + b"\x07"
                 + struct.pack(">H", len(raw_value)) + raw_value)
    prelude = struct.pack(">II", 16 + len(head) + len(payload), len(head))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + head + payload
    return message + struct.pack(">I", zlib.crc32(message))


def _invalid(message: str) -> AwsError:
    return AwsError("ValidationException", message)


def check_converse(body: dict[str, Any]) -> None:
    """What Converse validates of a request."""
    if unknown := set(body) - _FIELDS:
        raise _invalid(f"Unknown parameter in input: \"{min(unknown)}\"")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("The model returned the following errors: messages: required")
    has_tools = bool((body.get("toolConfig") or {}).get("tools"))
    for i, message in enumerate(messages):
        expected = "user" if i % 2 == 0 else "assistant"
        if not isinstance(message, dict) or message.get("role") != expected:
            raise _invalid("A conversation must alternate between user and assistant roles. "
                           "Make sure the conversation alternates between user and assistant "
                           "roles and try again.")
        content = message.get("content")
        if not isinstance(content, list) or not content:
            raise _invalid(f"messages.{i}.content: must not be empty")
        for j, block in enumerate(content):
            if not isinstance(block, dict) or len(block) != 1 or set(block) - _BLOCKS:
                raise _invalid(f"messages.{i}.content.{j}: a block has exactly one member")
            if "image" in block:
                image = block["image"]
                if image.get("format") not in ("png", "jpeg", "gif", "webp"):
                    raise _invalid(f"messages.{i}.content.{j}.image.format: invalid")
                try:
                    base64.b64decode((image.get("source") or {}).get("bytes", ""), validate=True)
                except binascii.Error:
                    raise _invalid("image bytes are not valid base64") from None
            if ("toolUse" in block or "toolResult" in block) and not has_tools:
                raise _invalid("The toolConfig field must be defined when using toolUse and "
                               "toolResult content blocks.")
    if unknown := set(body.get("inferenceConfig") or {}) - _INFERENCE:
        raise _invalid(f"Unknown parameter in inferenceConfig: \"{min(unknown)}\"")
    for tool in (body.get("toolConfig") or {}).get("tools") or ():
        spec = tool.get("toolSpec") or {}
        if not spec.get("name") or "json" not in (spec.get("inputSchema") or {}):
            raise _invalid("toolConfig.tools: toolSpec needs name and inputSchema.json")


def _text(content: list[dict[str, Any]]) -> str:
    out = []
    for block in content:
        if "text" in block:
            out.append(str(block["text"]))
        elif "image" in block:
            out.append(f"[image/{block['image']['format']}]")
        elif "toolUse" in block or "toolResult" in block:
            out.append(orjson.dumps(block).decode())
    return " ".join(out)


@attrs.define(eq=False, kw_only=True)
class FakeBedrock:
    """The fake's state and controls; it is also the ASGI app.

    Attributes:
        base_url: "http://HOST:PORT" once serving.
        access_key_id, secret_access_key, session_token: the one identity it trusts.
        region: the region signatures must be scoped to.
        max_input_tokens: prompts above this are refused as too long (Bedrock's words).
        chunk_delay_s: pause between streamed events.
        stream_exception, stream_exception_after: an exception message mid-stream.
        requests: (path, headers, json) of every request; verified: signatures checked.
    """

    base_url: str = ""
    access_key_id: str = "AKIDFAKEBEDROCK"
    secret_access_key: str = "fake-secret/key"
    session_token: str | None = None
    region: str = "us-east-1"
    max_input_tokens: int = 100_000
    chunk_delay_s: float = 0.0
    #: Streams end with this exception message after ``stream_exception_after`` events.
    stream_exception: str = "throttlingException"
    stream_exception_after: int | None = None
    record_requests: bool = True
    requests: list[tuple[str, dict[str, str], Any]] = attrs.Factory(list)
    verified: int = 0
    _failures: collections.deque[tuple[str, str]] = attrs.Factory(collections.deque)

    def fail_next(self, n: int = 1, kind: str = "InternalServerException", *,
                  message: str = "injected failure") -> None:
        """Answer the next ``n`` model requests with the AWS error ``kind``."""
        self._failures.extend([(kind, message)] * n)

    def verify_signature(self, method: str, raw_path: str, query: str,
                         headers: dict[str, str], body: bytes) -> None:
        """Check the SigV4 signature with botocore's signer; raise AwsError if wrong."""
        match = _AUTH.fullmatch(headers.get("authorization", ""))
        if match is None:
            raise AwsError("AccessDeniedException", "Missing Authentication Token")
        key_id, date, region, service, signed, signature = match.groups()
        if key_id != self.access_key_id or headers.get(
                "x-amz-security-token") != self.session_token:
            raise AwsError("UnrecognizedClientException",
                           "The security token included in the request is invalid.")
        stamp = headers.get("x-amz-date", "")
        try:
            when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(
                tzinfo=datetime.UTC)
        except ValueError:
            raise AwsError("InvalidSignatureException", "x-amz-date is missing") from None
        if abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) > 300:
            raise AwsError("InvalidSignatureException", "Signature expired")
        if (region, service, date) != (self.region, "bedrock", stamp[:8]):
            raise AwsError("InvalidSignatureException",
                           f"Credential should be scoped to a valid region ({region}).")
        names = signed.split(";")
        if "host" not in names or any(n not in headers for n in names):
            raise AwsError("InvalidSignatureException", "SignedHeaders is incomplete")
        url = f"http://{headers['host']}{raw_path}" + (f"?{query}" if query else "")
        request = AWSRequest(method=method, url=url, data=body,
                             headers={n: headers[n] for n in names})
        request.context["timestamp"] = stamp
        signer = SigV4Auth(Credentials(self.access_key_id, self.secret_access_key,
                                       self.session_token), "bedrock", self.region)
        canonical = signer.canonical_request(request)
        expected = signer.signature(signer.string_to_sign(request, canonical), request)
        if expected != signature:
            raise AwsError("InvalidSignatureException",
                           "The request signature we calculated does not match the signature "
                           "you provided. Check your AWS Secret Access Key and signing method.")
        self.verified += 1

    # ----------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (raw := await http_body(scope, receive, send)) is None:
            return
        try:
            await self._handle(scope, raw, receive, send)
        except AwsError as error:
            await send_json(send, ERRORS.get(error.kind, 500), {"message": error.message},
                             [(b"x-amzn-errortype", f"{error.kind}:http://internal.amazon.com/"
                               "coral/com.amazon.bedrock/".encode())])

    async def _handle(self, scope: Scope, raw: bytes, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        raw_path = scope.get("raw_path", scope["path"].encode()).decode("latin-1").split("?")[0]
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        if self.record_requests:
            self.requests.append((raw_path, headers, body))
        match = _ROUTE.match(raw_path)
        if scope["method"] != "POST" or match is None:
            raise AwsError("ResourceNotFoundException", f"no route {raw_path}")
        self.verify_signature(scope["method"], raw_path, scope.get("query_string", b"").decode(),
                              headers, raw)
        if not isinstance(body, dict):
            raise _invalid("The request body is not a JSON object")
        if self._failures:
            raise AwsError(*self._failures.popleft())
        model, action = unquote(match.group(1)), match.group(2)
        if action == "invoke":
            await self._invoke(model, body, send)
            return
        check_converse(body)
        await self._converse(model, body, send, receive, stream=action == "converse-stream")

    async def _converse(self, model: str, body: dict[str, Any], send: Send, receive: Receive,
                        *, stream: bool) -> None:
        messages = [{"role": m["role"], "content": _text(m["content"])}
                    for m in body["messages"]]
        system = " ".join(str(b.get("text", "")) for b in body.get("system") or ())
        config = body.get("toolConfig") or {}
        choice = config.get("toolChoice") or {}
        tool = None
        if config.get("tools") and ("any" in choice or "tool" in choice):
            tool = (choice.get("tool") or {}).get("name") or config["tools"][0]["toolSpec"][
                "name"]
        reply = make_reply(model=model, messages=messages, system=system or None,
                           max_tokens=(body.get("inferenceConfig") or {}).get("maxTokens"),
                           tool=tool)
        if reply.input_tokens > self.max_input_tokens:
            raise _invalid("Input is too long for requested model.")
        stop = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[
            reply.finish]
        usage = {"inputTokens": reply.input_tokens, "outputTokens": reply.output_tokens,
                 "totalTokens": reply.input_tokens + reply.output_tokens}
        content: list[dict[str, Any]] = []
        if reply.text:
            content.append({"text": reply.text})
        if reply.tool_call is not None:
            call_id, name, arguments = reply.tool_call
            content.append({"toolUse": {"toolUseId": "tooluse_" + call_id[5:], "name": name,
                                        "input": orjson.loads(arguments)}})
        if not stream:
            await send_json(send, 200, {
                "output": {"message": {"role": "assistant", "content": content}},
                "stopReason": stop, "usage": usage, "metrics": {"latencyMs": 1}})
            return

        def event(kind: str, payload: dict[str, Any]) -> bytes:
            return encode_message({":event-type": kind, ":content-type": "application/json",
                                   ":message-type": "event"}, orjson.dumps(payload))

        events = [event("messageStart", {"role": "assistant"})]
        for index, block in enumerate(content):
            if "toolUse" in block:
                use = block["toolUse"]
                events.append(event("contentBlockStart", {"contentBlockIndex": index, "start": {
                    "toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}}))
                pieces: list[dict[str, Any]] = [{"toolUse": {"input": p}}
                          for p in _text_pieces(orjson.dumps(use["input"]).decode())]
            else:
                pieces = [{"text": p} for p in _text_pieces(block["text"])]
            events += [event("contentBlockDelta", {"contentBlockIndex": index, "delta": p})
                       for p in pieces]
            events.append(event("contentBlockStop", {"contentBlockIndex": index}))
        events.append(event("messageStop", {"stopReason": stop}))
        events.append(event("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))
        if self.stream_exception_after is not None:
            events = events[:self.stream_exception_after]
            events.append(encode_message(
                {":exception-type": self.stream_exception, ":content-type": "application/json",
                 ":message-type": "exception"},
                orjson.dumps({"message": "Too many tokens, please wait before trying again."})))
        await send_events(send, receive, events, self.chunk_delay_s, [
            (b"content-type", b"application/vnd.amazon.eventstream"),
            (b"x-amzn-requestid", hashlib.sha256(orjson.dumps(body)).hexdigest()[:36].encode())])

    async def _invoke(self, model: str, body: dict[str, Any], send: Send) -> None:
        if model.split(".", 1)[-1].startswith("titan-embed") or "titan-embed" in model:
            text = body.get("inputText")
            if not isinstance(text, str) or set(body) - {"inputText", "dimensions",
                                                         "normalize", "embeddingTypes"}:
                raise _invalid("Malformed input request: inputText is required")
            size = body.get("dimensions") or EMBEDDING_DIMENSIONS
            await send_json(send, 200, {"embedding": _embedding(f"{model}\0{text}", size),
                                         "inputTextTokenCount": len(text.split())})
        elif "cohere.embed" in model:
            texts = body.get("texts")
            if not isinstance(texts, list) or not texts or not body.get("input_type"):
                raise _invalid("Malformed input request: texts and input_type are required")
            await send_json(send, 200, {
                "id": hashlib.sha256(orjson.dumps(texts)).hexdigest()[:16],
                "embeddings": [_embedding(f"{model}\0{t}", EMBEDDING_DIMENSIONS)
                               for t in texts],
                "response_type": "embeddings_floats", "texts": texts})
        else:
            raise _invalid(f"The provided model identifier is invalid: {model}")


@contextlib.asynccontextmanager
async def open_fake_bedrock(host: str = "127.0.0.1", port: int = 0, **settings: Any
                           ) -> AsyncIterator[FakeBedrock]:
    """Serve a :class:`FakeBedrock` in a nursery of the caller's task; stop on exit."""
    async with serving(FakeBedrock(**settings), host, port) as fake:
        yield fake


def main(argv: list[str] | None = None) -> None:
    """``python -m triogate.testing.fakebedrock --port N``: serve until Ctrl-C."""
    serve_main(__doc__.split("\n")[0], open_fake_bedrock, argv)


if __name__ == "__main__":
    main()
