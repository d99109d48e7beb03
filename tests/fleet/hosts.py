"""The servers of a fleet, each started inside its namespace (``tests/fleet/netns.py``).

* :class:`NsRedis`: one redis-server with AOF and ``appendfsync always`` on the Redis
  namespace's address; kill -9 and restart from the AOF; its CPU time from ``/proc``.
* :class:`NsCluster`: a Redis Cluster of redis-server nodes in the Redis namespace (one
  address, a port per node), ``primaries`` primaries with ``replicas`` replicas each,
  joined with ``redis-cli --cluster create``.
* :class:`NsPostgres`: the harness's :class:`PrivatePostgres`, run in its namespace and
  listening on that namespace's address.
* :class:`GatewayHost`: ``triogate serve --workers N`` in a host namespace.

``ip netns exec`` replaces itself with the command, so each ``Popen``'s pid is the
server's own. Synchronous; async callers use ``trio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import httpx

from tests.chaos.harness import PrivatePostgres, redis_binary

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fleet.netns import Network

REDIS_PORT = 6379
CLUSTER_BASE_PORT = 7000
GATEWAY_PORT = 4000
POSTGRES_PORT = 5432
_TICKS = os.sysconf("SC_CLK_TCK")


def _ping(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith((b"+PONG", b"-LOADING"))
    except OSError:
        return False


def command(host: str, port: int, *args: str, timeout_s: float = 5) -> str:
    """One command through ``redis-cli`` (its reply as text)."""
    done = subprocess.run(["redis-cli", "-h", host, "-p", str(port), *args],
                          capture_output=True, text=True, timeout=timeout_s, check=True)
    return done.stdout


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class _RedisNode:
    """One redis-server process in a namespace."""

    def __init__(self, network: Network, role: str, folder: Path, port: int,
                 extra: list[str]) -> None:
        self.network, self.role, self.folder, self.port = network, role, folder, port
        self.host = network.addresses[role]
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        binary = redis_binary()
        assert binary is not None
        argv = [*self.network.prefix(self.role), binary, "--bind", self.host,
                "--port", str(self.port), "--dir", str(self.folder), "--save", "",
                "--daemonize", "no", "--protected-mode", "no",
                "--logfile", str(self.folder / "redis.log"), *self.extra]
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not _ping(self.host, self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer: {self.log_tail()}")
            time.sleep(0.02)

    def log_tail(self) -> str:
        log = self.folder / "redis.log"
        return log.read_text(errors="replace")[-1500:] if log.exists() else ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


class NsRedis(_RedisNode):
    """A single Redis primary with AOF (by default ``appendfsync always``: kill -9 loses
    nothing)."""

    def __init__(self, network: Network, folder: Path, role: str = "redis", *,
                 appendfsync: str = "always") -> None:
        super().__init__(network, role, folder, REDIS_PORT,
                         ["--appendonly", "yes", "--appendfsync", appendfsync])

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    def pids(self) -> list[int]:
        return [self.pid]


class NsCluster:
    """A Redis Cluster in one namespace: ``primaries`` * (1 + ``replicas``) nodes."""

    def __init__(self, network: Network, folder: Path, *, primaries: int = 3,
                 replicas: int = 0, role: str = "redis", appendfsync: str = "always") -> None:
        self.host = network.addresses[role]
        count = primaries * (1 + replicas)
        self.replicas = replicas
        self.primaries = primaries
        self.nodes = [
            _RedisNode(network, role, folder / f"node-{i}", CLUSTER_BASE_PORT + i,
                       ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                        "--cluster-config-file", str(folder / f"node-{i}" / "nodes.conf"),
                        "--cluster-require-full-coverage", "no",
                        "--appendonly", "yes", "--appendfsync", appendfsync])
            for i in range(count)]

    def start(self) -> None:
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                ["redis-cli", "--cluster", "create",
                 *(f"{self.host}:{n.port}" for n in self.nodes),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True, timeout=60, check=True)
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def wait_ok(self, timeout_s: float = 30) -> None:
        """Until every running node says ``cluster_state:ok`` (after a failover: the replica
        was promoted and the others know it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            alive = [n for n in self.nodes if n.process is not None and n.process.poll() is None]
            try:
                if all("cluster_state:ok" in command(self.host, n.port, "CLUSTER", "INFO")
                       for n in alive) and self._primaries_alive(alive):
                    return
            except (subprocess.SubprocessError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.1)

    def _primaries_alive(self, alive: list[_RedisNode]) -> bool:
        """Every node that one running node lists as a primary with slots is running."""
        ports = {n.port for n in alive}
        for line in command(self.host, alive[0].port, "CLUSTER", "NODES").splitlines():
            fields = line.split()
            if len(fields) > 8 and "master" in fields[2]:  # a primary with slots
                port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                if port not in ports:
                    return False
        return True

    def primary(self) -> _RedisNode:
        """A running node that is a primary now."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None and (
                    command(self.host, node.port, "ROLE").startswith("master")):
                return node
        raise LookupError("no primary is running")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    def pids(self) -> list[int]:
        return [n.pid for n in self.nodes if n.process is not None and n.process.poll() is None]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class NsPostgres(PrivatePostgres):
    """The harness's private PostgreSQL, run in ``role``'s namespace on its address."""

    def __init__(self, network: Network, role: str = "pg") -> None:
        self._prefix = network.prefix(role)
        self.host = network.addresses[role]
        super().__init__()  # initdb: no network needed
        subnet = self.host.rsplit(".", 1)[0] + ".0/24"
        with open(self.data / "pg_hba.conf", "a") as hba:  # the fleet's hosts, no password
            hba.write(f"host all all {subnet} trust\n")
        self.port = POSTGRES_PORT
        self.url = f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def _run(self, argv: list[str]) -> None:
        if argv and argv[0] == self._pg_ctl:
            argv = [*self._prefix, *(["runuser", "-u", "postgres", "--"]
                                     if os.geteuid() == 0 else []), *argv]
            subprocess.run(argv, check=True, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            return
        super()._run(argv)

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses={self.host} "
                   "-c fsync=off -c max_connections=200")
        self._run([self._pg_ctl, "-D", str(self.data), "-o", options,
                   "-l", str(self.folder / "postgres.log"), "-w", "start"])


class GatewayHost:
    """``python -m triogate serve --workers N`` in ``role``'s namespace, on its address."""

    def __init__(self, network: Network, role: str, config: Path, log: Path, *,
                 workers: int = 2) -> None:
        self.network, self.role, self.log = network, role, log
        self.host = network.addresses[role]
        self.url = f"http://{self.host}:{GATEWAY_PORT}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOGATE_")}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [*network.prefix(role), sys.executable, "-m", "triogate", "serve",
                 "--config", str(config), "--host", self.host, "--port", str(GATEWAY_PORT),
                 "--workers", str(workers)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2) as http:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.role} exited: {self.log_tail()}")
                try:
                    if http.get(f"{self.url}/health/liveliness").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.role} not ready: {self.log_tail()}")
                time.sleep(0.1)

    def wait_settled(self, timeout_s: float = 60, *, replies: int = 8) -> None:
        """Until ``replies`` readiness answers in a row (any worker: the kernel spreads
        them) say Redis is connected and nothing is queued or journaled."""
        deadline = time.monotonic() + timeout_s
        good = 0
        with httpx.Client(timeout=5) as http:
            while good < replies:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.role} did not settle")
                body = http.get(f"{self.url}/health/readiness").json()
                settler = body["settler"]
                settled = body["redis"] == "connected" and not settler["queued"] and not (
                    settler["journal_pending"])
                good = good + 1 if settled else 0
                time.sleep(0.05 if settled else 0.2)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM to the supervisor (it forwards it to the workers); its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -1

    def kill(self) -> None:
        """SIGKILL the supervisor and every process left in the namespace."""
        for pid in self.network.pids(self.role):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
