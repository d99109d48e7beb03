"""The Bedrock fake checked by AWS's own SDK (boto3's ``bedrock-runtime`` client).

boto3 signs every request (the fake verifies it with botocore's signer), sends Converse,
ConverseStream and InvokeModel as the service model says, and parses the fake's JSON and
binary event stream with its own parser: if the fake and the SDK disagree, these fail.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import boto3
import orjson
import pytest
import trio
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError

from triogate.testing.fakebedrock import open_fake_bedrock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from triogate.testing.fakebedrock import FakeBedrock

pytestmark = [pytest.mark.integration]

MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhg"
                       "GAWjR9awAAAABJRU5ErkJggg==")


@pytest.fixture
async def fake() -> AsyncIterator[FakeBedrock]:
    async with open_fake_bedrock(session_token="session-token") as server:
        yield server


def runtime(fake: FakeBedrock, secret: str | None = None) -> Any:
    return boto3.client(
        "bedrock-runtime", endpoint_url=fake.base_url, region_name=fake.region,
        aws_access_key_id=fake.access_key_id,
        aws_secret_access_key=secret or fake.secret_access_key,
        aws_session_token=fake.session_token,
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))


async def _in_thread(fn: Any) -> Any:
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(fn)


async def test_converse_with_an_image_and_usage(fake: FakeBedrock) -> None:
    def run() -> Any:
        return runtime(fake).converse(
            modelId=MODEL, system=[{"text": "Be brief."}],
            messages=[{"role": "user", "content": [
                {"text": "what is this"},
                {"image": {"format": "png", "source": {"bytes": PNG}}}]}],
            inferenceConfig={"maxTokens": 30, "temperature": 0.1})

    reply = await _in_thread(run)
    text = reply["output"]["message"]["content"][0]["text"]
    assert text.startswith(f"Fake reply from {MODEL}.") and "[image/png]" in text
    assert reply["stopReason"] == "end_turn"
    usage = reply["usage"]
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"] > 0
    path, headers, body = fake.requests[-1]
    assert path == "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    assert base64.b64decode(body["messages"][0]["content"][1]["image"]["source"]["bytes"]) == PNG
    assert fake.verified == 1 and headers["x-amz-security-token"] == "session-token"


async def test_converse_stream_events(fake: FakeBedrock) -> None:
    def run() -> list[dict[str, Any]]:
        reply = runtime(fake).converse_stream(
            modelId=MODEL, messages=[{"role": "user", "content": [{"text": "stream please"}]}])
        return list(reply["stream"])

    events = await _in_thread(run)
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    text = "".join(e["contentBlockDelta"]["delta"]["text"] for e in events
                   if "contentBlockDelta" in e)
    assert text.endswith("You said: stream please")
    assert events[-1]["metadata"]["usage"]["outputTokens"] == len(text.split())


async def test_converse_tool_use_and_result(fake: FakeBedrock) -> None:
    tools = {"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}}],
        "toolChoice": {"any": {}}}

    def run() -> tuple[Any, Any, list[Any]]:
        client = runtime(fake)
        question = {"role": "user", "content": [{"text": "weather in Lima"}]}
        first = client.converse(modelId=MODEL, messages=[question], toolConfig=tools)
        use = first["output"]["message"]["content"][0]["toolUse"]
        second = client.converse(modelId=MODEL, toolConfig={"tools": tools["tools"]}, messages=[
            question, first["output"]["message"],
            {"role": "user", "content": [{"toolResult": {
                "toolUseId": use["toolUseId"], "content": [{"json": {"temp_c": 19}}]}}]}])
        streamed = list(client.converse_stream(modelId=MODEL, messages=[question],
                                               toolConfig=tools)["stream"])
        return first, second, streamed

    first, second, streamed = await _in_thread(run)
    assert first["stopReason"] == "tool_use"
    use = first["output"]["message"]["content"][0]["toolUse"]
    assert use["name"] == "get_weather" and use["input"] == {"query": "weather in Lima"}
    assert second["stopReason"] == "end_turn"
    start = next(e["contentBlockStart"] for e in streamed if "contentBlockStart" in e)
    assert start["start"]["toolUse"]["name"] == "get_weather"
    pieces = "".join(e["contentBlockDelta"]["delta"]["toolUse"]["input"] for e in streamed
                     if "contentBlockDelta" in e)
    assert orjson.loads(pieces) == {"query": "weather in Lima"}


async def test_invoke_model_embeddings(fake: FakeBedrock) -> None:
    def run() -> tuple[Any, Any]:
        client = runtime(fake)
        titan = client.invoke_model(modelId="amazon.titan-embed-text-v2:0",
                                    body=orjson.dumps({"inputText": "hello there",
                                                       "dimensions": 4}))
        cohere = client.invoke_model(modelId="cohere.embed-english-v3", body=orjson.dumps(
            {"texts": ["a", "b"], "input_type": "search_document"}))
        return orjson.loads(titan["body"].read()), orjson.loads(cohere["body"].read())

    titan, cohere = await _in_thread(run)
    assert len(titan["embedding"]) == 4 and titan["inputTextTokenCount"] == 2
    assert len(cohere["embeddings"]) == 2


async def test_errors_as_aws_sends_them(fake: FakeBedrock) -> None:
    fake.fail_next(1, "ThrottlingException", message="Too many requests, please wait.")

    def run(secret: str | None = None) -> Any:
        try:
            runtime(fake, secret).converse(
                modelId=MODEL, messages=[{"role": "user", "content": [{"text": "hi"}]}])
        except ClientError as exc:
            return exc.response
        raise AssertionError("no error")

    throttled = await _in_thread(run)
    assert throttled["Error"]["Code"] == "ThrottlingException"
    assert throttled["ResponseMetadata"]["HTTPStatusCode"] == 429
    bad = await _in_thread(lambda: run("not-the-secret"))
    assert bad["Error"]["Code"] == "InvalidSignatureException"
    assert bad["ResponseMetadata"]["HTTPStatusCode"] == 403


async def test_a_conversation_must_start_with_the_user(fake: FakeBedrock) -> None:
    def run() -> Any:
        try:
            runtime(fake).converse(modelId=MODEL, messages=[
                {"role": "assistant", "content": [{"text": "I speak first"}]}])
        except ClientError as exc:
            return exc.response
        raise AssertionError("no error")

    refused = await _in_thread(run)
    assert refused["Error"]["Code"] == "ValidationException"
    assert "alternate" in refused["Error"]["Message"]


async def test_an_exception_mid_stream_reaches_boto3(fake: FakeBedrock) -> None:
    fake.stream_exception_after = 3

    def run() -> tuple[list[Any], Any]:
        reply = runtime(fake).converse_stream(
            modelId=MODEL, messages=[{"role": "user", "content": [{"text": "go on"}]}])
        seen: list[Any] = []
        try:
            for event in reply["stream"]:
                seen.append(event)
        except EventStreamError as exc:
            return seen, exc.response
        raise AssertionError("no error")

    seen, error = await _in_thread(run)
    assert len(seen) == 3
    assert error["Error"]["Code"] == "throttlingException"
    assert "Too many tokens" in error["Error"]["Message"]
