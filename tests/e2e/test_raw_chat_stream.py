"""A chat stream for a chat client forwards the upstream's own event bytes
(``providers/rawsse.py``): the client gets what the general path (parse, translate,
``api/sse.encode``) sent before, byte for byte, and usage is counted the same.

Each scenario runs twice through one gateway, over real HTTP, against a scripted upstream
on loopback (its bytes and how they are cut into reads are the scenario): once on the raw
path, once with it switched off (the old path), and the two client byte streams compare
equal.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import orjson
import pytest
import trio

from tests.e2e.conftest import (
    gateway_config,
    leave_mid_stream,
    running_gateway,
    spend_rows,
    streamed,
)
from triogate.providers import upstream as upstream_module

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.e2e.conftest import Gateway
    from tests.e2e.scripted_upstream import Scripted
    from triogate.batch import RespBackend

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

BASE = {"id": "chatcmpl-raw1", "object": "chat.completion.chunk", "created": 1700000000,
        "model": "gpt-up-a"}


def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({**BASE, "choices": [choice]}) + b"\n\n"


USAGE = b"data: " + orjson.dumps({**BASE, "choices": [], "usage": {
    "prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}}) + b"\n\n"
DONE = b"data: [DONE]\n\n"
CONTENT = [chunk({"role": "assistant", "content": ""})] + [
    chunk({"content": text}) for text in
    ("Once", " upon a time", ", \u00e9l\u00e8ve \u2603", ' "quoted"\n', " \\ end", "")]
FINISH = chunk({}, "stop")
REALISTIC = b"".join(CONTENT) + FINISH + USAGE + DONE


@pytest.fixture
async def gateway(tmp_path: Path, redis: RespBackend, redis_url: str,
                  scripted: Scripted) -> AsyncIterator[Gateway]:
    config = gateway_config(tmp_path / "state", redis_url, f"http://127.0.0.1:{scripted.port}")
    with trio.fail_after(60):
        async with running_gateway(config) as gw:
            yield gw


class _Never:
    """Stands in for ChatPassthrough in ``providers/upstream.py``: the raw path is off."""


async def _stream(gateway: Gateway, *, include_usage: bool, raw: bool,
                  monkeypatch: pytest.MonkeyPatch) -> bytes:
    body = {"model": "gpt-test", "stream": True, "max_tokens": 50,
            "messages": [{"role": "user", "content": "a story"}]}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    with monkeypatch.context() as patch:
        if not raw:
            patch.setattr(upstream_module, "ChatPassthrough", _Never)
        return await streamed(f"{gateway.openai_base}/chat/completions", body)


async def _both(gateway: Gateway, monkeypatch: pytest.MonkeyPatch, *,
                include_usage: bool) -> tuple[bytes, bytes]:
    old = await _stream(gateway, include_usage=include_usage, raw=False,
                        monkeypatch=monkeypatch)
    new = await _stream(gateway, include_usage=include_usage, raw=True,
                        monkeypatch=monkeypatch)
    return old, new


def _splits(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("cut", ["events", "bytes_7", "one_read"])
async def test_raw_output_is_the_encoded_output(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch,
    include_usage: bool, cut: str,
) -> None:
    events = [*CONTENT, FINISH, USAGE, DONE]
    scripted.pieces = {"events": events, "bytes_7": _splits(REALISTIC, 7),
                       "one_read": [REALISTIC]}[cut]
    scripted.gap_s = 0.002
    old, new = await _both(gateway, monkeypatch, include_usage=include_usage)
    assert new == old
    assert new.endswith(b"\n\n" + DONE)
    assert (USAGE in new) == include_usage
    assert new.startswith(CONTENT[0])


async def test_a_stream_without_usage_gets_the_counted_usage_chunk(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.pieces = [*CONTENT, FINISH + DONE]
    old, new = await _both(gateway, monkeypatch, include_usage=True)
    created = re.compile(rb'"created":\d+')  # the added chunk's own time (seconds)
    assert created.sub(b"", new) == created.sub(b"", old)
    last = orjson.loads(new.split(b"\n\n")[-3][6:])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("error", [
    b'data: {"error": {"message": "upstream broke", "type": "server_error"}}\n\n',
    b"data: {not json\n\n",
    b'data: ["a list"]\n\n',
])
async def test_an_upstream_error_mid_stream_ends_it_the_same_way(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch, error: bytes
) -> None:
    scripted.pieces = [*CONTENT[:3], error, FINISH, DONE]
    # One event per read: the old path dropped events that came in the same read as an
    # error object (its burst loop raised before writing them); the raw path sends them.
    scripted.gap_s = 0.05
    old, new = await _both(gateway, monkeypatch, include_usage=False)
    assert new == old
    assert new.startswith(b"".join(CONTENT[:3]))
    assert b'"error"' in new.split(b"\n\n")[-2]
    assert not new.endswith(DONE)


async def test_other_sse_forms_and_crlf_are_parsed_as_before(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    spaced = b"data: " + orjson.dumps({**BASE, "choices": [
        {"index": 0, "delta": {"content": " two"}, "finish_reason": None}]}) + b"\n\n"
    scripted.pieces = [
        b": keep-alive\n\n" + CONTENT[0],
        b"event: message\nid: 7\n" + CONTENT[1],  # fields before the data line
        b"data: {\"id\": \"chatcmpl-raw1\",\ndata: " + spaced[7:],  # two data lines
        b"\n\n\n" + CONTENT[2],
        (FINISH + USAGE).replace(b"\n", b"\r\n"),  # CR LF from here on
        DONE.replace(b"\n", b"\r\n"),
    ]
    old, new = await _both(gateway, monkeypatch, include_usage=True)
    assert new == old
    assert new.count(b"data: ") == 7  # 3 content, the joined one, finish, usage, [DONE]


async def test_a_client_gone_mid_stream_is_charged_the_same(
    gateway: Gateway, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.pieces = CONTENT[:5]
    scripted.hang = True
    body = {"model": "gpt-test", "stream": True, "max_tokens": 50,
            "messages": [{"role": "user", "content": "a story"}]}
    for raw in (False, True):
        with monkeypatch.context() as patch:
            if not raw:
                patch.setattr(upstream_module, "ChatPassthrough", _Never)
            # every chunk the upstream sent arrived: go away
            seen = await leave_mid_stream(f"{gateway.openai_base}/chat/completions", body, 5)
            assert seen == b"".join(CONTENT[:5])
            with trio.fail_after(20):
                while scripted.gone < (2 if raw else 1):  # the upstream stream was dropped
                    await trio.sleep(0.01)
    new, old = await spend_rows(gateway, 2)  # newest first
    assert new.status == old.status == "cancelled"
    assert new.output_tokens == old.output_tokens > 0
    assert new.input_tokens == old.input_tokens
    assert new.cost_nanousd == old.cost_nanousd > 0
