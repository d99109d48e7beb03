"""A complete (non-streamed) answer is written before its request settles (issue 13,
goal 4): settlement's ~0.2 ms of work (post-call declarations, the cache entry, the
spend-log row, metrics) is no longer between the upstream's answer and the client's.
It still happens exactly once, in the same task and before anything else runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
import pytest
import trio

from .conftest import MASTER_KEY, short_request, spend_rows

if TYPE_CHECKING:
    from triogate.batch import PostCallBatch

    from .conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _request(body: dict[str, object], port: int) -> bytes:
    raw = orjson.dumps(body)
    return (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
            b"authorization: Bearer %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (port, MASTER_KEY.encode(), len(raw), raw))


async def test_the_answer_is_on_the_clients_socket_before_the_request_settles(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch,
) -> None:
    settler = gateway.services.settler
    port = int(gateway.url.rsplit(":", 1)[1])
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    readable_at_settlement: list[bool] = []
    submit = settler.submit_nowait

    def watched(batch: PostCallBatch) -> None:
        if batch.commands:  # the request's settlement (budgets, routing, cache)
            readable_at_settlement.append(stream.socket.is_readable())
        submit(batch)

    monkeypatch.setattr(settler, "submit_nowait", watched)
    async with stream:
        with trio.fail_after(20):
            await stream.send_all(_request(short_request("chat", "answer me first"), port))
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += await stream.receive_some(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert readable_at_settlement == [True]
    (row,) = await spend_rows(gateway, 1)  # settled once, as a success
    assert row.status == "success"
