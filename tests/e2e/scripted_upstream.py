"""An upstream on loopback whose answer is a script: given pieces of a chunked body, each in
its own write (how they are cut into reads is the scenario). Used by the raw stream tests
(``test_raw_chat_stream.py``, ``test_raw_messages_stream.py``) through the ``scripted``
fixture of ``conftest.py``."""

from __future__ import annotations

import re

import attrs
import trio


@attrs.define
class Scripted:
    """An upstream that answers every POST with ``pieces``, one chunked write each,
    ``gap_s`` apart; with ``hang`` it then waits until the client goes away."""

    pieces: list[bytes] = attrs.Factory(list)
    gap_s: float = 0.0
    hang: bool = False
    gone: int = 0
    port: int = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length:
            body += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                              b"transfer-encoding: chunked\r\n\r\n")
        try:
            for piece in self.pieces:
                await stream.send_all(b"%x\r\n%s\r\n" % (len(piece), piece))
                await trio.sleep(self.gap_s)
            if self.hang:
                while await stream.receive_some(65536):
                    pass
                self.gone += 1
                return
            await stream.send_all(b"0\r\n\r\n")
        except trio.BrokenResourceError:
            self.gone += 1
        await stream.aclose()
