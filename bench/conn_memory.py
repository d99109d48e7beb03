"""Memory per kept-alive client connection: hypercorn's trio worker vs ``triogate.server``.

    python bench/conn_memory.py [--connections 4096]

Each server (the raw ASGI hello-world of ``bench/hello_server.py``, its own process) gets
``--connections`` connections, each answered once and then left open (idle, kept alive);
the server's RSS before and after, divided by the connections.
"""

from __future__ import annotations

import argparse
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import load_procs as procs  # noqa: E402
from send_floor import wait_listening  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--connections", type=int, default=4096)
    a = p.parse_args(argv)
    want = a.connections + 100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    for kind in ("hypercorn", "triogate"):
        port = procs.free_port()
        server = subprocess.Popen([sys.executable, str(BENCH / "hello_server.py"), "--serve",
                                   str(port), kind], stderr=subprocess.DEVNULL)
        socks: list[socket.socket] = []
        try:
            wait_listening(port)
            proc = psutil.Process(server.pid)
            time.sleep(0.5)
            before = proc.memory_info().rss
            for _ in range(a.connections):
                sock = socket.create_connection(("127.0.0.1", port))
                sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                socks.append(sock)
            for sock in socks:
                data = b""
                while b"Hello" not in data:
                    data += sock.recv(65536)
            time.sleep(1)
            after = proc.memory_info().rss
            print(f"{kind}: RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB, "
                  f"{(after - before) / a.connections / 1024:.1f} KiB per kept-alive connection")
        finally:
            for sock in socks:
                sock.close()
            server.terminate()
            server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
