"""h11 vs httptools on one keep-alive request: the parser choice of ``triogate/server``.

Each iteration feeds one gateway-shaped request (a POST with the headers the openai SDK
sends and a 180-byte JSON body) to a parser that lives as long as its connection, and
collects what the server needs: method, target, version, header list, body, end of
message, keep-alive. h11 then also frames a 200 answer (``send(Response)`` + ``send(Data)``
+ ``send(EndOfMessage)``) and starts the next cycle, since the server would otherwise do
both by hand. ``python3 bench/parse_head.py`` prints µs per request, best of 5 runs.
"""

from __future__ import annotations

import timeit

import h11
import httptools

BODY = (b'{"model":"gpt-test","messages":[{"role":"user","content":"hello there, how are '
        b'you today? tell me something"}],"max_tokens":16,"temperature":0.2,"stream":false}')
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:4000\r\n"
    b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nAccept: application/json\r\n"
    b"Content-Type: application/json\r\nUser-Agent: OpenAI/Python 1.99.0\r\n"
    b"X-Stainless-Lang: python\r\nX-Stainless-Package-Version: 1.99.0\r\n"
    b"X-Stainless-Runtime: CPython\r\nAuthorization: Bearer sk-triogate-dev-0123456789\r\n"
    b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)


def h11_cycle(conn: h11.Connection) -> None:
    conn.receive_data(REQUEST)
    request = conn.next_event()
    assert type(request) is h11.Request
    body = conn.next_event()
    assert type(body) is h11.Data
    end = conn.next_event()
    assert type(end) is h11.EndOfMessage
    conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"2")]))
    conn.send(h11.Data(data=b"ok"))
    conn.send(h11.EndOfMessage())
    conn.start_next_cycle()


class Sink:
    """What the server's httptools protocol collects per request."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.done = False

    def on_message_begin(self) -> None:
        self.headers = []
        self.body = []
        self.done = False

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


def httptools_cycle(parser: httptools.HttpRequestParser, sink: Sink) -> None:
    parser.feed_data(REQUEST)
    assert sink.done
    parser.get_method()
    parser.get_http_version()
    parser.should_keep_alive()
    httptools.parse_url(sink.url)
    b"".join(sink.body)


def main() -> None:
    n = 20_000
    conn = h11.Connection(h11.SERVER)
    sink = Sink()
    parser = httptools.HttpRequestParser(sink)
    rows = {
        "h11: parse + frame a 200 + next cycle": lambda: h11_cycle(conn),
        "httptools: parse (callbacks, url split)": lambda: httptools_cycle(parser, sink),
    }
    for name, fn in rows.items():
        best = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
        print(f"{name:45s} {best:6.2f} µs per request")


if __name__ == "__main__":
    main()
