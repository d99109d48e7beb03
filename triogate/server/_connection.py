"""One HTTP/1.1 connection: parse with httptools, run the ASGI app, write straight to the socket.

The connection's task reads, runs the application for each request in turn (pipelined
requests are answered in order, one at a time) and closes. There is no reader task next
to the application: ``receive()`` reads the socket itself when it needs bytes, for the
body, or, once the body is in, to notice that the client went away (``http.disconnect``).
So a request costs no task, no queue and no lock of the server's.

Timers: the connection's task runs in one cancel scope (``timer``). While idle it is the
server's keep-alive watchdog (``_idle.py``) that cancels it, ``keep_alive_s`` after the
connection began to idle (the connection only stamps when); for a partly received head
its deadline is ``body_read_timeout_s`` from the head's first byte (later bytes do not
extend it, so a client trickling a byte now and then, slowloris, is answered 408 at the
bound); nothing bounds it while the application runs. Shutdown moves its deadline to now
for an idle connection only.
A body read is bounded by its own scope: a body may go ``body_read_timeout_s`` without
a byte, and must be complete ``body_total_timeout_s`` after its head (a client trickling
a byte now and then does not hold it longer); when either expires the application sees
``http.disconnect`` and the client gets 408. A read that finds more bytes waiting is a
schedule point, so a client sending as fast as loopback allows cannot starve the others.

What is not a request (chunk sizes, chunk extensions, line ends) is bounded: a connection
whose bytes exceed ``_FRAMING_FACTOR`` times its heads and bodies, plus
``_FRAMING_SLACK``, is answered 400 (llhttp skips a chunk extension of any length
without a callback: 3.5 GB of one was read for a body that never began).

Writes: ``send()`` turns an ASGI message into bytes and writes them with one ``send``
system call when the socket takes them (the common case); a response's head leaves with
its body (or, streamed, with its first chunk). A write is a cancel point; it waits (a
schedule point) only when the socket is full, bounded by ``write_timeout_s``. A client
that is gone (reset, or not reading) makes later sends no-ops and wakes a waiting
``receive()`` with ``http.disconnect``, as hypercorn's do.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import socket
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import unquote

import httptools
import trio

from triogate.server import _head
from triogate.server._idle import Idle

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from triogate.server._config import ServerConfig

    App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

logger = logging.getLogger("triogate.server")

_READ_SIZE: Final = 65536
_DISCONNECT: Final = {"type": "http.disconnect"}
_CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"
_ASGI: Final = {"version": "3.0", "spec_version": "2.3"}
#: Response states.
_NONE, _HEAD, _BODY, _DONE = 0, 1, 2, 3
#: A lingering close reads (and drops) what the client still sends, this long at most,
#: so that the kernel does not answer it with a reset that could destroy our last answer.
_LINGER_S: Final = 1.0
_LINGER_BYTES: Final = 1 << 20
#: A connection's bytes may exceed its requests' heads and bodies this many times over,
#: plus the slack (a read in progress, a head not yet complete); beyond, 400.
_FRAMING_FACTOR: Final = 4
_FRAMING_SLACK: Final = 64 * 1024
#: What a head costs beyond ``head_size`` (request line, line ends), for that count.
_HEAD_LINE_BYTES: Final = 32


class _Message:
    """One request as the parser delivers it."""

    __slots__ = ("body", "body_by", "complete", "head_done", "head_size", "headers", "hosts",
                 "keep_alive", "method", "target", "version")

    def __init__(self) -> None:
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.head_done = False
        #: ``host`` header lines seen.
        self.hosts = 0
        self.method = ""
        self.version = "1.1"
        self.keep_alive = True
        self.body: list[bytes] = []
        self.complete = False
        #: When the whole body must be in (trio time; set when the head is complete).
        self.body_by = math.inf


class _BadTarget(Exception):
    """An absolute-form request target that does not parse as a URL (``http://``): 400."""


class Connection(Idle):
    """One client connection (see the module docstring)."""

    def __init__(self, sock: socket.socket, app: App, config: ServerConfig,
                 server: tuple[str, int] | None, date: _head.CachedDate) -> None:
        super().__init__()  # ``since``, ``closed`` and ``timer``, for the keep-alive watchdog
        self.sock = sock
        self.app = app
        self.config = config
        self._date = date
        self._server_addr = server
        try:
            peer = sock.getpeername()
            self._client: tuple[str, int] | None = (peer[0], peer[1])
        except OSError:
            self._client = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: collections.deque[_Message] = collections.deque()
        self._parsing: _Message | None = None
        #: Status of a protocol error met while parsing (400, 431, 501); answered in turn.
        self._error = 0
        #: What that error was, for its answer (None: the status's own message).
        self._reason: str | None = None
        #: Nothing more is parsed: after CONNECT, or after a request that ends the connection.
        self._ignore_rest = False
        #: The upgrade request whose body a fresh parser is about to read.
        self._replay: _Message | None = None
        #: Bytes of the head line in progress (-1: the head began in the current read).
        self._raw_head = 0
        #: Bytes of later requests read while responses were in flight, until they are
        #: all answered (bounds the queue, not just one response's read-ahead).
        self._ahead = 0
        #: Waiting for a new request with nothing of it received: shutdown may close it.
        self.idle = False
        #: Requests answered (a connection that served one and idles is kept alive).
        self.served = 0
        self.closing = False
        self._broken = False
        self._eof = False
        # The request being answered.
        self._msg: _Message | None = None
        self._state = _NONE
        self._head_only = False
        self._chunked = False
        self._length: int | None = None
        self._sent = 0
        self._keep = True
        self._delivered = False
        self._continue = False
        self._watch: trio.CancelScope | None = None
        self._status_error = 0
        self._status_reason: str | None = None
        self._status = 200
        self._headers: Any = ()
        #: Closing with part of a request unread: linger so that our answer is read.
        self._unread = False
        #: Bytes received, and how many of them were heads and bodies (``_FRAMING_FACTOR``).
        self._wire = 0
        self._useful = 0

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if self._replay is not None:  # the body of an upgrade request, after all
            self._parsing, self._replay = self._replay, None
            return
        message = _Message()
        self._parsing = message
        self._raw_head = -1  # began in the bytes being parsed
        if not self._error:  # nothing after a protocol error is served
            self._queue.append(message)

    def on_url(self, url: bytes) -> None:
        message = self._parsing
        assert message is not None
        message.target += url
        message.head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self._parsing
        assert message is not None
        message.head_size += len(name) + len(value) + 4
        if message.head_done:
            # A trailer (after a chunked body): dropped, not appended to the headers the
            # app already holds (a trailing ``authorization`` is no header), and counted
            # with the head against max_head_bytes: unbounded, they grew the list by
            # hundreds of MB a second.
            if message.head_size > self.config.max_head_bytes:
                self._refuse(message, 431)
            return
        name = name.lower()
        message.headers.append((name, value))
        if name == b"host":
            message.hosts += 1
        elif name == b"transfer-encoding" and value.lower() != b"chunked":
            # llhttp takes ``gzip, chunked`` as chunked and would hand the app a body
            # still gzip-coded; a front proxy may frame it otherwise (smuggling). RFC
            # 9112 6.1: a coding the server does not understand is 501.
            self._refuse(message, 501)

    def on_headers_complete(self) -> None:
        message = self._parsing
        assert message is not None
        parser = self._parser
        message.head_done = True
        self._useful += message.head_size + _HEAD_LINE_BYTES
        total = self.config.body_total_timeout_s
        if total is not None:
            message.body_by = trio.current_time() + total
        message.method = parser.get_method().decode("ascii")
        message.version = parser.get_http_version()
        message.keep_alive = parser.should_keep_alive() and message.version == "1.1"
        if message.head_size > self.config.max_head_bytes:
            self._refuse(message, 431)
        elif message.version not in ("1.1", "1.0"):
            # llhttp takes ``HTTP/2.0`` (and 0.9) in a request line: not a version this
            # server speaks (RFC 9110 15.6.6). An HTTP/2 client must use hypercorn.
            self._refuse(message, 505, f"HTTP/{message.version} is not served here: "
                                       "HTTP/1.1 only")
        elif message.hosts > 1 or (message.hosts == 0 and message.version == "1.1"):
            # RFC 9112 3.2: an HTTP/1.1 request without ``host``, or any with two, is 400
            # (two could name different hosts to a front proxy and to us).
            self._refuse(message, 400, "an HTTP/1.1 request needs exactly one Host header"
                         if message.hosts < 2 else "more than one Host header")

    def _refuse(self, message: _Message, status: int, reason: str | None = None) -> None:
        """``message`` is not served: ``status`` is answered in its turn, then the close."""
        if not self._error:
            self._error, self._reason = status, reason
        if message is not self._msg and message in self._queue:
            self._queue.remove(message)

    def on_body(self, body: bytes) -> None:
        message = self._parsing
        assert message is not None
        message.body.append(body)
        self._useful += len(body)

    def on_message_complete(self) -> None:
        message = self._parsing
        assert message is not None
        message.complete = True
        self._parsing = None

    def _feed(self, data: bytes) -> None:
        """Parse ``data``; a protocol error is kept for its turn (the connection ends then)."""
        if self._ignore_rest:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._ignore_upgrade(data[upgrade.args[0]:])
            return
        except httptools.HttpParserError:
            self._drop_partial()
            queue = self._queue
            if queue and queue[-1].complete and not queue[-1].keep_alive:
                # Bytes after a request that ends the connection (llhttp refuses them):
                # ignored, as a request after ``close`` is (RFC 9112 9.6), not answered
                # with a stray 400 that the client would take for that request's answer.
                self._ignore_rest = True
                self._unread = True  # linger: what the client still sends must not reset it
                return
            self._error = self._error or 400
            return
        self._wire += len(data)
        if self._wire > _FRAMING_FACTOR * self._useful + _FRAMING_SLACK:
            # Chunk extensions (or sizes, or blank chunks) out of all proportion to what
            # they frame: refused, nothing after them read.
            self._drop_partial()
            self._ignore_rest = True
            if not self._error:
                self._error, self._reason = 400, "chunk framing out of proportion to the body"
            return
        message = self._parsing
        if message is not None and not message.head_done:
            # A head in progress: what it holds is ``head_size`` (the target and the whole
            # header lines) plus the line the parser is in the middle of, whose bytes are
            # after the last newline. Counting the whole read instead made a 64 KiB read
            # of pipelined requests that ended inside a head a false 431.
            newline = data.rfind(b"\n")
            if self._raw_head < 0:  # it began in this read: the request line is in head_size
                line = 0 if newline < 0 else len(data) - newline - 1
            elif newline < 0:  # the same line goes on
                line = self._raw_head + len(data)
            else:
                line = len(data) - newline - 1
            self._raw_head = line
            if message.head_size + line > self.config.max_head_bytes:
                self._error = self._error or 431
                self._drop_partial()

    def _ignore_upgrade(self, rest: bytes) -> None:
        """An upgrade offer (WebSocket, h2c: every JDK HttpClient offers h2c over
        cleartext) is ignored, as RFC 9110 7.8 allows: the request is served as plain
        HTTP/1.1. llhttp ends an upgrade request at its head (httptools skips its body), so
        a fresh parser takes over, given the body's framing by a head of its own whose
        callbacks land in the request (``_replay``). CONNECT (a tunnel) is 400."""
        self._parser = httptools.HttpRequestParser(self)
        message = self._queue[-1] if self._queue and not self._error else None
        if message is None or message.method == "CONNECT":
            if message is not None:
                self._queue.pop()
                self._error = 400
            self._ignore_rest = True  # nothing after it is read
            return
        framing = b""
        for name, value in message.headers:
            if name == b"transfer-encoding":  # chunked: anything else was refused (501)
                framing = b"transfer-encoding: chunked"
            elif name == b"content-length" and not framing:
                framing = b"content-length: " + value
        if framing:
            message.complete = False
            saved = (message.target, message.headers, message.head_size, message.method,
                     message.version, message.keep_alive)
            message.headers = []
            self._replay = message
            self._parser.feed_data(b"POST / HTTP/1.1\r\n" + framing + b"\r\n\r\n")
            (message.target, message.headers, message.head_size, message.method,
             message.version, message.keep_alive) = saved
        if rest:
            self._feed(rest)

    def _drop_partial(self) -> None:
        """Forget a request that will never be complete (the error ends the connection)."""
        message = self._parsing
        if message is not None and message is not self._msg and not message.head_done:
            self._queue.remove(message)
        self._parsing = None

    # ------------------------------------------------------------------ socket

    async def _recv(self) -> bytes:
        """Bytes from the client (``b""``: it closed or reset). A cancel point; a schedule
        point only when nothing is waiting in the socket."""
        await trio.lowlevel.checkpoint_if_cancelled()
        sock = self.sock
        while True:
            try:
                return sock.recv(_READ_SIZE)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
            except OSError:
                return b""

    async def _write(self, data: bytes) -> None:
        """Write all of ``data``, or mark the connection broken (the client is gone)."""
        if self._broken:
            return
        await trio.lowlevel.checkpoint_if_cancelled()
        sock = self.sock
        try:
            sent = sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._gone()
            return
        if sent == len(data):
            return
        finished = False
        view = memoryview(data)[sent:]
        try:
            with trio.move_on_after(self.config.write_timeout_s):
                while view:
                    await trio.lowlevel.wait_writable(sock)
                    try:
                        view = view[sock.send(view):]
                    except BlockingIOError:
                        continue
                    except OSError:
                        break
                else:
                    finished = True
        finally:
            if not finished:  # reset, stuck, or cancelled mid-write: the framing is lost
                self._gone()

    def _gone(self) -> None:
        """The client cannot be written to: later sends are dropped, a waiting
        ``receive()`` wakes with ``http.disconnect`` (a shut-down socket reads as EOF)."""
        self._broken = True
        self._keep = False
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        if self._watch is not None:  # also when it stopped reading (read-ahead full)
            self._watch.cancel()

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Serve requests until the client leaves, an error ends the connection, it idles
        past the keep-alive, or the server shuts down."""
        with self.timer:
            await self._loop()
        if self.timer.cancelled_caught and self._parsing is not None:
            self._error = self._error or 408  # stopped mid-head
        if self._broken:
            return
        if self._error:
            await self._answer_error(self._error, self._reason)
        if self._error in (400, 431, 501, 505) or self._unread:
            await self._linger()

    async def _loop(self) -> None:
        timer = self.timer
        queue = self._queue
        config = self.config
        head_timed = False
        while True:
            if not queue or not queue[0].head_done:
                if self._error or self._eof:
                    return
                if queue:
                    # Part of a head: the whole head must arrive within the timeout from
                    # its first byte (a byte now and then does not hold it open: slowloris).
                    self.idle = False
                    if not head_timed:
                        head_timed = True
                        timeout = config.body_read_timeout_s
                        timer.deadline = (trio.current_time() + timeout) if timeout else math.inf
                else:
                    if self.closing:
                        return
                    self.idle = True
                    self.since = trio.current_time()  # the keep-alive watchdog's clock
                    if config.keep_alive_s <= 0:  # no keep-alive: the watchdog has none
                        timer.deadline = self.since
                data = await self._recv()
                self.idle = False
                self.since = math.inf
                if not data:
                    return
                self._feed(data)
                continue
            if head_timed:
                timer.deadline = math.inf
                head_timed = False
            message = queue[0]
            await self._respond(message)
            self.served += 1
            queue.popleft()
            if not queue:  # what was read ahead is all answered: a new allowance
                self._ahead = 0
            if not self._keep or self.closing:
                return

    # ------------------------------------------------------------------ one request

    def _scope(self, message: _Message) -> dict[str, Any]:
        target = message.target
        if target[:1] != b"/" and target != b"*":  # absolute-form (a proxy's request)
            try:
                url = httptools.parse_url(target)
            except httptools.HttpParserInvalidURLError:
                raise _BadTarget from None
            raw_path, query = url.path or b"/", url.query or b""
        else:
            raw_path, _, query = target.partition(b"?")
        path = raw_path.decode("latin-1")
        if "%" in path:
            # Bytes that are not UTF-8 become U+FFFD, as in hypercorn and uvicorn: a
            # surrogate escape is a str no encoder takes, so ``/%ff`` was the app's 500.
            path = unquote(path)
        return {
            "type": "http", "asgi": _ASGI, "http_version": message.version,
            "method": message.method, "scheme": "http", "path": path,
            "raw_path": raw_path, "query_string": query, "root_path": "",
            "headers": message.headers, "client": self._client,
            "server": self._server_addr,
        }

    async def _respond(self, message: _Message) -> None:
        self._msg = message
        self._state = _NONE
        self._keep = message.keep_alive
        self._delivered = False
        self._continue = False
        self._status_error = 0
        self._status_reason = None
        self._head_only = message.method == "HEAD"
        try:
            scope = self._scope(message)
            await self.app(scope, self.receive, self.send)
        except _BadTarget:  # the parser let it through, the URL parser refuses it
            self._keep = False
            await self._answer_error(400)
        except Exception:
            logger.exception("error in ASGI application")
            self._keep = False
            if self._state in (_NONE, _HEAD) and not self._broken:  # nothing written yet
                await self._answer_error(500)
        else:
            state = self._state
            if state == _NONE and not self._broken:  # the app answered nothing
                await self._answer_error(self._status_error or 500, self._status_reason)
                self._keep = False
            elif state == _HEAD:  # a head without a body: send it, and end the connection
                self._keep = False
                try:
                    head = self._encode_head(None)
                except ValueError:
                    logger.exception("response head refused")
                    await self._answer_error(500)
                else:
                    await self._write(head)
            elif state == _BODY:  # a body cut short: the client sees it end with the socket
                self._keep = False
        self._state = _DONE
        self._msg = None
        if not message.complete:  # the rest of its body was never read
            self._keep = False
            self._unread = self._status_error != 408
            # A parse error met in that unread body: the app's answer stands; a second
            # answer (400) would read as the answer to the client's next request.
            self._error, self._reason = 0, None
        if self._status_error:
            self._keep = False

    async def receive(self) -> dict[str, Any]:
        """ASGI ``receive``: the body, then ``http.disconnect`` once the client is gone or
        the response is complete. A cancel point; it reads the socket only when it has
        nothing to hand over."""
        await trio.lowlevel.checkpoint_if_cancelled()
        message = self._msg
        if message is None or self._state == _DONE or self._broken or self._eof:
            return _DISCONNECT
        while not self._delivered:
            if message.body or message.complete:
                body = b"".join(message.body) if len(message.body) != 1 else message.body[0]
                message.body = []
                more = not message.complete
                self._delivered = not more
                return {"type": "http.request", "body": body, "more_body": more}
            if self._error:
                return self._protocol_error(self._error)
            if not self._continue and self._state == _NONE:
                self._continue = True
                if any(k == b"expect" and v.lower() == b"100-continue"
                       for k, v in message.headers):
                    await self._write(_CONTINUE)
            timeout = self.config.body_read_timeout_s
            deadline = trio.current_time() + timeout if timeout else math.inf
            with trio.move_on_at(min(deadline, message.body_by)) as scope:
                data = await self._recv()
            if scope.cancelled_caught:
                return self._protocol_error(408)
            if not data:
                self._eof = True
                return _DISCONNECT
            self._feed(data)
            # More bytes were waiting (or just came): let the other connections run before
            # the next read, however fast this client sends.
            await trio.lowlevel.checkpoint()
        # The body is in: wait for the client to leave, or for the response to end.
        with trio.CancelScope() as watch:
            self._watch = watch
            try:
                while True:
                    if self._ahead > self.config.max_pipelined_bytes or self._error:
                        await trio.sleep_forever()  # until the response ends
                    data = await self._recv()
                    if not data:
                        self._eof = True
                        break
                    self._ahead += len(data)
                    self._feed(data)
            finally:
                self._watch = None
        return _DISCONNECT

    def _protocol_error(self, status: int) -> dict[str, Any]:
        """The request cannot be read to its end: the app sees the client gone; the
        server answers ``status`` if the app answers nothing."""
        self._status_error = status
        self._status_reason = self._reason if status == self._error else None
        if status == self._error:
            self._error, self._reason = 0, None  # answered after the app, not again at the end
        self._keep = False
        self._eof = True
        return _DISCONNECT

    async def send(self, event: dict[str, Any]) -> None:
        """ASGI ``send``: one write per body message (the head leaves with the first)."""
        kind = event["type"]
        if kind == "http.response.body":
            state = self._state
            if self._broken:
                await trio.lowlevel.checkpoint_if_cancelled()
                return
            body = event.get("body", b"")
            more = event.get("more_body", False)
            if state == _BODY:
                data = self._frame(body, more)
            elif state == _HEAD:
                head = self._encode_head(None if more else len(body))
                self._state = _BODY
                data = head + self._frame(body, more)
            else:
                raise RuntimeError(f"ASGI message {kind} out of order")
            if not more:
                self._state = _DONE
                if self._watch is not None:
                    self._watch.cancel()
            if data:
                await self._write(data)
            else:
                await trio.lowlevel.checkpoint_if_cancelled()
        elif kind == "http.response.start":
            if self._state != _NONE:
                raise RuntimeError("ASGI message http.response.start sent twice")
            self._state = _HEAD
            self._status = int(event["status"])
            self._headers = event.get("headers") or ()
            self._length = None
            self._chunked = False
            self._sent = 0
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")

    def _frame(self, body: bytes, more: bool) -> bytes:
        """A body message's bytes on the wire (none for HEAD and bodiless statuses)."""
        if self._head_only:
            return b""
        if self._chunked:
            if not more:
                return _head.chunk(body) + _head.LAST_CHUNK if body else _head.LAST_CHUNK
            return _head.chunk(body) if body else b""
        self._sent += len(body)
        if not more and self._length is not None and self._sent != self._length:
            self._keep = False  # the body does not match its length: end the connection
        return body

    def _encode_head(self, length: int | None) -> bytes:
        """The response head; decides the body's framing (length, chunked or close)."""
        status = self._status
        lines = []
        has_date = False
        declared: int | None = None
        for name, value in self._headers:
            lower = name.lower()
            if lower == b"content-length":
                declared = int(value)
            elif lower == b"connection":
                if value.lower() == b"close":
                    self._keep = False
                continue
            elif lower == b"transfer-encoding":
                continue  # the server frames the body itself
            elif lower == b"date":
                has_date = True
            lines.append(b"%b: %b\r\n" % (name, value))
        extra = b"" if has_date else self._date()
        bodiless = status < 200 or status in (204, 304)
        if declared is not None:
            self._length = declared
        elif bodiless:
            pass
        elif length is not None:
            self._length = length
            if not self._head_only:
                extra += b"content-length: %d\r\n" % length
        elif self._msg is not None and self._msg.version == "1.1" and not self._head_only:
            self._chunked = True
            extra += b"transfer-encoding: chunked\r\n"
        elif not self._head_only:
            self._keep = False  # HTTP/1.0 stream: the close ends the body
        if bodiless:
            self._head_only = True
        message = self._msg
        if self.closing or self._status_error or (message is not None and not message.complete):
            # An answer before the request's body is in (a 413): the connection ends after
            # it, and the client must know it before it sends another request.
            self._keep = False
        if not self._keep:
            extra += b"connection: close\r\n"
        return _head.encode_head(status, lines, extra)

    async def _answer_error(self, status: int, reason: str | None = None) -> None:
        """The server's own answer (400, 408, 431, 500, 501): it ends the connection."""
        body, headers = self.config.error_body(status, reason)
        self._keep = False
        lines = [b"%b: %b\r\n" % (k, v) for k, v in headers]
        extra = self._date() + b"content-length: %d\r\nconnection: close\r\n" % len(body)
        try:
            head = _head.encode_head(status, lines, extra)
        except ValueError:
            logger.exception("error body headers refused")
            return
        with trio.move_on_after(self.config.write_timeout_s):
            await self._write(head + body)

    async def _linger(self) -> None:
        """Stop writing, and read off what the client still sends (bounded), so that closing
        with unread bytes does not reset the connection before the client reads our answer."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return
        drained = 0
        with trio.move_on_after(_LINGER_S):
            while drained < _LINGER_BYTES:
                data = await self._recv()
                if not data:
                    break
                drained += len(data)
