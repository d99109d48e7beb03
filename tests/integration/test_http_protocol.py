"""The gateway's HTTP server (``triogate.server``) at the protocol's edges, over raw sockets:
malformed requests (400), heads too large (431), requests that stop arriving (408), all in
the gateway's JSON shape with an ``x-request-id``; HEAD, HTTP/1.0, ``Connection: close``,
pipelining, ``Expect: 100-continue``, bodies in many reads, ``receive()`` as ASGI says
(``http.disconnect`` when the client leaves mid-response and after the response), and an
application that fails (500, no stack trace)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import trio

from triogate.api.protocol_errors import error_body
from triogate.server import ServerConfig, serve
from triogate.server._connection import Connection

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration


class App:
    """Echoes the body; ``/stream`` streams until the client leaves; records events."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.disconnected = trio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope["path"]
        if path == "/boom":
            raise RuntimeError("secret internals")
        if path == "/stream":
            await self._stream(receive, send)
            return
        if path == "/ticks":  # a short stream that listens for the client leaving
            await self._stream(receive, send, pause_s=0, ticks=2)
            return
        if path == "/flood":  # as fast as the socket takes it
            await self._stream(receive, send, chunk=b"x" * 65536, pause_s=0)
            return
        if path == "/early":  # answers without reading the body (a 413 does so)
            await send({"type": "http.response.start", "status": 413,
                        "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"no"})
            return
        if path == "/nocontent":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.events.append("disconnect")
                return
            body += message["body"]
            if not message["more_body"]:
                break
        answer = b"%b %b %b %b" % (scope["method"].encode(), path.encode(),
                                   scope["query_string"], body)
        if path == "/names":  # the request's header names, once its body is in
            answer = b",".join(name for name, _ in scope["headers"])
        headers = [(b"content-length", b"%d" % len(answer))]
        if path == "/close":
            headers.append((b"connection", b"close"))
        if path == "/inject":
            headers.append((b"x-bad", b"a\r\nset-cookie: x"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})
        self.events.append((await receive())["type"])  # after the response: disconnect

    async def _stream(self, receive: Any, send: Any, *, chunk: bytes = b"tick\n",
                      pause_s: float = 0.02, ticks: int = -1) -> None:
        async with trio.open_nursery() as nursery:
            async def watch() -> None:
                message = await receive()
                while message["type"] != "http.disconnect":
                    message = await receive()
                self.events.append("stream disconnect")
                self.disconnected.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            while ticks:
                ticks -= 1
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await trio.sleep(pause_s)
            nursery.cancel_scope.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.fixture
async def gateway(nursery: trio.Nursery) -> AsyncIterator[tuple[App, int]]:
    shutdown = trio.Event()
    application = App()
    config = ServerConfig(body_read_timeout_s=0.3, write_timeout_s=0.5, error_body=error_body)
    (url,) = await nursery.start(partial(serve, application, config, shutdown=shutdown))
    yield application, int(url.rsplit(":", 1)[1])
    shutdown.set()


async def exchange(port: int, request: bytes, *, eof: bool = False) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        if eof:
            await stream.send_eof()
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


def assert_error(answer: bytes, status: int) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    assert b"\r\nx-request-id: " in head and b"\r\nconnection: close" in head
    assert b"content-type: application/json" in head
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"


async def test_malformed_requests_are_400_and_oversized_heads_431(
    gateway: tuple[App, int],
) -> None:
    _, port = gateway
    with trio.fail_after(20):
        for bad in (b"NOT HTTP\r\n\r\n", b"GET / HTTP/1.1\r\nhost: t\r\nbad header\r\n\r\n",
                    b"GET / HTTP/9.9\r\n\r\n",
                    b"POST / HTTP/1.1\r\n"
                    b"host: t\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabc"):
            assert_error(await exchange(port, bad), 400)
        big = b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n"
        assert_error(await exchange(port, big), 431)
        # A head over the limit that arrives whole in one read, and one that never ends.
        assert_error(await exchange(port, b"GET / HTTP/1.1\r\nhost: t\r\nx: " + b"a" * 20_000
                                    + b"\r\n\r\n"), 431)
        assert_error(await exchange(port, b"GET / HTTP/1.1\r\nhost: t\r\nx: " + b"a" * 20_000), 431)
        # The connection was closed after each: the next request is a new one, served.
        assert (await exchange(port, b"GET /ok HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
                ).endswith(b"GET /ok  ")


async def test_a_request_without_one_host_is_400_and_never_runs(
    gateway: tuple[App, int],
) -> None:
    # RFC 9112 3.2: an HTTP/1.1 request must carry exactly one Host; two could name one
    # host to a front proxy and another to us. HTTP/1.0 needs none.
    application, port = gateway
    with trio.fail_after(20):
        for bad in (b"GET /ok HTTP/1.1\r\n\r\n",
                    b"GET /ok HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
                    b"GET /ok HTTP/1.0\r\nhost: a\r\nHost: a\r\n\r\n",
                    # the second of two pipelined requests: the first is still answered
                    b"GET /ok HTTP/1.1\r\nhost: a\r\n\r\nGET /ok HTTP/1.1\r\n\r\n"):
            answer = await exchange(port, bad)
            assert_error(answer[answer.rfind(b"HTTP/1.1 400 "):], 400)
            assert b"Host header" in answer  # says what was wrong
            assert answer.count(b"GET /ok") == bad.count(b"host: a\r\n\r\n")
        answer = await exchange(port, b"GET /ok HTTP/1.0\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"GET /ok  ")
    assert len(application.events) == 2  # the app ran for the two served requests only


async def test_a_request_that_stops_arriving_is_408(gateway: tuple[App, int]) -> None:
    application, port = gateway
    with trio.fail_after(20):
        for partial_request in (b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\nabc",
                                b"POST / HTTP/1.1\r\nhost: t\r\ncontent-le"):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(partial_request)
            started = trio.current_time()
            answer = b""
            while chunk := await stream.receive_some(65536):
                answer += chunk
            assert 0.2 < trio.current_time() - started < 2
            assert_error(answer, 408)
            await stream.aclose()
        assert application.events == ["disconnect"]  # the app saw the body's client leave


async def test_head_http_1_0_and_connection_close(gateway: tuple[App, int]) -> None:
    _, port = gateway
    with trio.fail_after(20):
        head = await exchange(port, b"HEAD /h HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
        assert b"content-length: 9\r\n" in head  # as declared; no body bytes follow
        old = await exchange(port, b"GET /old?x=1 HTTP/1.0\r\n\r\n")  # closed after it
        assert old.startswith(b"HTTP/1.1 200") and old.endswith(b"GET /old x=1 ")
        assert b"connection: close" in old
        closing = await exchange(port, b"GET /close HTTP/1.1\r\nhost: t\r\n\r\n")  # the app closes
        assert closing.endswith(b"GET /close  ") and b"connection: close" in closing
        assert closing.count(b"HTTP/1.1") == 1


async def test_pipelined_requests_are_answered_in_order(gateway: tuple[App, int]) -> None:
    _, port = gateway
    requests = (b"GET /1 HTTP/1.1\r\nhost: t\r\n\r\n"
                b"POST /2 HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nhello"
                b"POST /3 HTTP/1.1\r\n"
                b"host: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                b"GET /4 HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
    with trio.fail_after(20):
        answer = await exchange(port, requests)
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in answer.split(b"HTTP/1.1 200 OK\r\n")[1:]]
    assert bodies == [b"GET /1  ", b"POST /2  hello", b"POST /3  abc", b"GET /4  "]


async def test_expect_continue_and_a_body_in_many_reads(gateway: tuple[App, int]) -> None:
    _, port = gateway
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        body = b"x" * 300_000
        await stream.send_all(b"POST /big HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\n"
                              b"content-length: %d\r\n\r\n" % len(body))
        assert await stream.receive_some(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        for i in range(0, len(body), 7000):
            await stream.send_all(body[i:i + 7000])
        answer = b""
        while not answer.endswith(body):
            answer += await stream.receive_some(65536)
        assert answer.startswith(b"HTTP/1.1 200")
        await stream.aclose()


async def test_a_client_gone_mid_stream_is_a_disconnect_for_the_app(
    gateway: tuple[App, int],
) -> None:
    application, port = gateway
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        seen = b""
        while seen.count(b"tick") < 3:
            seen += await stream.receive_some(65536)
        assert b"transfer-encoding: chunked" in seen
        await stream.aclose()
        await application.disconnected.wait()
    assert application.events == ["stream disconnect"]


async def test_receive_after_the_response_is_a_disconnect(gateway: tuple[App, int]) -> None:
    application, port = gateway
    with trio.fail_after(20):
        await exchange(port, b"POST /x HTTP/1.1\r\n"
                             b"host: t\r\ncontent-length: 2\r\n\r\nhi", eof=True)
    assert application.events == ["http.disconnect"]


async def test_a_failing_app_is_a_500_without_its_traceback(gateway: tuple[App, int]) -> None:
    _, port = gateway
    with trio.fail_after(20):
        for path in (b"/boom", b"/inject"):  # raised, or a header that splits the response
            answer = await exchange(port, b"GET %b HTTP/1.1\r\nhost: t\r\n\r\n" % path)
            assert answer.startswith(b"HTTP/1.1 500")
            assert b"secret" not in answer and b"Traceback" not in answer
            assert b"set-cookie" not in answer
            assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["error"]["type"] == "api_error"


async def test_targets_bodiless_answers_and_an_http_1_0_stream(gateway: tuple[App, int]) -> None:
    application, port = gateway
    with trio.fail_after(20):
        answer = await exchange(port, b"GET http://gw.example/abs?q=1 HTTP/1.1\r\nhost: t\r\n\r\n"
                                      b"GET /a%20b HTTP/1.1\r\nhost: t\r\n\r\n"
                                      b"GET /nocontent HTTP/1.1\r\nhost: t\r\n\r\n"
                                      b"GET /last HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        first, second, third, last = answer.split(b"HTTP/1.1 ")[1:]
        assert first.endswith(b"GET /abs q=1 ") and second.endswith(b"GET /a b  ")
        assert third.startswith(b"204 No Content\r\n") and third.endswith(b"\r\n\r\n")
        assert b"content-length" not in third and b"transfer-encoding" not in third
        assert last.endswith(b"GET /last  ")
        # HTTP/1.0 has no chunked encoding: the stream's end is the connection's.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /stream HTTP/1.0\r\n\r\n")
        seen = b""
        while seen.count(b"tick") < 3:
            seen += await stream.receive_some(65536)
        head, _, body = seen.partition(b"\r\n\r\n")
        assert b"transfer-encoding" not in head and b"connection: close" in head
        assert body.startswith(b"tick\ntick\n")
        await stream.aclose()
        await application.disconnected.wait()


async def test_a_client_that_stops_reading_is_gone_after_the_write_timeout(
    gateway: tuple[App, int],
) -> None:
    application, port = gateway
    with trio.fail_after(20):
        sock = trio.socket.socket()
        sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
        await sock.connect(("127.0.0.1", port))
        stream = trio.SocketStream(sock)
        await stream.send_all(b"GET /flood HTTP/1.1\r\nhost: t\r\n\r\n")
        # Never read: once the socket is full, a write waits 0.5 s, then the server
        # treats the client as gone and the app's receive() says so.
        await application.disconnected.wait()
        assert application.events == ["stream disconnect"]
        await stream.aclose()


async def test_read_ahead_is_bounded_and_a_client_gone_is_still_noticed(
    gateway: tuple[App, int],
) -> None:
    application, port = gateway
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        seen = b""
        while b"tick" not in seen:
            seen += await stream.receive_some(65536)
        # 2.4 MB of further requests while the stream runs: the server reads ahead at
        # most 64 KiB of them, then stops reading until the response ends, so the
        # client's sending stalls once the kernel's buffers are full (backpressure).
        with trio.move_on_after(1) as stalled:
            await stream.send_all(b"GET /next HTTP/1.1\r\nhost: t\r\n\r\n" * 100_000)
        assert stalled.cancelled_caught
        await stream.aclose()  # gone: its writes fail, and the app hears of it
        await application.disconnected.wait()
    assert application.events == ["stream disconnect"]


async def test_a_head_trickled_a_byte_at_a_time_is_408_at_the_bound(
    gateway: tuple[App, int],
) -> None:
    # Slowloris: each byte comes well within the timeout (0.3 s), the whole head would take
    # 4 s. The bound runs from the head's first byte, so the answer is 408 after ~0.3 s.
    _, port = gateway
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        request = b"GET / HTTP/1.1\r\nhost: t\r\nx-slow: " + b"a" * 40 + b"\r\n\r\n"
        started = trio.current_time()
        answer = b""
        async with trio.open_nursery() as nursery:
            async def trickle() -> None:
                for byte in request:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.1)

            nursery.start_soon(trickle)
            while chunk := await stream.receive_some(65536):
                answer += chunk
            nursery.cancel_scope.cancel()
        assert trio.current_time() - started < 1.5
        assert_error(answer, 408)
        await stream.aclose()


async def test_upgrade_offers_are_served_as_plain_http_and_connect_is_400(
    gateway: tuple[App, int], caplog: pytest.LogCaptureFixture,
) -> None:
    _, port = gateway
    h2c = (b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
           b"http2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n")
    close = b"GET /next HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
    with trio.fail_after(20):
        # An upgrade offer is ignored (RFC 9110 7.8): the request is served with its body
        # (llhttp stops at an upgrade request's head), and the connection goes on.
        for framing, body in ((b"content-length: 3", b"abc"),
                              (b"transfer-encoding: chunked", b"3\r\nabc\r\n0\r\n\r\n")):
            answer = await exchange(port, b"POST /h2c HTTP/1.1\r\nhost: t\r\n%b%b\r\n\r\n%b%b"
                                          % (h2c, framing, body, close))
            first, second = answer.split(b"HTTP/1.1 200 OK\r\n")[1:]
            assert first.endswith(b"POST /h2c  abc") and second.endswith(b"GET /next  ")
        # The body in a later read than the head.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /late HTTP/1.1\r\n"
                              b"host: t\r\n%bcontent-length: 3\r\n\r\n" % h2c)
        await trio.sleep(0.05)
        await stream.send_all(b"xyz" + close)
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
        await stream.aclose()
        assert b"POST /late  xyz" in answer and answer.endswith(b"GET /next  ")
        answer = await exchange(port, b"GET /ws HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\n"
                                      b"upgrade: websocket\r\n\r\n" + close)
        assert answer.count(b"HTTP/1.1 200 ") == 2 and answer.endswith(b"GET /next  ")
        # A tunnel, and an absolute-form target that is no URL: 400 (not the app's 500,
        # nothing logged as the app's error), and nothing after them is read.
        for bad in (b"CONNECT evil:443 HTTP/1.1\r\nhost: evil:443\r\n\r\n" + close,
                    b"GET http:// HTTP/1.1\r\nhost: t\r\n\r\n" + close):
            answer = await exchange(port, bad)
            assert_error(answer, 400)
            assert answer.count(b"HTTP/1.1 ") == 1
    assert "error in ASGI application" not in caplog.text


async def test_a_transfer_coding_other_than_chunked_is_501(gateway: tuple[App, int]) -> None:
    # llhttp frames ``gzip, chunked`` as chunked: the app would get a body still coded,
    # and a proxy in front may frame it otherwise. Refused, the body never reaches the app.
    application, port = gateway
    with trio.fail_after(20):
        for coding in (b"gzip, chunked", b"gzip\r\ntransfer-encoding: chunked"):
            answer = await exchange(port, b"POST /x HTTP/1.1\r\n"
                                          b"host: t\r\ntransfer-encoding: %b\r\n\r\n"
                                          b"3\r\nabc\r\n0\r\n\r\nGET /y HTTP/1.1\r\n"
                                          b"host: t\r\n\r\n" % coding)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 501 ") and b"connection: close" in head
            assert answer.count(b"HTTP/1.1 ") == 1
            assert orjson.loads(body)["error"]["message"].startswith("transfer coding")
        # Chunked in any case is what it says.
        answer = await exchange(port, b"POST /x HTTP/1.1\r\n"
                                      b"host: t\r\ntransfer-encoding: Chunked\r\n"
                                      b"connection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        assert answer.endswith(b"POST /x  abc")
    assert application.events == ["http.disconnect"]


async def test_a_path_escaping_bytes_that_are_not_utf_8_is_served(
    gateway: tuple[App, int],
) -> None:
    # ``/%ff`` decodes to U+FFFD (hypercorn's and uvicorn's choice), a str the app can
    # encode: it was a surrogate escape, and the gateway's 500 on any path.
    _, port = gateway
    with trio.fail_after(20):
        answer = await exchange(port, b"GET /v1/%ff%20x HTTP/1.1\r\n"
                                      b"host: t\r\nconnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert answer.endswith("GET /v1/\ufffd x  ".encode())


async def test_an_answer_before_the_body_is_in_says_the_connection_closes(
    gateway: tuple[App, int],
) -> None:
    application, port = gateway
    with trio.fail_after(20):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /early HTTP/1.1\r\n"
                              b"host: t\r\ncontent-length: 100000\r\n\r\nabc")
        answer = b""
        while chunk := await stream.receive_some(65536):
            answer += chunk
            if answer.endswith(b"no"):
                # Told before the close, so that it sends no further request on it.
                assert b"\r\nconnection: close\r\n" in answer
        assert answer.startswith(b"HTTP/1.1 413 ") and answer.endswith(b"no")
        await stream.aclose()
    assert application.events == []


async def _pipeline(port: int, requests: bytes) -> bytes:
    """Send ``requests`` at once (then one with ``connection: close``) while reading all
    the answers."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    chunks = []
    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_all,
                           requests + b"GET /end HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        while chunk := await stream.receive_some(1 << 20):
            chunks.append(chunk)
    received = b"".join(chunks)
    assert received.endswith(b"GET /end  ")
    return received


async def test_pipelined_requests_split_across_reads_are_not_a_431(
    gateway: tuple[App, int],
) -> None:
    # 64 KiB reads of small pipelined requests end inside a head: only that head's bytes
    # count toward its 16 KiB, not the whole read.
    _, port = gateway
    request = b"GET /p HTTP/1.1\r\nhost: t\r\nx-pad: %b\r\ncontent-length: 0\r\n\r\n" % (b"p" * 100)
    with trio.fail_after(20):
        answer = await _pipeline(port, request * 3000)
    assert answer.count(b"HTTP/1.1 200 ") == 3001 and b" 431 " not in answer


async def test_requests_read_ahead_stay_bounded_over_many_streamed_answers(
    gateway: tuple[App, int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each streamed answer reads the client's next requests (to notice it leaving), at
    # most max_pipelined_bytes of them; those not yet answered count against the next
    # answer's allowance. Without that, each answer read 64 KiB more: a client pipelining
    # streams grew the queue of parsed requests without bound.
    peak = 0
    real = Connection.on_message_begin

    def counted(self: Connection) -> None:
        nonlocal peak
        real(self)
        peak = max(peak, len(self._queue))

    monkeypatch.setattr(Connection, "on_message_begin", counted)
    _, port = gateway
    request = b"GET /ticks HTTP/1.1\r\nhost: t\r\n\r\n"
    with trio.fail_after(30):
        answer = await _pipeline(port, request * 20_000)
    assert answer.count(b"HTTP/1.1 200 ") == 20_001
    # One read before the first answer, the allowance, one read past it (64 KiB each).
    assert peak <= 3 * 65536 // len(request) + 1, peak


async def test_a_bad_body_the_app_never_read_gets_no_second_answer(
    gateway: tuple[App, int],
) -> None:
    # The head and a malformed chunk arrive in one read; the app answers without reading
    # the body. Its answer is the only one (a stray 400 after it would be taken for the
    # answer to the next request the client pipelined).
    _, port = gateway
    with trio.fail_after(20):
        answer = await exchange(port, b"POST /early HTTP/1.1\r\n"
                                      b"host: t\r\ntransfer-encoding: chunked"
                                      b"\r\n\r\nzz\r\nabc\r\nGET /next HTTP/1.1\r\nhost: t\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413 ") and answer.endswith(b"no")
    assert answer.count(b"HTTP/1.1 ") == 1


async def test_trailers_are_dropped_and_bounded(gateway: tuple[App, int]) -> None:
    # Trailers after a chunked body are not the request's headers (the app holds those
    # already), and count against the head's 16 KiB: unbounded, a client grew the list
    # by hundreds of MB a second.
    application, port = gateway
    with trio.fail_after(20):
        answer = await exchange(port, b"POST /names HTTP/1.1\r\n"
                                      b"host: t\r\ntransfer-encoding: chunked\r\n"
                                      b"connection: close\r\n\r\n3\r\nabc\r\n0\r\n"
                                      b"authorization: Bearer smuggled\r\n\r\n")
        assert answer.endswith(b"\r\n\r\nhost,transfer-encoding,connection")
        answer = await exchange(port, b"POST /names HTTP/1.1\r\n"
                                      b"host: t\r\ntransfer-encoding: chunked\r\n"
                                      b"\r\n3\r\nabc\r\n0\r\n" + b"x-t: 1\r\n" * 3000)
        assert_error(answer, 431)
    assert application.events == ["http.disconnect"]  # the refused one never ran


async def test_what_follows_a_request_that_closes_is_ignored(gateway: tuple[App, int]) -> None:
    # llhttp refuses bytes after a request that ends the connection; they were answered
    # with a stray 400, which the client would take for its next request's answer.
    _, port = gateway
    with trio.fail_after(20):
        for request in (b"GET /c HTTP/1.1\r\n"
                        b"host: t\r\nconnection: close\r\n\r\nGET /y HTTP/1.1\r\nhost: t\r\n\r\n",
                        b"POST /c HTTP/1.0\r\ncontent-length: 2\r\n\r\nhiGARBAGE\r\n\r\n"):
            answer = await exchange(port, request)
            assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 200 ")
            assert b"\r\nconnection: close\r\n" in answer
