"""A lean HTTP/1.1 server for ASGI 3 applications on trio: the gateway's default server.

It does what the gateway needs of hypercorn, with none of its per-request machinery:
httptools (llhttp) parses, the connection's own task runs the application (no reader
task, no queue, no lock), a response head leaves in the same write as its body, and a
streamed chunk is framed and written with one ``send`` system call. HTTP/1.1 and 1.0,
keep-alive, pipelining (answered in order), ``Expect: 100-continue``, HEAD; no TLS, no
HTTP/2, no WebSocket (a gateway behind a TLS terminator needs none of them).

    await serve(app, ServerConfig(), shutdown=event, host="127.0.0.1", port=4000)
"""

from __future__ import annotations

from triogate.server._config import ServerConfig as ServerConfig
from triogate.server._config import plain_error as plain_error
from triogate.server._head import CachedDate as CachedDate
from triogate.server._limits import connections_for as connections_for
from triogate.server._limits import open_files_limit as open_files_limit
from triogate.server._limits import raise_open_files_limit as raise_open_files_limit
from triogate.server._serve import listen as listen
from triogate.server._serve import serve as serve

__all__ = ("CachedDate", "ServerConfig", "connections_for", "listen", "open_files_limit",
           "plain_error", "raise_open_files_limit", "serve")
