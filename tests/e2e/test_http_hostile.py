"""The gateway behind its own HTTP server, as clients the protocol tests stand in for meet
it: a JDK HttpClient's ``Upgrade: h2c`` offer on a POST (served, with its body), a path
escaping bytes that are not UTF-8 (404, not a 500), and no stack trace or key in any log
line for either."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson
import pytest
import trio

from tests.e2e.conftest import MASTER_KEY, UPSTREAM_KEY

if TYPE_CHECKING:
    from tests.e2e.conftest import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

BODY = orjson.dumps({"model": "gpt-test", "max_tokens": 5,
                     "messages": [{"role": "user", "content": "a private prompt"}]})


async def exchange(gateway: Gateway, request: bytes) -> bytes:
    host, port = gateway.url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(request)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def test_a_java_clients_h2c_offer_and_a_path_that_is_not_utf_8(
    gateway: Gateway, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    auth = b"authorization: Bearer " + MASTER_KEY.encode() + b"\r\n"
    with trio.fail_after(30):
        # What java.net.http.HttpClient sends over cleartext: the body after the offer.
        answer = await exchange(gateway, (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n" + auth +
            b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
            b"http2-settings: AAEAAEAAAAIAAAABAAMAAABkAAQBAAAAAAUAAEAA\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY) + BODY
            + b"GET /health/liveliness HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"))
        first, second = answer.split(b"HTTP/1.1 200 OK\r\n")[1:]
        assert orjson.loads(first.partition(b"\r\n\r\n")[2])["object"] == "chat.completion"
        assert second.endswith(b'{"status":"alive"}')
        answer = await exchange(gateway, b"GET /v1/%ff%fe/models HTTP/1.1\r\nhost: t\r\n" + auth +
                                b"connection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 404 ")
    assert "Running on" in caplog.text  # the gateway's log lines are seen here
    assert "Traceback" not in caplog.text and "error in ASGI" not in caplog.text
    for secret in (MASTER_KEY, UPSTREAM_KEY, "a private prompt"):
        assert secret not in caplog.text
