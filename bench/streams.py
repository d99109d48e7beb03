"""Stream scale: thousands of long, mostly idle streams through one gateway worker.

    cc -O2 -o /tmp/streamtool-HASH bench/streamtool.c  # done by this script if missing
    python bench/streams.py --streams 4096 --rate 1024  # results/streams.{json,md}

Both ends are ``bench/streamtool.c`` (C, one epoll loop each), so that neither is the
bottleneck: the upstream answers every POST with ``--chunks`` content chunks
``--interval-ms`` apart (the first at once) plus finish, usage and [DONE]; the client opens
``--streams`` connections at ``--rate`` per second, POSTs one streaming chat completion on
each and reads it to [DONE], timing the first event from the request's send.

Runs, in one go: the client against the upstream alone (what the two ends cost, and the
baseline time to first event), then through the gateway (1 worker, governed: key, team
and end-user budgets, RPM/TPM, usage routing, the response cache) with ``--chunks``, then
with ``--baseline-chunks``. Per run: streams completed, time to first event p50/p99 and
added over the upstream alone, peak concurrent streams, CPU of every process, the
gateway's peak RSS. The gateway's CPU per forwarded chunk is the difference between the
two gateway runs divided by the difference in chunks (admission and settlement cancel
out). Accounting: the key's spend in Redis after the run must be exactly streams x
(10 prompt tokens x 1,000 + chunks x 2,000) nano-USD, with nothing left reserved.

With ``--relay``, before the gateway starts: the same two runs through ``streamtool
relay`` (C, one epoll loop: read the request, open an upstream connection, then one recv
and one send per upstream read, nothing parsed), the floor a gateway's CPU per chunk is
set against on this host; ``--relay-scan`` adds the relay searching each read for SSE
event boundaries. The relay's counters (system calls, reads) are read by SIGUSR1.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import load as L
import load_procs as procs
import load_report
import orjson
import psutil
import yaml

BENCH = Path(__file__).resolve().parent
# Named by its source's hash: another tree's streams.py (another streamtool.c) on the same
# host neither rebuilds it under a running benchmark nor runs it.
TOOL = Path("/tmp/streamtool-"
            + hashlib.sha256((BENCH / "streamtool.c").read_bytes()).hexdigest()[:12])
PROMPT_TOKENS = 10  # what streamtool's usage chunk reports
IN_NANOUSD, OUT_NANOUSD = 1_000, 2_000  # load.gateway_yaml's prices per token


def build_tool() -> Path:
    source = BENCH / "streamtool.c"
    if not TOOL.exists():
        subprocess.run(["cc", "-O2", "-o", f"{TOOL}.tmp", str(source)], check=True)
        Path(f"{TOOL}.tmp").rename(TOOL)
    return TOOL


def client(port: int, *, streams: int, rate: float, auth: str, model: str, chunks: int,
           timeout_s: float) -> dict[str, Any]:
    out = subprocess.run([str(TOOL), "client", str(port), str(streams), str(rate), auth, model,
                          str(chunks), str(timeout_s)], capture_output=True, check=True,
                         timeout=timeout_s + 30)
    result: dict[str, Any] = orjson.loads(out.stdout)
    return result


def relay_counters(relay: procs.Proc) -> dict[str, float]:
    """The relay's cumulative counters and own CPU: SIGUSR1 prints them to its log."""
    lines = len(relay.log.read_text().splitlines())
    relay.popen.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while len(text := relay.log.read_text().splitlines()) == lines:
        if time.monotonic() > deadline:
            raise procs.BenchError(f"relay gave no counters: {relay.log_tail()}")
        time.sleep(0.05)
    counters: dict[str, float] = orjson.loads(text[-1])
    return counters


def relay_runs(a: argparse.Namespace, logs: Path, base: dict[str, list[psutil.Process]],
               uport: int, common: dict[str, Any]) -> list[dict[str, Any]]:
    """The C relay's runs, --chunks then --baseline-chunks (and the same with scan)."""
    runs = []
    for variant in ["C relay", "C relay + scan"][:1 + a.relay_scan]:
        rport = procs.free_port()
        relay = procs.Proc.start("relay", [str(TOOL), "relay", str(rport), str(uport)]
                                 + ["scan"] * ("scan" in variant), logs)
        procs.wait_tcp(rport, relay)
        watch = {**base, "relay": [psutil.Process(relay.pid)]}
        try:
            for chunks in (a.chunks, a.baseline_chunks):
                before = relay_counters(relay)
                run = measured(f"{variant}, {chunks} chunks", watch,
                               lambda chunks=chunks, port=rport: client(
                                   port, auth=f"Bearer {L.UPSTREAM_KEY}", model="up-a",
                                   chunks=chunks, **common))
                after = relay_counters(relay)
                run["chunks"] = chunks
                run["relay_counters"] = {k: round(after[k] - before[k], 6) for k in after}
                runs.append(run)
        finally:
            relay.stop()
    return runs


def key_budget(url: str, key: str) -> dict[str, Any]:
    res = httpx.get(f"{url}/key/info", params={"key": key}, timeout=30,
                    headers={"authorization": f"Bearer {L.MASTER_KEY}"})
    res.raise_for_status()
    info: dict[str, Any] = res.json()
    return info


def _find_budget(info: Any) -> tuple[int | None, int | None]:
    """``spend_nanousd`` and ``reserved_nanousd`` wherever /key/info puts them."""
    if isinstance(info, dict):
        if "spend_nanousd" in info:
            return info.get("spend_nanousd"), info.get("reserved_nanousd")
        for value in info.values():
            found = _find_budget(value)
            if found != (None, None):
                return found
    return None, None


def measured(label: str, watch: dict[str, list[psutil.Process]], run: Any,
             profile_to: Path | None = None, profile_rate: int = 100) -> dict[str, Any]:
    procs.wait_idle(watch)
    canary = procs.canary_ms()
    spy = None
    if profile_to is not None:  # py-spy writes its file on SIGINT
        spy = subprocess.Popen(["py-spy", "record", "--format", "raw", "--rate",
                                str(profile_rate), "--gil", "-o", str(profile_to),
                                "-p", str(watch["gateway"][0].pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = procs.cpu_snapshot(watch)
    result: dict[str, Any] = run()
    procs.wait_idle(watch)
    after = procs.cpu_snapshot(watch)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    result["label"] = label
    result["canary_ms"] = canary
    result["cpu_s"] = {k: round(after[k] - before[k], 3) for k in watch}
    wall = after["wall"] - before["wall"]
    result["other_cpu_cores"] = round(
        (after["machine_processes"] - before["machine_processes"]
         - sum(result["cpu_s"].values()) - result["client_cpu_s"]) / wall, 2)
    t = result["ttft_us"]
    print(f"{label:<34} ok {result['ok']}/{result['streams']} peak {result['peak_open']} "
          f"ttft p50 {t['p50'] / 1000:.1f} p99 {t['p99'] / 1000:.1f} ms  "
          f"cpu {result['cpu_s']} client {result['client_cpu_s']} s", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--streams", type=int, default=4096)
    p.add_argument("--rate", type=float, default=1024, help="streams opened per second")
    p.add_argument("--chunks", type=int, default=100)
    p.add_argument("--baseline-chunks", type=int, default=10)
    p.add_argument("--interval-ms", type=float, default=50)
    p.add_argument("--timeout-s", type=float, default=180)
    p.add_argument("--profile", type=Path, default=None,
                   help="py-spy the worker during the full-chunk run (not timed: it slows "
                   "the worker), raw stacks to this file, a summary to the JSON")
    p.add_argument("--profile-rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--relay", action="store_true",
                   help="also run the two ends through `streamtool relay` (the C floor)")
    p.add_argument("--relay-scan", action="store_true",
                   help="with --relay, also through the relay that scans for SSE events")
    p.add_argument("--server", choices=("triogate", "hypercorn"), default="triogate",
                   help="the gateway's HTTP server (triogate serve --server)")
    p.add_argument("--out", type=Path, default=L.OUT)
    a = p.parse_args(argv)
    build_tool()
    work = Path(tempfile.mkdtemp(prefix="tg-streams-"))
    logs = work / "logs"
    logs.mkdir()
    redis, rport = procs.start_redis(logs)
    uport = procs.free_port()
    upstream = procs.Proc.start("streamtool-upstream", [str(TOOL), "upstream", str(uport),
                                                        str(a.interval_ms)], logs)
    procs.wait_tcp(uport, upstream)
    base = {"upstream": [psutil.Process(upstream.pid)], "redis": [psutil.Process(redis.pid)]}
    runs: list[dict[str, Any]] = []
    gateway = None
    try:
        common = {"streams": a.streams, "rate": a.rate, "timeout_s": a.timeout_s}
        runs.append(measured("upstream alone", base, lambda: client(
            uport, auth=f"Bearer {L.UPSTREAM_KEY}", model="up-a", chunks=a.chunks, **common)))
        if a.relay:
            runs += relay_runs(a, logs, base, uport, common)
        cfg = L.gateway_yaml(work / "state", f"http://127.0.0.1:{uport}")
        config = work / "gateway.yaml"
        # No refusals here: max_in_flight 0 (gateway_yaml), and the admission gate keeps
        # its 64 at a time but lets a stream wait as long as the run takes (its 5 s default
        # refused half the streams while the CPU-bound worker admitted 1,024 a second).
        cfg["triogate"]["max_admission_wait_s"] = a.timeout_s
        config.write_text(yaml.safe_dump(cfg))
        gateway, url = procs.start_gateway(logs, config=config, workers=1,
                                           redis_url=f"redis://127.0.0.1:{rport}",
                                           name="gateway", server=a.server)
        key = L.provision(url)
        watch = {**base, "gateway": procs.gateway_workers(gateway, 1)}
        # Warm-up (connections, scripts) with a chunk count the measured runs do not use:
        # the client's prompts repeat from run to run, so a measured run asking what the
        # warm-up asked would be answered from the response cache, unaccounted.
        warm = next(n for n in (5, 6, 7) if n not in (a.chunks, a.baseline_chunks))
        client(int(url.rsplit(":", 1)[1]), streams=64, rate=64, auth=f"Bearer {key}",
               model=L.GROUP, chunks=warm, timeout_s=60)
        gport = int(url.rsplit(":", 1)[1])
        spent: list[tuple[int | None, int | None]] = [_find_budget(key_budget(url, key))]
        for chunks in (a.chunks, a.baseline_chunks):
            run = measured(f"gateway, {chunks} chunks", watch, lambda chunks=chunks: client(
                gport, auth=f"Bearer {key}", model=L.GROUP, chunks=chunks, **common),
                profile_to=a.profile if chunks == a.chunks else None, profile_rate=a.profile_rate)
            time.sleep(2)  # the settler's last group commit
            spent.append(_find_budget(key_budget(url, key)))
            before, after = spent[-2], spent[-1]
            run["chunks"] = chunks
            run["spend_nanousd"] = (after[0] - before[0]) if after[0] is not None \
                and before[0] is not None else None
            run["expected_spend_nanousd"] = run["ok"] * (PROMPT_TOKENS * IN_NANOUSD
                                                         + chunks * OUT_NANOUSD)
            run["reserved_nanousd_after"] = after[1]
            run["gateway_peak_rss_kib"] = procs.peak_rss_kib(watch["gateway"][0].pid)
            runs.append(run)
    finally:
        if gateway is not None:
            gateway.stop()
        upstream.stop()
        redis.stop()
    results = summarise(a, runs)
    if a.profile is not None and a.profile.exists():
        results["profile"] = load_report.profile_summary(a.profile.read_text())
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "streams.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    (a.out / "streams.md").write_text(markdown(results))
    print((a.out / "streams.md").read_text())
    shutil.rmtree(work, ignore_errors=True)
    return 0


def per_chunk_us(a: argparse.Namespace, full: dict[str, Any], short: dict[str, Any],
                 part: str) -> tuple[float | None, float]:
    """``part``'s CPU per forwarded chunk: marginal (the two runs' difference over the
    difference in chunks) and all-in (the full run's CPU over its chunks)."""
    chunk_diff = (full["ok"] * a.chunks - short["ok"] * a.baseline_chunks)
    marginal = ((full["cpu_s"][part] - short["cpu_s"][part]) * 1e6 / chunk_diff
                if chunk_diff > 0 else None)
    return marginal, full["cpu_s"][part] * 1e6 / max(full["ok"] * a.chunks, 1)


def relay_summary(a: argparse.Namespace, alone: dict[str, Any], full: dict[str, Any],
                  short: dict[str, Any]) -> dict[str, Any]:
    marginal, all_in = per_chunk_us(a, full, short, "relay")
    counted = full["relay_counters"]
    chunks = max(full["ok"] * a.chunks, 1)
    syscalls = sum(counted[k] for k in ("epoll_waits", "recvs", "sends", "epoll_ctls",
                                        "accepts", "connects", "closes"))
    return {
        "streams_completed": f"{full['ok']}/{full['streams']}",
        "cpu_us_per_chunk_marginal": None if marginal is None else round(marginal, 2),
        "cpu_us_per_chunk_all_in": round(all_in, 2),
        "added_ttft_p99_ms": round((full["ttft_us"]["p99"] - alone["ttft_us"]["p99"]) / 1000, 2),
        "own_cpu_s": round(counted["user_s"] + counted["sys_s"], 3),
        "own_sys_share": round(counted["sys_s"] / max(counted["user_s"] + counted["sys_s"],
                                                      1e-9), 3),
        "syscalls_per_chunk_all_in": round(syscalls / chunks, 2),
        "upstream_reads_per_chunk": round(counted["up_reads"] / chunks, 3),
        "upstream_reads_per_epoll_wait": round(counted["up_reads"]
                                               / max(counted["epoll_waits"], 1), 1),
    }


def summarise(a: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    alone, full, short = runs[0], runs[-2], runs[-1]
    marginal, all_in = per_chunk_us(a, full, short, "gateway")
    upstream_events = alone["events"] or 1
    relays = [run for run in runs if "relay_counters" in run]
    relay = {run["label"].split(",")[0]: relay_summary(a, alone, run, relays[i + 1])
             for i, run in enumerate(relays) if run["chunks"] == a.chunks}
    return {
        "settings": {"streams": a.streams, "rate_per_s": a.rate, "chunks": a.chunks,
                     "baseline_chunks": a.baseline_chunks, "interval_ms": a.interval_ms,
                     "cpus": psutil.cpu_count()},
        "runs": runs,
        "goal": {
            "streams_completed": f"{full['ok']}/{full['streams']}",
            "peak_open_streams": full["peak_open"],
            "added_ttft_p99_ms": round((full["ttft_us"]["p99"] - alone["ttft_us"]["p99"]) / 1000,
                                       2),
            "gateway_cpu_us_per_chunk_marginal": None if marginal is None
            else round(marginal, 1),
            "gateway_cpu_us_per_chunk_all_in": round(all_in, 1),
            "gateway_peak_rss_mib": round(full["gateway_peak_rss_kib"] / 1024, 1),
            "accounted": full["spend_nanousd"] == full["expected_spend_nanousd"]
            and not full["reserved_nanousd_after"],
            "ends_alone_cpu_us_per_event": {
                "upstream": round(alone["cpu_s"]["upstream"] * 1e6 / upstream_events, 2),
                "client": round(alone["client_cpu_s"] * 1e6 / upstream_events, 2)},
        },
        **({"relay": relay} if relay else {}),
    }


def markdown(r: dict[str, Any]) -> str:
    s, g = r["settings"], r["goal"]
    lines = [
        "# Stream scale", "",
        f"{s['streams']} streaming chat completions opened at {s['rate_per_s']:g}/s; the "
        f"upstream (bench/streamtool.c) sends {s['chunks']} content chunks "
        f"{s['interval_ms']:g} ms apart; one gateway worker, governed; {s['cpus']} shared "
        "CPUs. Baseline run for the per-chunk cost: "
        f"{s['baseline_chunks']} chunks.", "",
        "| run | completed | peak open | TTFE p50 ms | TTFE p99 ms | stream p99 s "
        f"| CPU s gateway{' (or relay)' if 'relay' in r else ''} · upstream · redis · client "
        "| spend nUSD (expected) | reserved after "
        "| gateway peak RSS MiB | other CPU | canary ms |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|"]
    for run in r["runs"]:
        cpu = run["cpu_s"]
        lines.append(
            f"| {run['label']} | {run['ok']}/{run['streams']} (failed {run['failed']}, "
            f"status {run['bad_status']}, unfinished {run['unfinished']}) | {run['peak_open']} "
            f"| {run['ttft_us']['p50'] / 1000:.1f} | {run['ttft_us']['p99'] / 1000:.1f} "
            f"| {run['duration_us']['p99'] / 1e6:.2f} "
            f"| {cpu.get('gateway', cpu.get('relay', 0)):.2f} · {cpu['upstream']:.2f} · "
            f"{cpu['redis']:.2f} · "
            f"{run['client_cpu_s']:.2f} "
            f"| {run.get('spend_nanousd', '-')} ({run.get('expected_spend_nanousd', '-')}) "
            f"| {run.get('reserved_nanousd_after', '-')} "
            f"| {run.get('gateway_peak_rss_kib', 0) / 1024:.1f} | {run['other_cpu_cores']} "
            f"| {run['canary_ms']:.1f} |")
    lines += ["", "| open streams | measured | target |", "|---|---|---|",
              f"| every stream completes and is accounted | {g['streams_completed']}, "
              f"accounted exactly: {g['accounted']} | all |",
              f"| peak concurrent open streams | {g['peak_open_streams']} | 4,096 |",
              f"| added time to first event, p99 | {g['added_ttft_p99_ms']} ms | ≤ 50 ms |",
              f"| gateway CPU per forwarded chunk (marginal) | "
              f"{g['gateway_cpu_us_per_chunk_marginal']} µs (all-in, admission and settlement "
              f"included: {g['gateway_cpu_us_per_chunk_all_in']} µs) | ≤ 20 µs |",
              f"| gateway peak RSS | {g['gateway_peak_rss_mib']} MiB | ≤ 400 MiB |",
              f"| the two ends alone, CPU per event | upstream "
              f"{g['ends_alone_cpu_us_per_event']['upstream']} µs, client "
              f"{g['ends_alone_cpu_us_per_event']['client']} µs | not the bottleneck |", "",
              "TTFE: time from a request's send to its first SSE event at the client. "
              "Events per stream = chunks + finish + usage + [DONE]."]
    if "relay" in r:
        lines += ["", "| C relay (streamtool relay) | completed | CPU µs per chunk marginal "
                  "· all-in | added TTFE p99 ms | own CPU s (sys share) | system calls per "
                  "chunk, all-in | upstream reads per chunk | upstream reads per epoll_wait |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {name} | {v['streams_completed']} | {v['cpu_us_per_chunk_marginal']} · "
                  f"{v['cpu_us_per_chunk_all_in']} | {v['added_ttft_p99_ms']} "
                  f"| {v['own_cpu_s']} ({v['own_sys_share']:.0%}) "
                  f"| {v['syscalls_per_chunk_all_in']} | {v['upstream_reads_per_chunk']} "
                  f"| {v['upstream_reads_per_epoll_wait']} |" for name, v in r["relay"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
