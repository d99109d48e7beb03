"""A real HTTP server speaking Google's Gemini API and Vertex AI, for tests and benchmarks.

Written from the public REST reference (``generateContent``, ``streamGenerateContent`` with
``alt=sse``, ``embedContent``, ``batchEmbedContents``; Vertex AI's ``publishers/google``
models and ``predict``, and Claude at ``publishers/anthropic`` (``rawPredict``,
``streamRawPredict``: the Anthropic fake's Messages API, model in the URL); the OAuth 2.0
JWT bearer grant at ``/token``), and checked against the ``google-genai`` SDK by the
tests. Like the real API it refuses unknown fields and
malformed parts with ``400 INVALID_ARGUMENT``, so a translation mistake is an error here
too; function calls carry a ``thoughtSignature``, which ``gemini-3…`` models require back
when the call is replayed. Replies are
:func:`~triogate.testing.fakeupstream.make_reply`'s (counted in words).

In tests::

    async with open_fake_gemini(api_key="k") as fake:
        account = fake.service_account()   # a service-account JSON its /token accepts
        fake.fail_next(1, status=429)
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import hashlib
import re
import secrets
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import attrs
import orjson
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from triogate.testing.asgi import (
    http_body,
    send_events,
    send_json,
    serve_main,
    serving,
)
from triogate.testing.fakeupstream import (
    FakeUpstream,
    HTTPError,
    ReceivedRequest,
    _embedding,
    _text_pieces,
    make_reply,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.testing.asgi import Receive, Scope, Send

_GEMINI = re.compile(r"^/v1(?:beta|alpha)?/models/([^/:]+):(\w+)$")
_VERTEX = re.compile(r"^/v1(?:beta1)?/projects/([^/]+)/locations/([^/]+)/publishers/google/"
                     r"models/([^/:]+):(\w+)$")
_VERTEX_ANTHROPIC = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/publishers/anthropic/"
                               r"models/([^/:]+):(rawPredict|streamRawPredict)$")
_REQUEST_FIELDS = {"contents", "systemInstruction", "tools", "toolConfig", "generationConfig",
                   "safetySettings", "cachedContent", "labels", "model"}
_GENERATION_FIELDS = {"temperature", "topP", "topK", "candidateCount", "maxOutputTokens",
                      "stopSequences", "presencePenalty", "frequencyPenalty", "seed",
                      "responseMimeType", "responseSchema", "responseJsonSchema",
                      "responseLogprobs", "logprobs", "thinkingConfig", "responseModalities"}
_PART_FIELDS = {"text", "inlineData", "fileData", "functionCall", "functionResponse",
                "executableCode", "codeExecutionResult"}
_PART_EXTRAS = {"thought", "thoughtSignature", "videoMetadata", "mediaResolution"}
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
EMBEDDING_DIMENSIONS = 8
#: The audience Google's token endpoint requires of an assertion (wherever it is posted).
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"


# Values that are the caller's own data (arguments, schemas): their keys are not fields.
_OPAQUE = {"args", "response", "parameters", "parametersJsonSchema", "responseSchema",
           "responseJsonSchema", "labels", "data"}


def camel_fields(value: Any) -> Any:
    """Field names in lowerCamelCase: proto JSON takes a field's snake_case name too."""
    if isinstance(value, list):
        return [camel_fields(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        head, *rest = str(key).split("_")
        name = head + "".join(w[:1].upper() + w[1:] for w in rest)
        out[name] = item if name in _OPAQUE else camel_fields(item)
    return out


def _pad(text: str) -> str:
    return text + "=" * (-len(text) % 4)


def _invalid(message: str) -> HTTPError:
    return HTTPError(400, message)


def _check_parts(parts: Any, where: str, *, thinking: bool = False) -> None:
    if not isinstance(parts, list) or not parts:
        raise _invalid(f"{where}.parts: must contain at least one part")
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise _invalid(f"{where}.parts[{i}]: must be an object")
        unknown = set(part) - _PART_FIELDS - _PART_EXTRAS
        if unknown:
            raise _invalid(f'Invalid JSON payload received. Unknown name "{min(unknown)}" at '
                           f"'{where}.parts[{i}]': Cannot find field.")
        if len(set(part) & _PART_FIELDS) != 1:
            raise _invalid(f"{where}.parts[{i}]: a part holds exactly one kind of data")
        if "inlineData" in part:
            blob = part["inlineData"]
            if not isinstance(blob, dict) or not blob.get("mimeType"):
                raise _invalid(f"{where}.parts[{i}].inlineData.mimeType: required")
            try:
                data = str(blob.get("data", "")).replace("-", "+").replace("_", "/")
                base64.b64decode(data, validate=True)  # proto JSON: either alphabet
            except binascii.Error:
                raise _invalid(f"{where}.parts[{i}].inlineData.data: not base64") from None
        if "functionCall" in part and not (part["functionCall"] or {}).get("name"):
            raise _invalid(f"{where}.parts[{i}].functionCall.name: required")
        if "functionCall" in part and thinking and not part.get("thoughtSignature"):
            raise _invalid(f"Function call is missing a thought_signature in functionCall "
                           f"parts. This is required for tools to work correctly. "
                           f"{where}.parts[{i}]")
        if "functionResponse" in part and not isinstance(
                (part["functionResponse"] or {}).get("response"), dict):
            raise _invalid(f"{where}.parts[{i}].functionResponse.response: must be an object")


def check_request(body: dict[str, Any], *, thinking: bool = False) -> None:
    """What generateContent checks of a request (its field names and shapes); a
    ``thinking`` model also wants each replayed function call's thought signature."""
    unknown = set(body) - _REQUEST_FIELDS
    if unknown:
        raise _invalid(f'Invalid JSON payload received. Unknown name "{min(unknown)}": '
                       "Cannot find field.")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _invalid("* GenerateContentRequest.contents: contents is not specified")
    for i, content in enumerate(contents):
        if not isinstance(content, dict) or content.get("role", "user") not in ("user", "model"):
            raise _invalid(f"contents[{i}].role: Please use a valid role: user, model.")
        _check_parts(content.get("parts"), f"contents[{i}]",
                     thinking=thinking and content.get("role") == "model")
    if "systemInstruction" in body:
        _check_parts((body["systemInstruction"] or {}).get("parts"), "systemInstruction")
    config = body.get("generationConfig") or {}
    if unknown := set(config) - _GENERATION_FIELDS:
        raise _invalid(f'Invalid JSON payload received. Unknown name "{min(unknown)}" at '
                       "'generation_config': Cannot find field.")
    for tool in body.get("tools") or ():
        for declaration in tool.get("functionDeclarations") or ():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}", declaration.get("name", "")):
                raise _invalid("tools[0].function_declarations: invalid function name")


def _texts(parts: list[dict[str, Any]]) -> str:
    out = []
    for part in parts:
        if "text" in part:
            out.append(str(part["text"]))
        elif "inlineData" in part:
            out.append(f"[{part['inlineData']['mimeType']}]")
        elif "functionCall" in part:
            out.append(orjson.dumps(part["functionCall"]).decode())
        elif "functionResponse" in part:
            out.append(orjson.dumps(part["functionResponse"]).decode())
    return " ".join(out)


@attrs.define(eq=False, kw_only=True)
class FakeGemini:
    """The fake's state and controls; it is also the ASGI app.

    Attributes:
        base_url: "http://HOST:PORT" once serving.
        api_key: the only Gemini API key accepted (any non-empty key when None).
        max_input_tokens: prompts above this are refused as too long (the real message).
        token_lifetime_s: ``expires_in`` of the access tokens ``/token`` issues.
        chunk_delay_s: pause between streamed chunks.
        stream_error_after: cut streams with an ``error`` event after this many chunks.
        requests: every request, in order; token_requests: how many hit ``/token``.
    """

    base_url: str = ""
    api_key: str | None = None
    max_input_tokens: int = 100_000
    token_lifetime_s: int = 3600
    chunk_delay_s: float = 0.0
    #: Streams end with a 429 error event after this many chunks (as Google sends one).
    stream_error_after: int | None = None
    record_requests: bool = True
    requests: list[ReceivedRequest] = attrs.Factory(list)
    token_requests: int = 0
    _accounts: dict[str, rsa.RSAPublicKey] = attrs.Factory(dict)
    _tokens: dict[str, float] = attrs.Factory(dict)  # access token -> expiry
    _failures: collections.deque[tuple[int, str]] = attrs.Factory(collections.deque)
    #: Claude on Vertex AI answers as the Anthropic fake does.
    _anthropic: FakeUpstream = attrs.Factory(FakeUpstream)

    def fail_next(self, n: int = 1, status: int = 500, *, message: str = "injected failure"
                  ) -> None:
        """Answer the next ``n`` model requests with ``status`` in Google's error shape."""
        self._failures.extend([(status, message)] * n)

    def service_account(self, email: str = "gateway@test-project.iam.gserviceaccount.com"
                        ) -> dict[str, Any]:
        """A new service-account JSON whose key ``/token`` trusts (``token_uri`` here)."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_id = secrets.token_hex(8)
        self._accounts[email] = key.public_key()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        return {"type": "service_account", "project_id": "test-project",
                "private_key_id": key_id, "private_key": pem, "client_email": email,
                "client_id": "1", "token_uri": f"{self.base_url}/token"}

    # ----------------------------------------------------------------- ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (raw := await http_body(scope, receive, send)) is None:
            return
        try:
            await self._handle(scope, raw, receive, send)
        except HTTPError as error:
            status = error.status
            body = {"error": {"code": status, "message": error.message,
                              "status": _STATUS_NAMES.get(status, "UNKNOWN")}}
            await send_json(send, status, body)

    async def _handle(self, scope: Scope, raw: bytes, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        path = scope["path"]
        if path == "/token":
            await self._token(raw, send)
            return
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        if "/publishers/anthropic/" not in path:  # Anthropic's fields are snake_case
            body = camel_fields(body)  # recorded as understood
        if self.record_requests:
            self.requests.append(ReceivedRequest(method=scope["method"], path=path, query=query,
                                                 headers=headers, json=body))
        if scope["method"] != "POST":
            raise HTTPError(404, f"no route {scope['method']} {path}")
        if match := _GEMINI.match(path):
            key = headers.get("x-goog-api-key") or query.get("key")
            if not key or (self.api_key is not None and key != self.api_key):
                raise HTTPError(400, "API key not valid. Please pass a valid API key.")
            model, method = match.group(1), match.group(2)
        elif match := _VERTEX.match(path) or _VERTEX_ANTHROPIC.match(path):
            bearer = headers.get("authorization", "").removeprefix("Bearer ")
            if self._tokens.get(bearer, 0) <= time.time():
                raise HTTPError(401, "Request had invalid authentication credentials.")
            model, method = match.group(3), match.group(4)
        else:
            raise HTTPError(404, f"no route POST {path}")
        if not isinstance(body, dict):
            raise _invalid("Invalid JSON payload received.")
        if self._failures:
            status, message = self._failures.popleft()
            raise HTTPError(status, message)
        if method in ("rawPredict", "streamRawPredict"):
            await self._claude(model, body, receive, send, stream=method == "streamRawPredict")
        elif method in ("generateContent", "streamGenerateContent"):
            check_request(body, thinking=model.startswith("gemini-3"))
            stream = method == "streamGenerateContent"
            if stream and query.get("alt") != "sse":
                raise _invalid("this fake streams only with alt=sse")
            await self._generate(model, body, send, receive, stream=stream)
        elif method in ("embedContent", "batchEmbedContents", "predict"):
            await self._embed(model, method, body, send)
        else:
            raise HTTPError(404, f"method {method} not found")

    async def _claude(self, model: str, body: dict[str, Any], receive: Receive, send: Send,
                      *, stream: bool) -> None:
        """Anthropic's Messages API as Vertex AI serves it: the model in the URL only."""
        if body.get("anthropic_version") != "vertex-2023-10-16":
            raise _invalid("anthropic_version: must be vertex-2023-10-16")
        if "model" in body:
            raise _invalid("model: Extra inputs are not permitted")
        if bool(body.get("stream")) != stream:
            raise _invalid("stream must be true for streamRawPredict, absent for rawPredict")
        await self._anthropic._messages({**body, "model": model}, receive, send)

    async def _token(self, raw: bytes, send: Send) -> None:
        self.token_requests += 1
        form = {k: v[-1] for k, v in parse_qs(raw.decode()).items()}
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            await send_json(send, 400, {"error": "unsupported_grant_type"})
            return
        try:
            head, claims_b64, signature = form["assertion"].split(".")
            header = orjson.loads(base64.urlsafe_b64decode(_pad(head)))
            claims = orjson.loads(base64.urlsafe_b64decode(_pad(claims_b64)))
            key = self._accounts[claims["iss"]]
            key.verify(base64.urlsafe_b64decode(_pad(signature)),
                       f"{head}.{claims_b64}".encode(), padding.PKCS1v15(), hashes.SHA256())
            assert header["alg"] == "RS256"
            assert claims["aud"] == GOOGLE_TOKEN_AUDIENCE
            assert claims["exp"] > time.time() > claims["iat"] - 300
        except Exception:
            await send_json(send, 400, {"error": "invalid_grant",
                                         "error_description": "Invalid JWT Signature."})
            return
        token = "ya29.fake-" + secrets.token_urlsafe(16)
        self._tokens[token] = time.time() + self.token_lifetime_s
        await send_json(send, 200, {"access_token": token, "expires_in": self.token_lifetime_s,
                                     "token_type": "Bearer"})

    async def _generate(self, model: str, body: dict[str, Any], send: Send, receive: Receive,
                        *, stream: bool) -> None:
        messages = [{"role": "user" if c.get("role", "user") == "user" else "assistant",
                     "content": _texts(c["parts"])} for c in body["contents"]]
        system = _texts((body.get("systemInstruction") or {}).get("parts") or [])
        config = body.get("generationConfig") or {}
        calling = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
        declarations = [d for t in body.get("tools") or () for d in
                        t.get("functionDeclarations") or ()]
        tool = None
        if declarations and calling.get("mode") == "ANY":
            tool = (calling.get("allowedFunctionNames") or [declarations[0]["name"]])[0]
        reply = make_reply(model=model, messages=messages, system=system or None,
                           max_tokens=config.get("maxOutputTokens"), tool=tool)
        if reply.input_tokens > self.max_input_tokens:
            raise _invalid(f"The input token count ({reply.input_tokens}) exceeds the maximum "
                           f"number of tokens allowed ({self.max_input_tokens}).")
        finish = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP"}[reply.finish]
        usage = {"promptTokenCount": reply.input_tokens,
                 "candidatesTokenCount": reply.output_tokens,
                 "totalTokenCount": reply.input_tokens + reply.output_tokens}
        ident = hashlib.sha256(orjson.dumps(body)).hexdigest()[:20]
        parts: list[dict[str, Any]] = []
        if reply.tool_call is not None:
            signature = base64.b64encode(hashlib.sha256(reply.tool_call[2].encode()).digest())
            parts.append({"functionCall": {"name": reply.tool_call[1],
                                           "args": orjson.loads(reply.tool_call[2])},
                          "thoughtSignature": signature.decode()})
        elif reply.text:
            parts.append({"text": reply.text})

        def response(chunk_parts: list[dict[str, Any]], reason: str | None,
                     metadata: dict[str, Any]) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": chunk_parts},
                                         "index": 0}
            if reason:
                candidate["finishReason"] = reason
            return {"candidates": [candidate], "usageMetadata": metadata,
                    "modelVersion": model, "responseId": ident}

        if not stream:
            await send_json(send, 200, response(parts, finish, usage))
            return
        pieces: list[list[dict[str, Any]]] = (
            [[p] for p in parts] if reply.tool_call is not None
            else [[{"text": t}] for t in _text_pieces(reply.text)])
        so_far = {"promptTokenCount": reply.input_tokens, "totalTokenCount": reply.input_tokens}
        events = [response(piece, None, so_far) for piece in pieces[:-1]]
        events.append(response(pieces[-1] if pieces else [{"text": ""}], finish, usage))
        if self.stream_error_after is not None:
            events = events[:self.stream_error_after]
            events.append({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
                                     "message": "Resource has been exhausted."}})
        await send_events(send, receive,
                          [b"data: " + orjson.dumps(e) + b"\r\n\r\n" for e in events],
                          self.chunk_delay_s)

    async def _embed(self, model: str, method: str, body: dict[str, Any], send: Send) -> None:
        if method == "predict":
            instances = body.get("instances")
            if not isinstance(instances, list) or not instances:
                raise _invalid("instances: required")
            size = (body.get("parameters") or {}).get("outputDimensionality")
            predictions = [{"embeddings": {
                "values": _embedding(f"{model}\0{i['content']}", size or EMBEDDING_DIMENSIONS),
                "statistics": {"token_count": len(str(i["content"]).split()),
                               "truncated": False}}} for i in instances]
            await send_json(send, 200, {"predictions": predictions})
            return
        requests = body.get("requests") if method == "batchEmbedContents" else [body]
        if not isinstance(requests, list) or not requests:
            raise _invalid("requests: required")
        vectors = []
        for request in requests:
            if set(request) - {"model", "content", "taskType", "title", "outputDimensionality"}:
                raise _invalid("Invalid JSON payload received. Unknown name.")
            content = request.get("content") or {}
            _check_parts(content.get("parts"), "content")
            size = request.get("outputDimensionality") or EMBEDDING_DIMENSIONS
            vectors.append({"values": _embedding(f"{model}\0{_texts(content['parts'])}", size)})
        answer = {"embedding": vectors[0]} if method == "embedContent" else {"embeddings": vectors}
        await send_json(send, 200, answer)


@contextlib.asynccontextmanager
async def open_fake_gemini(host: str = "127.0.0.1", port: int = 0, **settings: Any
                           ) -> AsyncIterator[FakeGemini]:
    """Serve a :class:`FakeGemini` in a nursery of the caller's task; stop on exit."""
    async with serving(FakeGemini(**settings), host, port) as fake:
        yield fake


def main(argv: list[str] | None = None) -> None:
    """``python -m triogate.testing.fakegemini --port N``: serve until Ctrl-C."""
    serve_main(__doc__.split("\n")[0], open_fake_gemini, argv)


if __name__ == "__main__":
    main()
