"""The own server's verdict on hostile requests, each next to h11's (hypercorn's parser) on
the same bytes.

For every case the same bytes go to the own server over a real socket and to an
``h11.Connection`` in pieces of the size a server reads; each verdict is the statuses a
server answers with (200 for a request served, the error status otherwise). Where the two
differ, the case says why: the own server is stricter wherever a request could be framed
two ways (request smuggling) or holds bytes no client needs to send.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import h11
import pytest
import trio

from triogate.api.protocol_errors import error_body
from triogate.server import ServerConfig, serve

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration

HEAD = b"POST / HTTP/1.1\r\nhost: t\r\n"
CHUNKED = HEAD + b"transfer-encoding: chunked\r\n\r\n"


@attrs.frozen
class Case:
    data: bytes
    ours: tuple[int, ...]
    h11: tuple[int, ...]
    why: str = ""  # why the verdicts differ, when they do


CASES = {
    "content-length with transfer-encoding": Case(
        HEAD + b"content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        (400,), (200,), "h11 lets chunked win; a proxy in front may take the length"),
    "duplicate content-length, same value": Case(
        HEAD + b"content-length: 5\r\ncontent-length: 5\r\n\r\nhello",
        (400,), (200,), "h11 merges equal values; llhttp refuses any second one"),
    "duplicate content-length, two values": Case(
        HEAD + b"content-length: 5\r\ncontent-length: 6\r\n\r\nhello!", (400,), (400,)),
    "content-length as a list": Case(
        HEAD + b"content-length: 5, 5\r\n\r\nhello", (400,), (200,),
        "h11 takes a list of equal values; a length is one number"),
    "content-length with a sign": Case(HEAD + b"content-length: +5\r\n\r\nhello", (400,), (400,)),
    "obs-fold": Case(b"GET / HTTP/1.1\r\nhost: t\r\nx-a: one\r\n two\r\n\r\n", (400,), (200,),
                     "RFC 9112 5.2 lets a server refuse it; h11 unfolds it"),
    "bare LF line ends": Case(b"GET / HTTP/1.1\nhost: t\n\n", (400,), (200,),
                              "RFC 9112 2.2 lets a server refuse it; h11 accepts it"),
    "chunk size not hex": Case(CHUNKED + b"zz\r\nhello\r\n0\r\n\r\n", (400,), (400,)),
    "chunk size with 0x": Case(CHUNKED + b"0x5\r\nhello\r\n0\r\n\r\n", (400,), (400,)),
    "chunk size with _": Case(CHUNKED + b"1_0\r\nhello\r\n0\r\n\r\n", (400,), (400,)),
    "negative chunk size": Case(CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n", (400,), (400,)),
    "huge chunk size": Case(CHUNKED + b"fffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
                            (400,), (408,), "h11 takes a size of 2**76 bytes and waits for "
                            "them; llhttp refuses a size past 64 bits at once"),
    "chunk data longer than its size": Case(CHUNKED + b"5\r\nhelloXX0\r\n\r\n", (400,), (400,)),
    "chunk extension": Case(CHUNKED + b"5;name=value\r\nhello\r\n0\r\n\r\n", (200,), (200,)),
    "chunk extension of 20 KiB": Case(
        CHUNKED + b"5;a=" + b"b" * 20_000 + b"\r\nhello\r\n0\r\n\r\n", (200,), (200,)),
    "chunk extension of 1 MB": Case(
        CHUNKED + b"5;a=" + b"b" * 1_000_000 + b"\r\nhello\r\n0\r\n\r\n", (400,), (431,),
        "both refuse it: h11 as a line past its 16 KiB buffer, the own server as framing "
        "out of proportion to the body (64 KiB of slack)"),
    "NUL in a header value": Case(b"GET / HTTP/1.1\r\nhost: t\r\nx-a: a\x00b\r\n\r\n",
                                  (400,), (400,)),
    "NUL in a header name": Case(b"GET / HTTP/1.1\r\nhost: t\r\nx\x00a: ab\r\n\r\n",
                                 (400,), (400,)),
    "space before the colon": Case(b"GET / HTTP/1.1\r\nhost: t\r\nx-a : b\r\n\r\n",
                                   (400,), (400,)),
    "transfer-encoding chunked twice": Case(
        HEAD + b"transfer-encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        (400,), (501,), "both refuse it; llhttp as malformed, h11 as not implemented"),
    "transfer-encoding gzip": Case(HEAD + b"transfer-encoding: gzip\r\n\r\n", (501,), (501,)),
    "pipelined requests with bodies": Case(
        HEAD + b"content-length: 5\r\n\r\nhello" + HEAD + b"content-length: 5\r\n\r\nworld",
        (200, 200), (200, 200)),
    "the HTTP/2 preface": Case(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", (400,), (200, 400),
                               "h11 parses 'PRI *' as a request, then fails on SM; hypercorn "
                               "switches to HTTP/2 there, the own server speaks HTTP/1.1 only"),
    "HTTP/2.0 in a request line": Case(
        b"GET / HTTP/2.0\r\nhost: t\r\n\r\n", (505,), (200,),
        "h11 hands the application a request of HTTP version 2.0"),
}


def h11_verdict(data: bytes, piece: int = 4096) -> tuple[int, ...]:
    """What a server on h11 answers to ``data`` read ``piece`` bytes at a time (408 for
    a request it is still waiting the rest of)."""
    conn = h11.Connection(h11.SERVER)
    statuses: list[int] = []
    try:
        for start in range(0, len(data), piece):
            conn.receive_data(data[start:start + piece])
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA or event is h11.PAUSED:
                    break
                if isinstance(event, h11.EndOfMessage):
                    statuses.append(200)
                    conn.send(h11.Response(status_code=200,
                                           headers=[("content-length", "0")]))
                    conn.send(h11.EndOfMessage())
                    conn.start_next_cycle()
    except h11.RemoteProtocolError as exc:
        statuses.append(exc.error_status_hint)
        return tuple(statuses)
    if conn.their_state is not h11.IDLE:  # a request not all here: it waits, then times out
        statuses.append(408)
    return tuple(statuses)


async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the body; answers 200, or 401 at once for ``/auth`` (as a key check does)."""
    if scope["path"] != "/auth":
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            if not message["more_body"]:
                break
    status = 401 if scope["path"] == "/auth" else 200
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})


@pytest.fixture
async def port(nursery: trio.Nursery) -> AsyncIterator[int]:
    shutdown = trio.Event()
    config = ServerConfig(keep_alive_s=0.3, body_read_timeout_s=0.5, error_body=error_body)
    (url,) = await nursery.start(partial(serve, echo, config, shutdown=shutdown))
    yield int(url.rsplit(":", 1)[1])
    shutdown.set()


async def answers(port: int, data: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        received = b""
        with trio.fail_after(10):  # the server closes: after an error, or idle
            while chunk := await stream.receive_some(65536):
                received += chunk
    return received


def statuses_in(received: bytes) -> tuple[int, ...]:
    return tuple(int(line.split(b" ")[1]) for line in received.split(b"\r\n")
                 if line.startswith(b"HTTP/1.1 "))


@pytest.mark.parametrize("name", list(CASES))
async def test_a_hostile_request_against_h11s_verdict(port: int, name: str) -> None:
    case = CASES[name]
    assert h11_verdict(case.data) == case.h11
    assert statuses_in(await answers(port, case.data)) == case.ours
    assert (case.ours == case.h11) == (not case.why)


async def test_expect_continue_gets_no_100_before_an_answer_without_the_body(port: int) -> None:
    data = HEAD.replace(b"POST / ", b"POST /auth ") + (
        b"expect: 100-continue\r\ncontent-length: 5\r\n\r\n")
    received = await answers(port, data)
    assert statuses_in(received) == (401,)
    assert b" 100 " not in received
    # h11 agrees that the final answer may come without a 100 first.
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    assert isinstance(conn.next_event(), h11.Request)
    assert conn.they_are_waiting_for_100_continue
    conn.send(h11.Response(status_code=401, headers=[("content-length", "0")]))
    assert not conn.they_are_waiting_for_100_continue
