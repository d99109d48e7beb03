"""UpstreamTransport against a real HTTP/1.1 server on loopback: framing, reuse, errors."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
import pytest
import trio

from triogate.providers.transport import UpstreamTransport, body_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.integration

Reply = Callable[[bytes], list[bytes] | None]


async def _serve(reply: Reply, stream: trio.SocketStream) -> None:
    """Answer each request on the connection with ``reply(head)``'s pieces; None closes."""
    buf = b""
    async with stream:
        while True:
            while b"\r\n\r\n" not in buf:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            while len(buf) < length:
                buf += await stream.receive_some(65536)
            buf = buf[length:]
            pieces = reply(head)
            if pieces is None:
                return
            for piece in pieces:
                if piece == b"<pause>":
                    await trio.sleep(0.5)
                elif piece == b"<close>":
                    return
                else:
                    await stream.send_all(piece)


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[Callable[[Reply], str]]:
    async def start(reply: Reply) -> str:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, functools.partial(_serve, reply), 0,
                              host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start  # type: ignore[misc]


def _client(**kw: int) -> tuple[httpx.AsyncClient, UpstreamTransport]:
    transport = UpstreamTransport(
        max_connections=kw.get("max_connections", 10), max_keepalive_connections=10,
        keepalive_expiry_s=30,
    )
    return httpx.AsyncClient(transport=transport, timeout=5), transport


def _fixed(body: bytes, extra: bytes = b"") -> list[bytes]:
    return [b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n" % (len(body), extra), body]


async def test_content_length_bodies_reuse_one_connection(server) -> None:  # type: ignore[no-untyped-def]
    url = await server(lambda head: _fixed(b'{"ok":true}'))
    client, transport = _client()
    async with client:
        for _ in range(5):
            response = await client.post(url + "/v1/x", content=b'{"a":1}')
            assert response.status_code == 200 and response.json() == {"ok": True}
    assert transport.connections_opened == 1


async def test_chunked_body_split_anywhere(server) -> None:  # type: ignore[no-untyped-def]
    raw = b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\ntrailer: x\r\n\r\n"
    pieces = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    pieces += [raw[i : i + 3] for i in range(0, len(raw), 3)]
    url = await server(lambda head: pieces)
    client, transport = _client()
    async with client:
        for _ in range(3):
            async with client.stream("POST", url, content=b"x") as response:
                assert b"".join([c async for c in response.aiter_raw()]) == b"hello world"
    assert transport.connections_opened == 1


async def test_chunks_that_arrive_together_are_read_as_one_piece(server) -> None:  # type: ignore[no-untyped-def]
    # One send: three whole chunks, the last chunk and a part of nothing else; then,
    # after a pause, two more. A stream that fell behind catches up in one piece per
    # read, and the connection is still reused.
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    burst = b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n"
    tail = b"4\r\nfour\r\n4\r\nfive\r\n0\r\n\r\n"
    url = await server(lambda _: [head + burst, b"<pause>", tail])
    client, transport = _client()
    async with client:
        for _ in range(2):
            async with client.stream("POST", url, content=b"x") as response:
                pieces = [c async for c in response.aiter_raw()]
            assert pieces == [b"onetwothree", b"fourfive"]
    assert transport.connections_opened == 1


async def test_body_to_the_end_of_the_connection(server) -> None:  # type: ignore[no-untyped-def]
    url = await server(lambda head: [b"HTTP/1.0 200 OK\r\n\r\n", b"abc", b"def", b"<close>"])
    client, transport = _client()
    async with client:
        assert (await client.get(url)).content == b"abcdef"
        assert (await client.get(url)).content == b"abcdef"
    assert transport.connections_opened == 2


async def test_connection_close_and_stale_idle_connections_are_not_reused(server) -> None:  # type: ignore[no-untyped-def]
    # The server closes every connection after its answer, without saying so first.
    url = await server(lambda head: [*_fixed(b"one"), b"<close>"])
    client, transport = _client()
    async with client:
        for _ in range(3):
            assert (await client.get(url)).content == b"one"
            await trio.sleep(0.05)  # the close arrives while the connection is idle
        assert transport.idle_connections() <= 1
    assert transport.connections_opened == 3


async def test_an_unread_stream_drops_its_connection_and_frees_its_slot(server) -> None:  # type: ignore[no-untyped-def]
    url = await server(lambda head: [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345",
                                     b"<pause>", b"67890"])
    client, transport = _client(max_connections=1)
    async with client:
        for _ in range(3):  # with one slot, a leaked connection would block the next
            with trio.fail_after(5):
                async with client.stream("GET", url) as response:
                    assert response.status_code == 200
    assert transport.idle_connections() == 0
    assert transport.connections_opened == 3


async def test_errors_are_httpx_errors(server) -> None:  # type: ignore[no-untyped-def]
    slow = await server(lambda head: [b"<pause>", *_fixed(b"late")])
    gone = await server(lambda head: None)
    partial = await server(lambda head: [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
                                         b"<close>"])
    bad = await server(lambda head: [b"SMTP ready\r\n\r\n"])
    client, transport = _client()
    async with client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(slow, timeout=httpx.Timeout(5, read=0.1))
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(gone)
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(partial)
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(bad)
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:1/")
        # After all that, every slot is free again.
        assert transport._slots.value == transport.max_connections


async def test_post_reads_the_whole_answer_and_asks_for_no_coding(server) -> None:  # type: ignore[no-untyped-def]
    heads: list[bytes] = []

    def reply(head: bytes) -> list[bytes]:
        heads.append(head)
        return [b"HTTP/1.1 429 Too Many\r\ntransfer-encoding: chunked\r\n\r\n",
                b"4\r\nslow\r\n", b"5\r\n down\r\n0\r\n\r\n"]

    url = await server(reply)
    _, transport = _client()
    for _ in range(2):
        status, body = await transport.post(url + "/v1/chat", headers={"x-api-key": "k"},
                                            content=b"{}", timeout_s=5)
        assert (status, body) == (429, b"slow down")
    assert transport.connections_opened == 1
    assert b"accept-encoding: identity" in heads[0].lower()
    assert b"content-length: 2" in heads[0].lower()
    await transport.aclose()


async def test_post_content_length_bodies_split_and_reused(server) -> None:  # type: ignore[no-untyped-def]
    heads: list[bytes] = []
    body = b'{"id":"x","n":' + b"1" * 5000 + b"}"

    def reply(head: bytes) -> list[bytes]:
        heads.append(head)
        whole = _fixed(body)
        return [whole[0][:7], whole[0][7:], body[:100], body[100:]]

    url = await server(reply)
    _, transport = _client()
    for _ in range(3):
        status, got = await transport.post(url + "/v1/chat?x=1", headers={"x-api-key": "k"},
                                           content=b'{"a":1}', timeout_s=5)
        assert (status, got) == (200, body)
    assert transport.connections_opened == 1
    assert all(h.startswith(b"POST /v1/chat?x=1 HTTP/1.1\r\n") for h in heads)
    assert b"\r\nhost: 127.0.0.1:" in heads[0].lower()
    assert b"\r\nx-api-key: k" in heads[0]
    assert transport._slots.value == transport.max_connections
    await transport.aclose()


async def test_post_refuses_header_injection_and_bounds_the_call(server) -> None:  # type: ignore[no-untyped-def]
    url = await server(lambda head: [b"HTTP/1.1 200 OK\r\n", b"<pause>", b"<pause>"])
    _, transport = _client()
    with pytest.raises(httpx.LocalProtocolError):
        await transport.post(url, headers={"x-api-key": "k\r\nx-evil: 1"}, content=b"{}",
                             timeout_s=5)
    started = trio.current_time()
    with pytest.raises(httpx.TimeoutException):
        await transport.post(url, headers={}, content=b"{}", timeout_s=0.3)
    assert trio.current_time() - started < 0.9
    # The timed-out connection was closed, not pooled; its slot is free again.
    assert transport.idle_connections() == 0
    assert transport._slots.value == transport.max_connections
    await transport.aclose()


async def test_idle_connections_under_the_newest_expire_too(server) -> None:  # type: ignore[no-untyped-def]
    """After a burst, the connections left under the one in use expire when their time
    is up (the keep-alive cap is as high as the connection cap: they must not linger)."""
    url = await server(lambda head: [b"<pause>", *_fixed(b"{}")])
    transport = UpstreamTransport(max_connections=10, max_keepalive_connections=10,
                                  keepalive_expiry_s=1.0)

    async def call() -> None:
        status, _ = await transport.post(url + "/v1/x", headers={}, content=b"{}",
                                         timeout_s=5)
        assert status == 200

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(3):  # a burst: three connections, then all idle
                nursery.start_soon(call)
        assert transport.idle_connections() == 3
        await call()  # reuses the newest for 0.5 s: its idle time starts again
        await trio.sleep(0.6)  # the two under it have been idle 1.1 s, the newest 0.6 s
        await call()
    assert transport.connections_opened == 3
    assert transport.idle_connections() == 1
    await transport.aclose()


async def test_a_cancelled_call_sends_nothing(server) -> None:  # type: ignore[no-untyped-def]
    """A free slot is taken without a scheduler pass, but cancellation is still checked
    before the request leaves: the upstream never sees (nor bills) it."""
    heads: list[bytes] = []
    url = await server(lambda head: heads.append(head) or _fixed(b"{}"))
    transport = UpstreamTransport(max_connections=10, max_keepalive_connections=10,
                                  keepalive_expiry_s=30)
    status, _ = await transport.post(url + "/v1/x", headers={}, content=b"{}", timeout_s=5)
    assert status == 200 and len(heads) == 1  # a kept-alive connection is there
    with trio.CancelScope() as scope:
        scope.cancel()
        await transport.post(url + "/v1/x", headers={}, content=b"{}", timeout_s=5)
    assert scope.cancelled_caught
    await trio.sleep(0.2)
    assert len(heads) == 1
    assert transport.idle_connections() == 1  # nothing was sent on it: still reusable
    await transport.aclose()


async def _read_all(response: httpx.Response) -> list[bytes]:
    """The body through ``read_some`` (the raw chat stream's way), piece by piece."""
    body = body_of(response)
    assert body is not None
    pieces = []
    while data := await body.read_some():
        pieces.append(data)
    return pieces


async def test_read_some_takes_what_each_read_brought(server) -> None:  # type: ignore[no-untyped-def]
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    burst = b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n"
    tail = b"4\r\nfour\r\n4\r\nfive\r\n0\r\ntrailer: x\r\n\r\n"
    raw = b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\n\r\n"
    one_each = [head, b"<pause>", b"3\r\none\r\n", b"<pause>", b"3\r\ntwo\r\n",
                b"<pause>", b"0\r\n\r\n"]  # one chunk per read, each waited for
    replies = iter([[head + burst, b"<pause>", tail], one_each,
                    [head, *[raw[i : i + 3] for i in range(0, len(raw), 3)]],
                    [*_fixed(b"fixed"), b"<pause>"]])
    url = await server(lambda _: next(replies))
    client, transport = _client()
    async with client:
        async with client.stream("POST", url, content=b"x") as response:
            assert await _read_all(response) == [b"onetwothree", b"fourfive"]
        async with client.stream("POST", url, content=b"x") as response:
            assert await _read_all(response) == [b"one", b"two"]
        async with client.stream("POST", url, content=b"x") as response:
            assert b"".join(await _read_all(response)) == b"hello world"
        async with client.stream("POST", url, content=b"x") as response:
            assert await _read_all(response) == [b"fixed"]
    assert transport.connections_opened == 1  # each body read to its end: reused


async def test_read_some_refuses_bad_chunks(server) -> None:  # type: ignore[no-untyped-def]
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    for bad in (b"zz\r\nhello\r\n", b"3\r\nhello\r\n", b"5\r\nhel", b"x" * 70000):
        url = await server(lambda _, bad=bad: [head + bad, b"<close>"])
        client, _ = _client()
        async with client, client.stream("POST", url, content=b"x") as response:
            with pytest.raises(httpx.RemoteProtocolError):
                await _read_all(response)


async def test_a_stream_left_at_its_last_chunk_keeps_its_connection(server) -> None:  # type: ignore[no-untyped-def]
    # A reader that stops at ``data: [DONE]`` never asks for the last chunk; when it is
    # already here, the connection goes back to the pool all the same.
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    events = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    url = await server(lambda _: [head + events])
    client, transport = _client()
    async with client:
        for _ in range(3):
            async with client.stream("POST", url, content=b"x") as response:
                body = body_of(response)
                assert body is not None
                while not (await body.read_some()).endswith(b"[DONE]\n\n"):
                    pass
    assert transport.connections_opened == 1


async def test_open_stream_sends_a_lean_post_and_bounds_each_wait(server) -> None:  # type: ignore[no-untyped-def]
    heads: list[bytes] = []
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"

    def reply(request: bytes) -> list[bytes]:
        heads.append(request)
        return [head + b"5\r\nfirst\r\n", b"<pause>", b"4\r\nlate\r\n0\r\n\r\n"]

    url = await server(reply)
    _, transport = _client(max_connections=1)
    response = await transport.open_stream(url + "/v1/x", headers={"authorization": "Bearer k"},
                                           content=b"{}", timeout_s=5)
    assert response.status_code == 200
    assert heads[0].startswith(b"POST /v1/x HTTP/1.1\r\n")
    assert b"authorization: Bearer k\r\n" in heads[0]
    assert b"accept-encoding: identity\r\n" in heads[0]
    assert b"content-length: 2" in heads[0]
    # The one slot is taken: a second call waits at most its timeout for it.
    with trio.fail_after(2), pytest.raises(httpx.PoolTimeout):
        await transport.open_stream(url, headers={}, content=b"", timeout_s=0.1)
    await response.aclose()  # unread: the connection is dropped, the slot freed
    assert transport._slots.value == 1
    # Each body read is bounded by timeout_s: the pause outlasts it.
    response = await transport.open_stream(url, headers={}, content=b"", timeout_s=0.2)
    body = body_of(response)
    assert body is not None
    assert await body.read_some() == b"first"
    with pytest.raises(httpx.ReadTimeout):
        await body.read_some()
    await response.aclose()
    assert transport._slots.value == 1
    # An error status: the body is read through httpx's API as usual.
    url = await server(lambda _: [b'HTTP/1.1 500 Oops\r\ncontent-length: 14\r\n\r\n'
                                  b'{"error":"no"}'])
    response = await transport.open_stream(url, headers={}, content=b"", timeout_s=5)
    assert response.status_code == 500
    assert await response.aread() == b'{"error":"no"}'
    await response.aclose()
    assert transport.idle_connections() == 1


async def _serve_on(nursery: trio.Nursery, host: str) -> int:
    reply = functools.partial(_serve, lambda head: _fixed(b"ok"))
    listeners = await nursery.start(functools.partial(trio.serve_tcp, reply, 0, host=host))
    return int(listeners[0].socket.getsockname()[1])


async def test_ip_literal_and_named_hosts_connect_and_refusals_are_connect_errors(
    nursery: trio.Nursery,
) -> None:
    """An IP literal host is connected to directly (one socket, no resolution or happy
    eyeballs); a name still goes through trio's resolver; both give the same answers."""
    port = await _serve_on(nursery, "127.0.0.1")
    urls = [f"http://127.0.0.1:{port}/", f"http://localhost:{port}/"]
    with contextlib.suppress(OSError):  # no IPv6 loopback on this host: left out
        urls.append(f"http://[::1]:{await _serve_on(nursery, '::1')}/")
    client, transport = _client()
    async with client:
        for url in urls:
            response = await client.get(url)
            assert (response.status_code, response.content) == (200, b"ok")
            fast = await transport.open_stream(url, headers={}, content=b"{}", timeout_s=5)
            assert (fast.status_code, await fast.aread()) == (200, b"ok")
        with pytest.raises(httpx.ConnectError):
            await client.get("http://127.0.0.1:1/")
        with pytest.raises(httpx.ConnectError):
            await transport.open_stream("http://[::1]:1/", headers={}, content=b"{}",
                                        timeout_s=5)
        assert transport._slots.value == transport.max_connections
    assert transport.connections_opened == len(urls)
