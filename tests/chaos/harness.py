"""A real deployment in miniature, for money checks under faults (tests/chaos and
bench/soak.py): a redis-server with AOF and ``appendfsync always`` that can be killed,
paused, restarted (also slowly, answering LOADING) and have its clients killed; gateway
processes (``python -m triogate serve``) sharing it and one SQLite database; load
clients; and :func:`money_check`, which compares, for every key, team and end user, the
spend Redis holds with the sum of the spend-log rows, to the nano-dollar.

Counters are read through the gateway's own key builders (``governance/keys.py``), and
money only through spend counters, holds, leases and parallel slots (never markers).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import yaml

from triogate.batch import BackendUnavailable, ClusterBackend, RespBackend
from triogate.governance.keys import PARALLEL, budget_keys, rate_window_key
from triogate.store.records import hash_key

MASTER_KEY = "sk-chaos-master"
UPSTREAM_KEY = "sk-upstream-chaos"
USD = 1_000_000_000
#: Keys loaded into Redis before the slow restart, and the load delay per key (µs):
#: one to two seconds of LOADING (the delay costs ~100 µs a key whatever its value).
PAD_KEYS = 15_000
KEY_LOAD_DELAY_US = 10


def redis_binary() -> str | None:
    """``redis-server`` on PATH (the tests skip without it)."""
    return shutil.which("redis-server")


class AofRedis:
    """A redis-server on a unix socket with AOF, ``appendfsync always``; kill -9 safe."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.socket = folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self, *, slow_load: bool = False) -> None:
        """Start it (forked on the loop's thread) and poll, without blocking the loop, until
        its socket exists."""
        binary = redis_binary()
        assert binary is not None
        argv = [binary, "--port", "0", "--unixsocket", str(self.socket), "--dir",
                str(self.folder), "--appendonly", "yes", "--appendfsync", "always",
                "--save", "", "--daemonize", "no", "--enable-debug-command", "local",
                "--logfile", str(self.folder / "redis.log")]
        if slow_load:
            argv += ["--key-load-delay", str(KEY_LOAD_DELAY_US),
                     "--loading-process-events-interval-bytes", "1024"]
        self.socket.unlink(missing_ok=True)
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with trio.fail_after(10):
            while not self.socket.exists():
                assert self.process.poll() is None, "redis-server exited at start"
                await trio.sleep(0.005)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def wait_loaded(backend: RespBackend, timeout_s: float = 30) -> float:
    """Poll ``INFO persistence`` until ``loading:0``; return how long it took (s)."""
    started = trio.current_time()
    with trio.fail_after(timeout_s):
        while True:
            try:
                (info,) = await backend.execute([("INFO", "persistence")])
                if isinstance(info, bytes) and b"loading:0" in info.split():
                    return trio.current_time() - started
            except BackendUnavailable:
                pass  # down or restarting: poll again
            await trio.sleep(0.05)


async def pad_and_rewrite(backend: RespBackend) -> None:
    """Give the server a data set that takes a while to load, persisted in the AOF base."""
    await backend.execute([("DEBUG", "POPULATE", PAD_KEYS, "pad", 16)])
    await backend.execute([("BGREWRITEAOF",)])
    with trio.fail_after(30):
        while True:
            (info,) = await backend.execute([("INFO", "persistence")])
            assert isinstance(info, bytes)
            if b"aof_rewrite_in_progress:0" in info and b"aof_rewrite_scheduled:0" in info:
                return
            await trio.sleep(0.05)


def postgres_binaries() -> tuple[str, str] | None:
    """``initdb`` and ``pg_ctl`` on PATH, and a ``postgres`` user to run them as when this
    process is root (the PostgreSQL tests skip without them)."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb is None or pg_ctl is None:
        return None
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return None
    return initdb, pg_ctl


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (initdb in a temporary folder of its own, which
    the ``postgres`` user can reach when we are root; a free port; trust authentication)
    that it may stop abruptly and start again. The shared server other tests use is never
    touched. :meth:`stop` removes the folder."""

    def __init__(self) -> None:
        binaries = postgres_binaries()
        assert binaries is not None
        self._initdb, self._pg_ctl = binaries
        self.folder = folder = Path(tempfile.mkdtemp(prefix="triogate-pg-"))
        self.data = folder / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres")
        self._run([self._initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres",
                   "--no-sync", "-E", "UTF8"])

    def _run(self, argv: list[str]) -> None:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off")
        self._run([self._pg_ctl, "-D", str(self.data), "-o", options,
                   "-l", str(self.folder / "postgres.log"), "-w", "start"])

    def crash(self) -> None:
        """Stop at once, as a crash would (``-m immediate``: no checkpoint, clients cut)."""
        self._run([self._pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run([self._pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"])
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, *, state: Path, redis_url: str, database: Path | str,
                 upstream_url: str, redis: dict[str, Any] | None = None) -> None:
    """A gateway's YAML; ``database`` is a SQLite file, or a PostgreSQL URL."""
    database_url = database if isinstance(database, str) else f"sqlite:///{database}"
    priced = {"input_cost_per_token": "0.000001", "output_cost_per_token": "0.000002",
              "api_base": f"{upstream_url}/v1", "api_key": UPSTREAM_KEY}
    path.write_text(yaml.safe_dump({
        "model_list": [
            {"model_name": "gpt-chaos", "litellm_params": {"model": "openai/up-a", **priced},
             "model_info": {"id": "a"}},
            {"model_name": "gpt-chaos", "litellm_params": {"model": "openai/up-b", **priced},
             "model_info": {"id": "b"}},
        ],
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 1},
        "general_settings": {"master_key": MASTER_KEY,
                             "database_url": database_url},
        "triogate": {"state_dir": str(state), "redis": {"url": redis_url, "timeout_s": 0.5,
                                                         **(redis or {})},
                     "policies": {"budgets": "fail-open", "rate_limits": "fail-open"},
                     "shutdown_grace_s": 10},
    }))


class GatewayProcess:
    """``python -m triogate serve`` on a port of its own; logs to a file."""

    def __init__(self, config: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIOGATE_")}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "triogate", "serve", "--config", str(config),
                 "--port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)

    async def wait_ready(self, timeout_s: float = 30) -> None:
        with trio.fail_after(timeout_s):
            async with httpx.AsyncClient(timeout=2) as http:
                while True:
                    assert self.process.poll() is None, self.log.read_text()[-3000:]
                    try:
                        if (await http.get(f"{self.url}/health/liveliness")).status_code == 200:
                            return
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.1)

    async def wait_settled(self, timeout_s: float = 30) -> dict[str, Any]:
        """Until Redis is ready and nothing is queued or journaled; the readiness body."""
        with trio.fail_after(timeout_s):
            async with httpx.AsyncClient(timeout=5) as http:
                while True:
                    body = (await http.get(f"{self.url}/health/readiness")).json()
                    settler = body["settler"]
                    if body["redis"] == "connected" and not settler["queued"] and not (
                        settler["journal_pending"]
                    ):
                        return dict(body)
                    await trio.sleep(0.1)

    async def metrics(self) -> str:
        async with httpx.AsyncClient(timeout=5) as http:
            return (await http.get(f"{self.url}/metrics")).text

    async def stop(self, timeout_s: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return await trio.to_thread.run_sync(self.process.wait, timeout_s)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@attrs.define
class Principals:
    """What the load spends against: raw keys with their hashes, teams, end users."""

    keys: list[str] = attrs.Factory(list)
    key_hashes: list[str] = attrs.Factory(list)
    teams: list[str] = attrs.Factory(list)
    end_users: list[str] = attrs.Factory(list)


async def create_principals(url: str, *, teams: int = 2, keys_per_team: int = 2,
                            end_users: int = 3) -> Principals:
    """Teams, keys and end users with budgets (large: nothing is refused), through the
    admin API; keys also get RPM/TPM and parallel limits, so every window is in play."""
    made = Principals()
    headers = {"authorization": f"Bearer {MASTER_KEY}"}
    async with httpx.AsyncClient(timeout=20, headers=headers) as http:
        for t in range(teams):
            team = await http.post(f"{url}/team/new", json={
                "team_alias": f"chaos-team-{t}", "max_budget": 1000})
            assert team.status_code == 200, team.text
            made.teams.append(team.json()["team_id"])
            for _ in range(keys_per_team):
                key = await http.post(f"{url}/key/generate", json={
                    "team_id": made.teams[-1], "max_budget": 1000, "rpm_limit": 1_000_000,
                    "tpm_limit": 1_000_000_000, "max_parallel_requests": 1000})
                assert key.status_code == 200, key.text
                made.keys.append(key.json()["key"])
                made.key_hashes.append(hash_key(made.keys[-1]))
        for u in range(end_users):
            user_id = f"chaos-end-user-{u}"
            end_user = await http.post(f"{url}/customer/new", json={
                "user_id": user_id, "max_budget": 1000})
            assert end_user.status_code == 200, end_user.text
            made.end_users.append(user_id)
    return made


@attrs.define
class LoadStats:
    """What the clients saw."""

    sent: int = 0
    statuses: dict[int, int] = attrs.Factory(lambda: defaultdict(int))
    transport_errors: int = 0
    disconnects: int = 0
    streams: int = 0


async def client_loop(urls: list[str], made: Principals, stats: LoadStats, stop: trio.Event,
                      *, seed: int, stream_share: float = 0.3,
                      disconnect_share: float = 0.0) -> None:
    """Requests back to back until ``stop``: random gateway, key, end user; some streams,
    some abandoned mid-stream (the client disconnects)."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=30) as http:
        while not stop.is_set():
            url = rng.choice(urls)
            key = rng.choice(made.keys)
            body: dict[str, Any] = {
                "model": "gpt-chaos", "user": rng.choice(made.end_users),
                "max_tokens": rng.randint(4, 24),
                "messages": [{"role": "user", "content": f"chaos {rng.random()}"}]}
            headers = {"authorization": f"Bearer {key}"}
            stats.sent += 1
            try:
                if rng.random() < stream_share:
                    body["stream"] = True
                    stats.streams += 1
                    async with http.stream("POST", f"{url}/v1/chat/completions", json=body,
                                           headers=headers) as response:
                        stats.statuses[response.status_code] += 1
                        abandon = rng.random() < disconnect_share
                        async for _ in response.aiter_bytes():
                            if abandon:
                                stats.disconnects += 1
                                break
                else:
                    response = await http.post(f"{url}/v1/chat/completions", json=body,
                                               headers=headers)
                    stats.statuses[response.status_code] += 1
            except httpx.TransportError:
                stats.transport_errors += 1


@attrs.define
class MoneyReport:
    """The outcome of :func:`money_check`."""

    rows: int
    principals: int
    spend_nanousd: int
    discrepancies: list[str]


def spend_log_sums(database: Path | str) -> tuple[int, dict[tuple[str, str], int]]:
    """Row count, and the sum of ``cost_nanousd`` per (kind, id) over every row, from a
    SQLite file or a PostgreSQL URL."""
    sums: dict[tuple[str, str], int] = defaultdict(int)
    query = "SELECT key_hash, team_id, end_user, cost_nanousd FROM spend_logs"
    if isinstance(database, str):
        import psycopg

        with psycopg.connect(database) as pg:
            rows = pg.execute(query).fetchall()
    else:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
            rows = db.execute(query).fetchall()
    for key_hash, team_id, end_user, cost in rows:
        for kind, ident in (("key", key_hash), ("team", team_id), ("end_user", end_user)):
            if ident is not None:
                sums[(kind, ident)] += int(cost)
    return len(rows), sums


async def money_check(redis_url: str, database: Path | str, made: Principals) -> MoneyReport:
    """For every key, team and end user: Redis spend == sum of spend-log rows, nothing
    reserved or held, no lease, no parallel slot. Read with the gateway's key builders
    (from a Redis Cluster's primaries when ``redis_url`` names one)."""
    rows, sums = await trio.to_thread.run_sync(spend_log_sums, database)
    principals = ([("key", h) for h in made.key_hashes] + [("team", t) for t in made.teams]
                  + [("end_user", u) for u in made.end_users])
    backend: RespBackend | ClusterBackend
    if ClusterBackend.is_cluster_url(redis_url):
        backend = ClusterBackend(redis_url, command_timeout_s=5)
    else:
        backend = RespBackend(redis_url, command_timeout_s=5)
    discrepancies: list[str] = []
    total = 0
    try:
        for kind, ident in principals:
            keys = budget_keys(kind, ident, 0)
            spend, reserved, holds, leases, parallel = await backend.execute([
                ("HGET", keys.counters, "spend"), ("HGET", keys.counters, "reserved"),
                ("HLEN", keys.holds), ("ZCARD", keys.leases),
                ("ZCARD", rate_window_key(kind, ident, PARALLEL))])
            redis_spend = int(spend) if isinstance(spend, bytes) else 0
            logged = sums.get((kind, ident), 0)
            total += logged
            name = f"{kind} {ident[:16]}"
            if redis_spend != logged:
                discrepancies.append(f"{name}: Redis spend {redis_spend} != logs {logged} "
                                     f"(diff {redis_spend - logged} nano-USD)")
            if reserved not in (None, b"0"):
                discrepancies.append(f"{name}: {reserved!r} nano-USD still reserved")
            if holds or leases:
                discrepancies.append(f"{name}: {holds} holds, {leases} leases left")
            if parallel:
                discrepancies.append(f"{name}: {parallel} parallel slots held")
    finally:
        await backend.aclose()
    return MoneyReport(rows=rows, principals=len(principals), spend_nanousd=total,
                       discrepancies=discrepancies)
