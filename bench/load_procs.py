"""The processes of the load benchmark, and how to read them: start, wait, measure, stop.

Everything runs as a separate process on loopback: the Redis-compatible server (TCP),
the fake upstream, the delay proxy, the gateway (``python -m triogate serve``) and the
load generator (wrk). This module is plain synchronous Python; it never imports the
gateway's request path (only ``find_server_binary``, to use the same server binary the
gateway embeds).
"""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import orjson
import psutil

from triogate.redis_server import find_server_binary

BENCH_DIR = Path(__file__).resolve().parent
WRK_SCRIPT = BENCH_DIR / "wrk_chat.lua"
_START_TIMEOUT_S = 30.0


class BenchError(Exception):
    """Raised when a process does not start or a measurement cannot be taken."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_tcp(port: int, proc: Proc, timeout_s: float = _START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if proc.popen.poll() is not None:
                raise BenchError(f"{proc.name} exited: {proc.log_tail()}") from None
            if time.monotonic() > deadline:
                raise BenchError(f"{proc.name} did not listen on {port}") from None
            time.sleep(0.05)


@attrs.define
class Proc:
    """A child process with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, argv: list[str], log_dir: Path,
              env: dict[str, str] | None = None) -> Proc:
        log = log_dir / f"{name}.log"
        with log.open("ab") as out:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                     env=env, start_new_session=True)
        return cls(name, popen, log)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (a graceful drain for the gateway), then SIGKILL the whole group."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


# --------------------------------------------------------------------------- the parts


def start_redis(log_dir: Path) -> tuple[Proc, int]:
    port = free_port()
    proc = Proc.start("redis", [find_server_binary(), "--port", str(port), "--bind",
                                "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--daemonize", "no"], log_dir)
    wait_tcp(port, proc)
    return proc, port


def start_upstream(log_dir: Path, *, latency_ms: float, api_key: str) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc.start("upstream", [sys.executable, "-m", "triogate.testing.fakeupstream", "--port",
                                   str(port), "--latency-ms", str(latency_ms),
                                   "--api-key", api_key], log_dir)
    wait_tcp(port, proc)
    return proc, f"http://127.0.0.1:{port}"


@attrs.define
class Proxy:
    """The delay proxy in front of Redis; its delay can be changed while it runs."""

    proc: Proc
    port: int
    delay_file: Path

    def set_delay(self, delay_ms: float) -> None:
        """Change the delay; returns once the proxy has surely read it (it polls)."""
        self.delay_file.write_text(f"{delay_ms:g}")
        time.sleep(0.2)


def start_proxy(log_dir: Path, *, target_port: int, delay_ms: float) -> Proxy:
    port = free_port()
    delay_file = log_dir / f"proxy-{port}.delay"
    delay_file.write_text(f"{delay_ms:g}")
    proc = Proc.start("proxy", [
        sys.executable, str(BENCH_DIR / "delay_proxy.py"), "--target",
        f"127.0.0.1:{target_port}", "--delay-ms", str(delay_ms), "--port", str(port),
        "--delay-file", str(delay_file)], log_dir)
    wait_tcp(port, proc)
    return Proxy(proc, port, delay_file)


def wait_idle(watch: dict[str, list[psutil.Process]], *, cores: float = 0.05,
              timeout_s: float = 120.0) -> float:
    """Wait until the watched processes use less than ``cores`` CPU over two 0.25 s
    samples in a row (requests left in flight by the last run are done, the settler has
    drained); the seconds it took."""
    started = time.monotonic()
    procs = [p for ps in watch.values() for p in ps]
    quiet = 0
    last = cpu_s(procs)
    while quiet < 2 and time.monotonic() - started < timeout_s:
        time.sleep(0.25)
        now = cpu_s(procs)
        quiet = quiet + 1 if (now - last) / 0.25 < cores else 0
        last = now
    return time.monotonic() - started


def start_gateway(log_dir: Path, *, config: Path, workers: int, redis_url: str,
                  name: str, profile_to: Path | None = None,
                  server: str = "triogate") -> tuple[Proc, str]:
    """``python -m triogate serve`` (``--server``: ``server``); returns once
    ``/health/readiness`` answers 200.

    With ``profile_to``, the (single) worker runs under ``py-spy record`` (raw stacks;
    ``--gil``: only the thread holding the GIL is sampled, so idle threads do not count).
    """
    port = free_port()
    env = {**os.environ, "TRIOGATE_REDIS_URL": redis_url, "TRIOGATE_LOG_LEVEL": "warning"}
    argv = [sys.executable, "-m", "triogate", "serve", "--config", str(config), "--port",
            str(port), "--workers", str(workers), "--server", server]
    if profile_to is not None:
        argv = [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw",
                "--rate", "200", "--gil", "--output", str(profile_to), "--", *argv]
    proc = Proc.start(name, argv, log_dir, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            if httpx.get(f"{url}/health/readiness", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.popen.poll() is not None:
            raise BenchError(f"gateway exited: {proc.log_tail()}")
        if time.monotonic() > deadline:
            proc.stop()
            raise BenchError(f"gateway not ready: {proc.log_tail()}")
        time.sleep(0.1)


def start_litellm(log_dir: Path, *, litellm: Path, config: Path) -> tuple[Proc, str]:
    """The LiteLLM proxy (``litellm --config``, 1 worker) from its own virtualenv, for the
    side-by-side column; returns once ``/health/liveliness`` answers 200."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = Proc.start("litellm", [str(litellm), "--config", str(config), "--port", str(port),
                                  "--host", "127.0.0.1", "--num_workers", "1"], log_dir,
                      env={**env, "LITELLM_LOG": "ERROR"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health/liveliness", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.popen.poll() is not None:
            raise BenchError(f"litellm exited: {proc.log_tail()}")
        if time.monotonic() > deadline:
            proc.stop()
            raise BenchError(f"litellm not ready: {proc.log_tail()}")
        time.sleep(0.25)


def gateway_workers(proc: Proc, count: int) -> list[psutil.Process]:
    """The ``count`` processes that serve requests: the gateway itself (1 worker; under
    py-spy, its child), or the supervisor's ``--listen-fd`` children."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        root = psutil.Process(proc.pid)
        serving = [p for p in [root, *root.children(recursive=True)]
                   if "serve" in p.cmdline() and "py-spy" not in p.cmdline()[0]]
        workers = [p for p in serving if "--listen-fd" in p.cmdline()] if count > 1 else serving
        if len(workers) == count:
            return workers
        if time.monotonic() > deadline:
            raise BenchError(f"expected {count} gateway workers, found {len(workers)}")
        time.sleep(0.1)


def peak_rss_kib(pid: int) -> int:
    """VmHWM: the process's peak resident set size."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise BenchError(f"no VmHWM for {pid}")


def canary_ms() -> float:
    """Best of five timings of a fixed piece of pure-Python work, run while the benchmark
    is idle: a yardstick of the machine's speed at that moment (shared hosts vary)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        sum(i * i for i in range(200_000))
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 3)


def cpu_s(procs: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def cpu_snapshot(watch: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """CPU seconds (user + system) so far: of each watched part, of wrk (the children
    this process has reaped), and of the whole machine (processes; interrupts, which
    include the loopback traffic's softirq work), with the time.
    """
    out = {name: cpu_s(ps) for name, ps in watch.items()}
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["wrk"] = children.ru_utime + children.ru_stime
    machine = psutil.cpu_times()
    out["machine_processes"] = machine.user + machine.nice + machine.system
    out["machine_irq"] = getattr(machine, "irq", 0.0) + getattr(machine, "softirq", 0.0)
    out["wall"] = time.monotonic()
    return out


# --------------------------------------------------------------------------- Redis


def _resp(sock: socket.socket, command: bytes) -> bytes:
    sock.sendall(command)
    data = b""
    while b"\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n")
    if not head.startswith(b"$"):
        return head
    size = int(head[1:])
    while len(rest) < size + 2:
        rest += sock.recv(65536)
    return rest[:size]


def redis_stats(port: int) -> dict[str, int]:
    """Counters from one ``INFO all``: ``total_commands_processed`` (which counts the
    commands scripts run too), ``total_reads_processed``, ``cmdstat_<name>`` calls and
    ``usec_<name>``, the server's microseconds in that command (a script's include the
    commands it ran)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        text = _resp(sock, b"INFO all\r\n").decode()
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.startswith("cmdstat_"):
            out[name] = int(value.split("calls=")[1].split(",")[0])
            out["usec_" + name.removeprefix("cmdstat_")] = int(
                value.split("usec=")[1].split(",")[0])
        elif value.strip().lstrip("-").isdigit():
            out[name] = int(value)
    return out


def ping_rtt_ms(port: int, count: int = 300) -> float:
    """Median PING round trip on one connection (measures what a proxy adds)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            _resp(sock, b"PING\r\n")
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


# --------------------------------------------------------------------------- gateway


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def scrape(url: str) -> dict[str, float]:
    """``/metrics`` as ``{name{labels}: value}`` (one worker's view)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            out[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return out


def admin_post(url: str, master_key: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}{path}", json=body, timeout=30,
                          headers={"authorization": f"Bearer {master_key}"})
    if response.status_code != 200:
        raise BenchError(f"{path}: {response.status_code} {response.text}")
    return orjson.loads(response.content)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- wrk


def run_wrk(url: str, *, connections: int, duration_s: float, env: dict[str, str],
            out_dir: Path) -> dict[str, Any]:
    """One closed-loop wrk run (``connections`` keep-alive connections); its summary."""
    out = out_dir / f"wrk-{time.monotonic_ns()}.json"
    threads = min(2, connections)
    seconds = max(1, round(duration_s))  # wrk takes whole seconds only
    argv = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
            "--timeout", "30s", "-s", str(WRK_SCRIPT), url]
    result = subprocess.run(argv, env={**os.environ, **env, "WRK_OUT": str(out)},
                            capture_output=True, timeout=duration_s + 60, check=False)
    if result.returncode != 0 or not out.exists():
        raise BenchError(f"wrk failed ({result.returncode}): "
                         f"{(result.stderr or result.stdout).decode()[-2000:]}")
    summary: dict[str, Any] = orjson.loads(out.read_bytes())
    out.unlink()
    return summary
