"""A complete (non-streamed) answer is written before its request settles:
settlement's ~0.2 ms of work (post-call declarations, the cache entry, the
spend-log row, metrics) is no longer between the upstream's (or the cache's) answer and
the client's. It still happens exactly once, in the same task, before anything else runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
import pytest
import trio

from .conftest import MASTER_KEY, gateway_config, running_gateway, short_request, spend_rows

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.store.records import SpendLogRow
    from triogate.testing.fakeupstream import FakeUpstream

    from .conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _request(body: dict[str, object], port: int) -> bytes:
    raw = orjson.dumps(body)
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
            b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (port, MASTER_KEY.encode(), len(raw), raw))


async def _answered_before_settled(gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
                                   body: dict[str, object]) -> list[bool]:
    """POST ``body`` on a raw connection; for each spend-log row the request's settlement
    submits, whether the answer was already readable on the client's socket."""
    spend_logs = gateway.services.spend_logs
    assert spend_logs is not None
    port = int(gateway.url.rsplit(":", 1)[1])
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    readable: list[bool] = []
    submit = spend_logs.submit_nowait

    def watched(row: SpendLogRow) -> None:
        readable.append(stream.socket.is_readable())
        submit(row)

    monkeypatch.setattr(spend_logs, "submit_nowait", watched)
    async with stream:
        with trio.fail_after(20):
            await stream.send_all(_request(body, port))
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += await stream.receive_some(65536)
    monkeypatch.undo()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    return readable


async def test_the_answer_is_on_the_clients_socket_before_the_request_settles(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = short_request("chat", "answer me first")
    assert await _answered_before_settled(gateway, monkeypatch, body) == [True]
    (row,) = await spend_rows(gateway, 1)  # settled once, as a success
    assert row.status == "success"


async def test_a_cache_hit_is_written_before_it_settles(
    tmp_path: Path, redis_url: str, upstream: FakeUpstream, redis: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = gateway_config(tmp_path / "state", redis_url, upstream.base_url,
                            litellm_settings={"cache": True, "cache_params": {"ttl": 60}})
    body = short_request("chat", "cache me, then answer me first")
    with trio.fail_after(60):
        async with running_gateway(config) as gateway:
            assert await _answered_before_settled(gateway, monkeypatch, body) == [True]
            await gateway.services.settler.wait_drained()  # the cache entry is written
            assert await _answered_before_settled(gateway, monkeypatch, body) == [True]
            rows = await spend_rows(gateway, 2)
    assert sorted(r.cache_hit for r in rows) == [False, True]
    assert {r.status for r in rows} == {"success"}
