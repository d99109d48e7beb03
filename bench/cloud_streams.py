"""Per-chunk CPU of a streamed answer through each provider, side by side.

    python bench/cloud_streams.py                 # prints a table; --out writes JSON

Each provider's stream pipeline (upstream body -> parse -> translate -> the client's
events, each encoded as the gateway writes it) is driven in this process against an
upstream body prepared in memory (``httpx.MockTransport``, no sockets), so that only the
provider layer is measured: an OpenAI-compatible chat stream (SSE; to a chat client the
bytes go on untouched, to a messages client they are translated), a Gemini stream (SSE,
``streamGenerateContent?alt=sse``) and a Bedrock ConverseStream (AWS's binary event
stream). Every stream answers ``--chunks`` content chunks of one word, or
``--base-chunks``; the CPU per chunk is the difference of the two runs over the
difference in chunks (the request's fixed cost cancels out). The ratio column is each
row against the OpenAI-compatible stream to the same client API.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio

from triogate.config import parse_config
from triogate.providers.bedrock import BedrockProvider
from triogate.providers.bedrock_eventstream import encode_message
from triogate.providers.gemini import GeminiProvider
from triogate.providers.openai import OpenAIProvider

BODY = {"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "go"}]}


def openai_body(chunks: int) -> list[bytes]:
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": f" word{i}"}) for i in range(chunks)]
    out.append(chunk({}, "stop"))
    usage = {"prompt_tokens": 3, "completion_tokens": chunks, "total_tokens": 3 + chunks}
    out.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n")
    return [*out, b"data: [DONE]\n\n"]


def gemini_body(chunks: int) -> list[bytes]:
    out = []
    for i in range(chunks):
        event: dict[str, Any] = {"candidates": [{"content": {"role": "model", "parts": [
            {"text": f" word{i}"}]}, "index": 0}], "usageMetadata": {
            "promptTokenCount": 3, "totalTokenCount": 3}, "modelVersion": "m",
            "responseId": "r"}
        if i == chunks - 1:
            event["candidates"][0]["finishReason"] = "STOP"
            event["usageMetadata"] = {"promptTokenCount": 3, "candidatesTokenCount": chunks,
                                      "totalTokenCount": 3 + chunks}
        out.append(b"data: " + orjson.dumps(event) + b"\r\n\r\n")
    return out


def bedrock_body(chunks: int) -> list[bytes]:
    def event(kind: str, payload: dict[str, Any]) -> bytes:
        return encode_message({":event-type": kind, ":content-type": "application/json",
                               ":message-type": "event"}, orjson.dumps(payload))

    out = [event("messageStart", {"role": "assistant"})]
    out += [event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": f" word{i}"}})
            for i in range(chunks)]
    out += [event("contentBlockStop", {"contentBlockIndex": 0}),
            event("messageStop", {"stopReason": "end_turn"}),
            event("metadata", {"usage": {"inputTokens": 3, "outputTokens": chunks,
                                         "totalTokens": 3 + chunks}, "metrics": {}})]
    return out


BODIES = {"openai": (openai_body, "text/event-stream"),
          "gemini": (gemini_body, "text/event-stream"),
          "bedrock": (bedrock_body, "application/vnd.amazon.eventstream")}


def client_for(kind: str, chunks: int) -> httpx.AsyncClient:
    make, content_type = BODIES[kind]
    pieces = make(chunks)

    async def body() -> Any:
        for piece in pieces:
            yield piece

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": content_type}, content=body())

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def deployments() -> dict[str, Any]:
    aws = {"aws_access_key_id": "AK", "aws_secret_access_key": "SK",
           "aws_region_name": "us-east-1"}
    config = parse_config({"model_list": [
        {"model_name": "openai", "litellm_params": {"model": "openai/m", "api_key": "k",
                                                    "api_base": "http://upstream/v1"}},
        {"model_name": "gemini", "litellm_params": {"model": "gemini/m", "api_key": "k",
                                                    "api_base": "http://upstream/v1beta"}},
        {"model_name": "bedrock", "litellm_params": {"model": "bedrock/m",
                                                     "api_base": "http://upstream", **aws}},
    ]})
    return {d.group: d for d in config.deployments}


async def run(kind: str, api: str, chunks: int, streams: int) -> tuple[float, int]:
    """CPU seconds of ``streams`` streams of ``chunks`` chunks, and the events handed out."""
    deployment = deployments()[kind]
    body: dict[str, Any] = dict(BODY)
    async with client_for(kind, chunks) as client:
        provider: Any = {"openai": lambda: OpenAIProvider(client),
                         "gemini": lambda: GeminiProvider(client, vertex=False),
                         "bedrock": lambda: BedrockProvider(client)}[kind]()
        events = 0
        started = time.process_time()
        for _ in range(streams):
            async with provider.stream(api, body, deployment) as stream:
                async for event in stream:
                    wire = stream.wire
                    if wire is None:  # encoded as the gateway writes a translated event
                        wire = b"data: " + orjson.dumps(event) + b"\n\n"
                    events += 1
        return time.process_time() - started, events


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=400)
    p.add_argument("--base-chunks", type=int, default=20)
    p.add_argument("--streams", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    rows = []
    for api in ("chat", "messages"):
        reference = None
        for kind in ("openai", "gemini", "bedrock"):
            best = float("inf")
            for _ in range(a.repeats):
                long_s, _ = trio.run(run, kind, api, a.chunks, a.streams)
                short_s, _ = trio.run(run, kind, api, a.base_chunks, a.streams)
                best = min(best, (long_s - short_s) / (a.streams * (a.chunks - a.base_chunks)))
            reference = best if kind == "openai" else reference
            assert reference is not None
            rows.append({"api": api, "provider": kind, "us_per_chunk": round(best * 1e6, 2),
                         "ratio": round(best / reference, 2)})
    print("| client API | upstream | CPU per chunk (us) | vs OpenAI-compatible |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['api']} | {row['provider']} | {row['us_per_chunk']} | "
              f"{row['ratio']}x |")
    if a.out is not None:
        a.out.write_bytes(orjson.dumps({"args": vars(a) | {"out": str(a.out)}, "rows": rows},
                                       option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
