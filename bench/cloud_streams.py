"""Per-chunk CPU of a streamed answer through each provider, side by side.

    python bench/cloud_streams.py                 # the provider layer, in this process
    python bench/cloud_streams.py --gateway       # the whole gateway, one worker

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

With ``--gateway`` the same three upstream bodies are served by a separate process
(this script's ``--serve-upstream``, answering as many chunks as the request's token
limit asks) to a gateway started with ``python -m triogate serve`` (one worker, Redis
on loopback, master key: no governance), and the gateway process's CPU (user + system,
psutil) is measured around ``--streams`` streamed chat completions read to the end by
this process, for each upstream in turn.
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
from triogate.providers.gemini import GeminiProvider
from triogate.providers.openai import OpenAIProvider
from triogate.testing.asgi import answer_lifespan, hypercorn_config, read_body
from triogate.testing.fakebedrock import encode_message

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


# --------------------------------------------------------------------------- whole gateway


def _chunks_asked(path: str, body: dict[str, Any]) -> tuple[str, int]:
    if path.endswith("/chat/completions"):
        return "openai", int(body.get("max_tokens") or 10)
    if path.endswith(":streamGenerateContent"):
        return "gemini", int((body.get("generationConfig") or {}).get("maxOutputTokens") or 10)
    return "bedrock", int((body.get("inferenceConfig") or {}).get("maxTokens") or 10)


async def upstream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """ASGI: a stream in the wire format the path names, of as many chunks as asked."""
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    raw = await read_body(receive)
    kind, chunks = _chunks_asked(scope["path"], orjson.loads(raw))
    make, content_type = BODIES[kind]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", content_type.encode())]})
    for piece in make(chunks):  # one write each, as a model's tokens come
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def serve_upstream(port: int) -> None:
    from hypercorn.trio import serve

    trio.run(serve, upstream_app, hypercorn_config("127.0.0.1", port))


def gateway_runs(a: argparse.Namespace) -> list[dict[str, Any]]:
    import shutil
    import tempfile

    import load_procs as procs
    import yaml

    work = Path(tempfile.mkdtemp(prefix="tg-cloud-streams-"))
    logs = work / "logs"
    logs.mkdir()
    redis, rport = procs.start_redis(logs)
    uport = procs.free_port()
    upstream = procs.Proc.start("upstream", [sys.executable, __file__, "--serve-upstream",
                                             str(uport)], logs)
    procs.wait_tcp(uport, upstream)
    base = f"http://127.0.0.1:{uport}"
    aws = {"aws_access_key_id": "AK", "aws_secret_access_key": "SK",
           "aws_region_name": "us-east-1"}
    models = [
        {"model_name": "openai", "litellm_params": {"model": "openai/m", "api_key": "k",
                                                    "api_base": f"{base}/v1"}},
        {"model_name": "gemini", "litellm_params": {"model": "gemini/m", "api_key": "k",
                                                    "api_base": f"{base}/v1beta"}},
        {"model_name": "bedrock", "litellm_params": {"model": "bedrock/m", "api_base": base,
                                                     **aws}},
    ]
    config = work / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": models, "general_settings": {"master_key": "sk-bench"},
        "triogate": {"state_dir": str(work / "state"), "max_in_flight": 0}}))
    gateway = None
    rows = []
    try:
        gateway, url = procs.start_gateway(logs, config=config, workers=1,
                                           redis_url=f"redis://127.0.0.1:{rport}",
                                           name="gateway")
        (worker,) = procs.gateway_workers(gateway, 1)
        headers = {"authorization": "Bearer sk-bench"}
        counter = 0

        def streams(http: httpx.Client, model: str, chunks: int) -> float:
            nonlocal counter
            started = procs.cpu_s([worker])
            for _ in range(a.streams):
                counter += 1  # a new prompt each time: never a cached answer
                body = {"model": model, "stream": True, "max_tokens": chunks,
                        "messages": [{"role": "user", "content": f"go {counter}"}]}
                with http.stream("POST", f"{url}/v1/chat/completions", json=body,
                                 headers=headers) as response:
                    assert response.status_code == 200, response.read()
                    for _ in response.iter_raw():
                        pass
            return procs.cpu_s([worker]) - started

        with httpx.Client(timeout=60) as http:
            for model in ("openai", "gemini", "bedrock"):
                streams(http, model, 5)  # warm-up: connections, scripts
            reference = None
            for model in ("openai", "gemini", "bedrock"):
                best = float("inf")
                for _ in range(a.repeats):
                    long_s = streams(http, model, a.chunks)
                    short_s = streams(http, model, a.base_chunks)
                    best = min(best, (long_s - short_s)
                               / (a.streams * (a.chunks - a.base_chunks)))
                reference = best if model == "openai" else reference
                assert reference is not None
                rows.append({"api": "chat (whole gateway)", "provider": model,
                             "us_per_chunk": round(best * 1e6, 2),
                             "ratio": round(best / reference, 2)})
    finally:
        if gateway is not None:
            gateway.stop()
        upstream.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--chunks", type=int, default=400)
    p.add_argument("--base-chunks", type=int, default=20)
    p.add_argument("--streams", type=int, default=50)
    p.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--gateway", action="store_true", help="measure the whole gateway")
    p.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_upstream is not None:
        serve_upstream(a.serve_upstream)
        return 0
    rows = gateway_runs(a) if a.gateway else []
    for api in () if a.gateway else ("chat", "messages"):
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
