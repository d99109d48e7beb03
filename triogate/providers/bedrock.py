"""Amazon Bedrock (``bedrock/<model id>``, ``bedrock/converse/<model id>``) as an upstream.

(``bedrock/invoke/<model id>`` is accepted too and goes through Converse as well.)

Chat, messages and Responses API requests go through Converse (``/model/{id}/converse``)
and ConverseStream (``/converse-stream``, AWS's binary event stream); embeddings through
InvokeModel for Titan and Cohere models. Every request is signed with SigV4
(:mod:`.sigv4`) from the deployment's AWS credentials; throttling is a 429, so the
router's cooldown applies as for any provider.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from triogate.errors import ProviderProtocolError
from triogate.providers import bridge
from triogate.providers.bedrock_eventstream import EventStreamDecoder
from triogate.providers.chunk_source import ChunkSource
from triogate.providers.cloud_errors import cloud_errors
from triogate.providers.http import (
    SHAPE_ERRORS,
    egress_of,
    open_sse_response,
    post_json,
    reply_shape,
)
from triogate.providers.records import Completion, Usage
from triogate.providers.sigv4 import AwsCredentials, sign
from triogate.providers.streaming import check_streamable
from triogate.providers.tokens import estimate_input_tokens
from triogate.providers.translate_bedrock import (
    ConverseToChat,
    chat_to_converse_request,
    cohere_body,
    cohere_vectors,
    converse_to_chat_response,
    converse_usage,
    embedding_family,
    titan_body,
)
from triogate.providers.translate_gemini import embedding_inputs, embeddings_response

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Mapping

    import httpx

    from triogate.config import Deployment
    from triogate.providers.records import Api, ProviderStream

SERVICE = "bedrock"
EVENT_STREAM = "application/vnd.amazon.eventstream"


class EventStreamSource(ChunkSource[dict[str, Any]]):
    """ConverseStream's events decoded from a streaming response, as dicts.

    An event is ``{event type: payload}`` (boto3's shape); an exception message is
    ``{"exception": type, "message": text}``.
    """

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(response)
        self._decoder = EventStreamDecoder()

    def _feed(self, chunk: bytes) -> None:
        for message in self._decoder.feed(chunk):
            self._pending.append(self._event(message.headers, message.payload))

    def _close(self) -> None:
        self._ended = True
        self._decoder.close()

    @staticmethod
    def _event(headers: Mapping[str, Any], payload: bytes) -> dict[str, Any]:
        kind = headers.get(":message-type")
        try:
            body = orjson.loads(payload) if payload else {}
        except orjson.JSONDecodeError as exc:
            raise ProviderProtocolError(
                f"event-stream payload is not JSON: {payload[:200]!r}") from exc
        if kind == "event":
            return {str(headers.get(":event-type")): body}
        if kind == "exception":
            message = body.get("message") if isinstance(body, dict) else None
            return {"exception": headers.get(":exception-type"), "message": message}
        return {"exception": headers.get(":error-code", "error"),
                "message": headers.get(":error-message")}

    async def next_event(self) -> dict[str, Any] | None:
        """The next event (a checkpoint). Raises ProviderError subclasses."""
        return await self._next_item()

    def next_nowait(self) -> dict[str, Any] | None:
        return self._pending.popleft() if self._pending else None


def _model_id(deployment: Deployment) -> str:
    """The model id (or ARN) without LiteLLM's route prefix: ``converse/`` and
    ``invoke/`` models are both called through Converse here."""
    model = deployment.upstream_model
    for prefix in ("converse/", "invoke/"):
        model = model.removeprefix(prefix)
    return model


class BedrockProvider:
    """Calls Bedrock Runtime's Converse, ConverseStream and InvokeModel.

    Args:
        client: the pooled client shared by every Bedrock deployment.
        clock: wall-clock seconds (SigV4's timestamp, ``created`` fields).
    """

    def __init__(self, client: httpx.AsyncClient, *,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._clock = clock

    @staticmethod
    def _url(deployment: Deployment, action: str) -> str:
        cloud = deployment.cloud
        assert cloud is not None and cloud.aws_region_name
        base = deployment.api_base or f"https://bedrock-runtime.{cloud.aws_region_name}.amazonaws.com"
        return f"{base.rstrip('/')}/model/{quote(_model_id(deployment), safe='')}/{action}"

    def _signed(self, deployment: Deployment, url: str, body: bytes,
                accept: str = "application/json") -> dict[str, str]:
        cloud = deployment.cloud
        assert cloud is not None and cloud.aws_access_key_id and cloud.aws_secret_access_key
        credentials = AwsCredentials(access_key_id=cloud.aws_access_key_id,
                                     secret_access_key=cloud.aws_secret_access_key,
                                     session_token=cloud.aws_session_token)
        now = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC)
        headers = sign("POST", url, {"content-type": "application/json", "accept": accept},
                       body, credentials=credentials, region=str(cloud.aws_region_name),
                       service=SERVICE, now=now)
        del headers["host"]  # the transport writes it from the URL, as signed
        return headers

    async def _post(self, deployment: Deployment, action: str,
                    request: dict[str, Any]) -> dict[str, Any]:
        url = self._url(deployment, action)
        headers = self._signed(deployment, url, orjson.dumps(request))
        with cloud_errors():
            return await post_json(self._client, url, headers=headers, body=request,
                                   timeout_s=deployment.timeout_s, egress=egress_of(deployment))

    async def complete(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> Completion:
        """One call (a checkpoint). Raises ProviderError subclasses, or ValueError."""
        if api == "embeddings":
            return await self._embed(body, deployment)
        request = chat_to_converse_request(bridge.chat_request(api, body))
        response = await self._post(deployment, "converse", request)
        created_s = int(self._clock())
        with reply_shape():
            usage = converse_usage(response.get("usage"))
            chat = converse_to_chat_response(
                response, model=_model_id(deployment), created_s=created_s,
                usage=usage or Usage(input_tokens=0, output_tokens=0),
                ident=hashlib.sha256(orjson.dumps(response)).hexdigest()[:24])
            return bridge.answer(api, chat, request=body, usage=usage, created_s=created_s)

    def stream(
        self, api: Api, body: Mapping[str, Any], deployment: Deployment
    ) -> contextlib.AbstractAsyncContextManager[ProviderStream]:
        """A ConverseStream, translated to ``api``'s events.

        Raises:
            ValueError: at once, for embeddings, or a request Converse cannot express.
        """
        check_streamable(api)
        request = chat_to_converse_request(bridge.chat_request(api, body))
        return self._open(api, body, request, deployment)

    @contextlib.asynccontextmanager
    async def _open(self, api: Api, body: Mapping[str, Any], request: dict[str, Any],
                    deployment: Deployment) -> AsyncIterator[ProviderStream]:
        created_s = int(self._clock())
        url = self._url(deployment, "converse-stream")
        raw = orjson.dumps(request)
        headers = self._signed(deployment, url, raw, accept=EVENT_STREAM)
        async with contextlib.AsyncExitStack() as stack:
            with cloud_errors():
                response = await stack.enter_async_context(open_sse_response(
                    self._client, url, headers=headers, body=request,
                    timeout_s=deployment.stream_timeout_s,
                    egress=egress_of(deployment)))
            ident = hashlib.sha256(raw + str(created_s).encode()).hexdigest()[:24]
            to_chat = ConverseToChat(created_s=created_s, model=_model_id(deployment),
                                     ident=ident)
            source = bridge.ChatEventSource(EventStreamSource(response), to_chat)
            yield bridge.chat_stream(api, source, request=body, created_s=created_s)

    async def _embed(self, body: Mapping[str, Any], deployment: Deployment) -> Completion:
        texts = embedding_inputs(body)
        family = embedding_family(_model_id(deployment))
        try:
            if family == "cohere":
                response = await self._post(deployment, "invoke", cohere_body(texts))
                vectors = cohere_vectors(response)
                usage = Usage(input_tokens=estimate_input_tokens("embeddings", body),
                              output_tokens=0, reported=False)
            else:  # Titan embeds one text per call
                vectors, tokens = [], 0
                for text in texts:
                    response = await self._post(deployment, "invoke",
                                                titan_body(text, body.get("dimensions")))
                    vectors.append(list(response["embedding"]))
                    tokens += int(response.get("inputTextTokenCount") or 0)
                usage = Usage(input_tokens=tokens, output_tokens=0)
        except SHAPE_ERRORS as exc:
            raise ProviderProtocolError(f"upstream embeddings reply: {exc!r}") from exc
        if len(vectors) != len(texts):
            raise ProviderProtocolError("upstream embeddings reply has the wrong count")
        out = embeddings_response(vectors, model=_model_id(deployment), usage=usage,
                                  encoding=body.get("encoding_format"))
        return Completion(body=out, usage=usage)
