"""The load benchmark's figures: per point, the tables, the plot, a profile summary.

Nothing here measures; everything is derived from what ``load.py`` recorded.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

# --------------------------------------------------------------------------- one point


def _diff(after: dict[str, float], before: dict[str, float], name: str) -> float | None:
    if name not in after:
        return None
    return after[name] - before.get(name, 0.0)


def _sum_prefix(samples: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix))


def summarise(wrk: dict[str, Any], *, variant: str, stream: bool, connections: int,
              cache: str, redis: tuple[dict[str, int], dict[str, int]],
              cpu: tuple[dict[str, float], dict[str, float]],
              metrics: tuple[dict[str, float], dict[str, float]]) -> dict[str, Any]:
    """One wrk run plus the counters read around it, as per-request figures."""
    requests = int(wrk["requests"])
    duration_s = wrk["duration_us"] / 1e6
    lat = wrk["latency_us"]
    errors = wrk["errors"]
    point: dict[str, Any] = {
        "variant": variant, "target": "direct" if variant == "direct" else "gateway",
        "mode": "stream" if stream else "json", "cache": cache, "connections": connections,
        "requests": requests, "duration_s": round(duration_s, 3),
        "rps": round(requests / duration_s, 1),
        "latency_ms": {k: round(lat[k] / 1000, 3) for k in ("min", "mean", "p50", "p90",
                                                              "p99", "max")},
        "errors": errors, "failed": sum(errors.values()),
    }
    m_before, m_after = metrics
    # Requests served in the window: the gateway's own count where /metrics sees every
    # worker; else wrk's count plus the one request per connection still in flight when
    # wrk stopped (the server finishes it; its commands land in the window).
    counted = _sum_prefix(m_after, "triogate_requests_total") - _sum_prefix(
        m_before, "triogate_requests_total") if m_after else None
    served = int(counted) if counted else requests + connections
    point["served"] = served
    point["served_counted_by"] = "gateway /metrics" if counted else "wrk + connections"
    before, after = redis
    if requests:
        # The INFO that took the first snapshot counts as one command and one read.
        commands = after["total_commands_processed"] - before["total_commands_processed"] - 1
        reads = after.get("total_reads_processed", 0) - before.get("total_reads_processed", 0)
        scripts = sum(after.get(f"cmdstat_{n}", 0) - before.get(f"cmdstat_{n}", 0)
                      for n in ("evalsha", "eval"))
        script_usec = sum(after.get(f"usec_{n}", 0) - before.get(f"usec_{n}", 0)
                          for n in ("evalsha", "eval"))
        point["redis_script_usec_per_request"] = round(script_usec / served, 2)
        point["redis_commands_per_request"] = round(commands / served, 3)
        point["redis_scripts_per_request"] = round(scripts / served, 3)
        point["redis_reads_per_request"] = round(max(reads - 1, 0) / served, 3)
        cpu_before, cpu_after = cpu
        used = {name: cpu_after[name] - cpu_before[name] for name in cpu_after}
        wall_s = used.pop("wall")
        machine_s, irq_s = used.pop("machine_processes"), used.pop("machine_irq")
        point["cpu_ms_per_request"] = {name: round(v * 1000 / served, 3)
                                       for name, v in used.items()}
        # Cores busy in processes outside the benchmark: other work on the machine.
        point["other_cpu_cores"] = round((machine_s - sum(used.values())) / wall_s, 2)
        point["irq_cpu_cores"] = round(irq_s / wall_s, 2)
    if m_after:
        flushes = _diff(m_after, m_before, "triogate_settler_flushes")
        batches = _diff(m_after, m_before, "triogate_settler_batches")
        waits: dict[str, float | None] = {}
        for phase in ("before", "after"):
            total = _diff(m_after, m_before,
                          f'triogate_redis_waits_per_request_sum{{phase="{phase}"}}')
            count = _diff(m_after, m_before,
                          f'triogate_redis_waits_per_request_count{{phase="{phase}"}}')
            waits[phase] = round(total / count, 3) if total is not None and count else None
        point["gateway"] = {
            "latency": histogram_quantiles(m_after, m_before,
                                           "triogate_request_duration_seconds"),
            "post_call_batches": batches, "settler_flushes": flushes,
            "settler_flushes_per_batch": (round(flushes / batches, 4)
                                          if flushes is not None and batches else None),
            "waits_per_request": waits,
            "degraded_decisions": _sum_prefix(m_after, "triogate_degraded_decisions_total")
            - _sum_prefix(m_before, "triogate_degraded_decisions_total"),
        }
    return point


def histogram_quantiles(after: dict[str, float], before: dict[str, float], name: str,
                        quantiles: tuple[float, ...] = (0.5, 0.99)) -> dict[str, Any]:
    """Upper bucket bounds (s) of ``quantiles`` of a /metrics histogram over the window,
    summed over its labels, and the number observed: the gateway's own view (for the
    overload point: the admitted requests only, since a refused one is never observed)."""
    per_le: dict[float, float] = {}
    for key, value in after.items():
        if key.startswith(name + "_bucket{"):
            le = key.split('le="')[1].split('"')[0]
            bound = float("inf") if le == "+Inf" else float(le)
            per_le[bound] = per_le.get(bound, 0.0) + value - before.get(key, 0.0)
    if not per_le:
        return {}
    bounds = sorted(per_le)
    total = per_le[bounds[-1]]
    out: dict[str, Any] = {"observed": int(total)}
    for q in quantiles:
        out[f"p{q * 100:g}_le_s"] = next(
            (b for b in bounds if total and per_le[b] >= q * total), None)
    return out


def one_line(p: dict[str, Any]) -> str:
    lat = p["latency_ms"]
    return (f"{p['variant']:<45} {p['mode']:<6} {p['cache']:<4} c={p['connections']:<4} "
            f"{p['rps']:>8.1f} req/s  p50 {lat['p50']:>8.2f} ms  p99 {lat['p99']:>8.2f} ms"
            f"  failed {p['failed']}")


def add_baselines(points: list[dict[str, Any]]) -> None:
    """Latency added and throughput ratio against the direct point of the same shape."""
    direct = {(p["mode"], p["connections"]): p for p in points if p["target"] == "direct"}
    for p in points:
        base = direct.get((p["mode"], p["connections"]))
        if p["target"] == "direct" or base is None:
            continue
        p["added_ms"] = {k: round(p["latency_ms"][k] - base["latency_ms"][k], 3)
                         for k in ("p50", "p90", "p99")}
        p["rps_vs_direct"] = round(p["rps"] / base["rps"], 3) if base["rps"] else None


# --------------------------------------------------------------------------- tables


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _rows(points: list[dict[str, Any]]) -> list[str]:
    lines = ["| target | conns | req/s | vs direct | p50 ms | p99 ms | added p50 | added p99 "
             "| CPU ms/req gw · up · redis | Redis scripts · cmds /req | Redis µs/req in scripts "
             "| Redis reads/req "
             "| waits/req before+after | settler flushes/batch | other CPU | canary ms "
             "| failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for p in points:
        cpu = p.get("cpu_ms_per_request", {})
        gw = p.get("gateway") or {}
        waits = gw.get("waits_per_request") or {}
        added = p.get("added_ms", {})
        waits_text = (f"{_f(waits.get('before'))}+{_f(waits.get('after'))}"
                      if waits else "-")
        lines.append(
            f"| {p['variant'].removeprefix('gateway, ')} | {p['connections']} | {p['rps']:.0f} "
            f"| {_f(p.get('rps_vs_direct'))} | {p['latency_ms']['p50']:.2f} "
            f"| {p['latency_ms']['p99']:.2f} | {_f(added.get('p50'))} | {_f(added.get('p99'))} "
            f"| {_f(cpu.get('gateway'))} · {_f(cpu.get('upstream'))} · {_f(cpu.get('redis'))} "
            f"| {_f(p.get('redis_scripts_per_request'), 1)} · "
            f"{_f(p.get('redis_commands_per_request'), 1)} "
            f"| {_f(p.get('redis_script_usec_per_request'), 1)} "
            f"| {_f(p.get('redis_reads_per_request'))} | {waits_text} "
            f"| {_f(gw.get('settler_flushes_per_batch'), 3)} | {_f(p.get('other_cpu_cores'))} "
            f"| {_f(p.get('canary_ms'), 1)} | {p['failed']} |")
    return lines


def _delay_table(points: list[dict[str, Any]], delay_ms: float,
                 rtt: dict[str, float]) -> list[str]:
    def find(variant_end: str, mode: str, c: int) -> dict[str, Any] | None:
        for p in points:
            if (p["variant"].endswith(variant_end) and p["mode"] == mode
                    and p["connections"] == c and p["cache"] == "miss"):
                return p
        return None

    added_rtt = rtt.get(f"proxy +{delay_ms:g} ms", 0) - rtt.get("proxy +0 ms", 0)
    lines = [f"| mode | conns | p50 Redis direct | p50 proxy +0 ms | p50 proxy +{delay_ms:g} ms "
             f"| p50 growth | growth ÷ added RTT | req/s direct · +0 · +{delay_ms:g} |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    conns = sorted({p["connections"] for p in points})
    for mode in ("json", "stream"):
        for c in conns:
            base = find("gateway, 1 worker", mode, c)
            zero = find("proxy +0 ms", mode, c)
            slow = find(f"proxy +{delay_ms:g} ms", mode, c)
            if not (base and zero and slow):
                continue
            growth = slow["latency_ms"]["p50"] - zero["latency_ms"]["p50"]
            # Above one connection the gateway is CPU-bound: latency is queueing there.
            per = _f(growth / added_rtt) if added_rtt > 0 and c == 1 else "n/a"
            lines.append(
                f"| {mode} | {c} | {base['latency_ms']['p50']:.2f} "
                f"| {zero['latency_ms']['p50']:.2f} | {slow['latency_ms']['p50']:.2f} "
                f"| {growth:+.2f} ms | {per} "
                f"| {base['rps']:.0f} · {zero['rps']:.0f} · {slow['rps']:.0f} |")
    return lines


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs."""
    if len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)


def sweep_summary(sweep: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: median p50 and mean latency per delay, and the slopes over the Redis
    round trip measured at each point (ms of latency per ms of round trip = waits on
    the request's latency path)."""
    out: dict[str, Any] = {}
    for mode in ("json", "stream"):
        mine = [p for p in sweep if p["mode"] == mode]
        if not mine:
            continue
        rows = []
        for delay in sorted({p["delay_ms"] for p in mine}):
            at = [p for p in mine if p["delay_ms"] == delay]
            rows.append({
                "delay_ms": delay,
                "redis_rtt_ms": round(statistics.median(p["redis_rtt_ms"] for p in at), 3),
                "p50_ms": round(statistics.median(p["latency_ms"]["p50"] for p in at), 3),
                "mean_ms": round(statistics.median(p["latency_ms"]["mean"] for p in at), 3),
                "runs": len(at),
                "other_cpu_cores_max": max(p.get("other_cpu_cores", 0) for p in at),
            })
        # Paired within each round (runs a few seconds apart): growth of p50 over the
        # +0 ms run of the same round, per ms of added round trip.
        zero = {p["round"]: p for p in mine if p["delay_ms"] == 0}
        for row in rows:
            pairs = [(p["latency_ms"]["p50"] - zero[p["round"]]["latency_ms"]["p50"],
                      p["redis_rtt_ms"] - zero[p["round"]]["redis_rtt_ms"])
                     for p in mine if p["delay_ms"] == row["delay_ms"] and p["round"] in zero]
            if row["delay_ms"] and pairs:
                row["p50_growth_ms"] = round(statistics.median(g for g, _ in pairs), 3)
                row["waits_on_path"] = round(statistics.median(g / r for g, r in pairs), 2)
        xs = [p["redis_rtt_ms"] for p in mine]
        p50 = slope(xs, [p["latency_ms"]["p50"] for p in mine])
        mean = slope(xs, [p["latency_ms"]["mean"] for p in mine])
        out[mode] = {"by_delay": rows,
                     "waits_on_path_from_p50": None if p50 is None else round(p50, 2),
                     "waits_on_path_from_mean": None if mean is None else round(mean, 2)}
    return out


def _sweep_lines(summary: dict[str, Any], rounds: int) -> list[str]:
    lines = ["| mode | delay added | Redis RTT ms | p50 ms | mean ms | p50 growth (paired) "
             "| growth ÷ added RTT | runs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, data in summary.items():
        for row in data["by_delay"]:
            growth = row.get("p50_growth_ms")
            lines.append(f"| {mode} | +{row['delay_ms']:g} ms | {row['redis_rtt_ms']:.3f} "
                         f"| {row['p50_ms']:.2f} | {row['mean_ms']:.2f} "
                         f"| {'-' if growth is None else f'{growth:+.2f} ms'} "
                         f"| {_f(row.get('waits_on_path'))} | {row['runs']} |")
    lines += ["", "| mode | waits on the latency path (slope of p50) | (slope of mean) |",
              "|---|---:|---:|"]
    for mode, data in summary.items():
        lines.append(f"| {mode} | {_f(data['waits_on_path_from_p50'])} "
                     f"| {_f(data['waits_on_path_from_mean'])} |")
    lines += ["", f"One connection, the delays interleaved over {rounds} round(s) of short "
              "runs, one gateway (no restart between delays). *Paired* growth compares each "
              "run with the +0 ms run of its own round (medians over rounds). The slope is "
              "ms of latency per ms of Redis round trip, fitted over every run. Both count "
              "the Redis waits a request's latency includes; the post-call wait is sent by "
              "the settler after the response, so it is not expected on the path."]
    return lines


def _find(points: list[dict[str, Any]], variant: str, c: int,
          mode: str = "json") -> dict[str, Any] | None:
    return next((p for p in points if p["variant"] == variant and p["connections"] == c
                 and p["mode"] == mode and p["cache"] == "miss"), None)


def goal_lines(points: list[dict[str, Any]]) -> list[str]:
    """The performance targets, each as the figure measured in this run against it."""
    gov, lite = "gateway, 1 worker", "litellm, 1 worker, master key"
    lines = ["| what | measured in this run | target |", "|---|---|---|"]
    g32, l32 = _find(points, gov, 32), _find(points, lite, 32)
    if g32 and l32:
        lines.append(
            f"| governed req/s per worker at c=32 vs LiteLLM (master key) | {g32['rps']:.0f} "
            f"vs {l32['rps']:.0f} req/s: **{g32['rps'] / l32['rps']:.1f}x**; CPU ms/req "
            f"{_f(g32['cpu_ms_per_request'].get('gateway'))} vs "
            f"{_f(l32['cpu_ms_per_request'].get('gateway'))} | ≥ 10x |")
    for c in (256, 1024):
        gc = _find(points, gov, c)
        if g32 and gc:
            cpu32 = g32["cpu_ms_per_request"].get("gateway")
            cpuc = gc["cpu_ms_per_request"].get("gateway")
            lines.append(
                f"| c={c} vs c=32, governed | req/s {gc['rps']:.0f} vs {g32['rps']:.0f}: "
                f"**{gc['rps'] / g32['rps']:.0%}**; CPU ms/req {_f(cpuc)} vs {_f(cpu32)} "
                f"({_f(cpuc / cpu32 if cpuc and cpu32 else None)}x) | ≥ 90 %, CPU flat |")
    g1, d1 = _find(points, gov, 1), _find(points, "direct", 1)
    if g1 and d1:
        gl, dl = g1["latency_ms"], d1["latency_ms"]
        lines.append(
            f"| added p99 at c=1, governed | {gl['p99']:.2f} - {dl['p99']:.2f} = "
            f"**{gl['p99'] - dl['p99']:+.2f} ms** (added p50 {gl['p50'] - dl['p50']:+.2f} ms) "
            "| ≤ 3 ms |")
    if g32:
        redis_ms = _f(g32["cpu_ms_per_request"].get("redis"), 3)
        lines.append(
            f"| Redis CPU per governed request, c=32 | **{redis_ms} "
            f"ms** of the server's CPU; {_f(g32.get('redis_script_usec_per_request'), 1)} µs in "
            f"scripts (INFO commandstats); {_f(g32.get('redis_scripts_per_request'), 1)} scripts, "
            f"{_f(g32.get('redis_commands_per_request'), 1)} commands | ≤ 0.1 ms |")
    over = [p for p in points if "max_in_flight" in p["variant"]]
    for p in over:
        lat = (p.get("gateway") or {}).get("latency") or {}
        ok = (p.get("gateway") or {}).get("post_call_batches")
        lines.append(
            f"| overload, c={p['connections']}, {p['variant'].split(', ')[-1]} | "
            f"{p['rps']:.0f} answers/s, {p['errors']['status']} refused (503) of "
            f"{p['requests']}; admitted (gateway histogram): {lat.get('observed', '-')}"
            f", p50 ≤ {_f(lat.get('p50_le_s'))} s, p99 ≤ {_f(lat.get('p99_le_s'))} s; "
            f"wrk p99 over all answers {p['latency_ms']['p99']:.0f} ms; "
            f"post-call batches {_f(ok)} | refused at once, admitted p99 bounded |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    s = results["settings"]
    points = results["points"]
    rtt = results["redis_ping_rtt_ms"]
    miss = [p for p in points if p["cache"] == "miss"]
    canaries = [p["canary_ms"] for p in [*points, *results.get("redis_delay_sweep", [])]
                if "canary_ms" in p] or [0.0]
    out = [
        "# Load benchmark", "",
        f"Upstream: `python -m triogate.testing.fakeupstream "
        f"--latency-ms {s['upstream_latency_ms']:g}`"
        f" (every answer waits {s['upstream_latency_ms']:g} ms). Load: wrk, closed loop, "
        f"{s['duration_s']:g} s per point after a {s['warmup_s']:g} s warm-up per gateway "
        f"start; every prompt unique (cache misses) except in the cache-hit table. "
        f"{s['cpus']} CPUs shared by wrk, gateway, upstream, Redis and proxy. "
        f"Latencies are to the last byte (streams read to their end). "
        f"Redis PING round trip: " + ", ".join(f"{k} {v:.3f} ms" for k, v in rtt.items())
        + f". Total run: {results['elapsed_s']:.0f} s.", "",
        "Machine speed during the run (a fixed piece of Python work timed before each "
        f"point, best of 5): {min(canaries):.2f} to {max(canaries):.2f} ms, median "
        f"{statistics.median(canaries):.2f} ms; the spread shows how much the shared host "
        "varied while this ran.", "",
    ]
    out += ["## Performance targets, measured in this run", "", *goal_lines(points), "",
            "The open-streams target (4,096 streams) is `bench/streams.py`'s run "
            "(`results/streams.md`).",
            ""]
    for mode, title in (("json", "Non-streaming"), ("stream", "Streaming")):
        out += [f"## {title} chat completions", "",
                *_rows([p for p in miss if p["mode"] == mode]), ""]
    hits = [p for p in points if p["cache"] == "hit"]
    if hits:
        out += ["## Response-cache hits (the same prompt every time; no upstream call)", "",
                *_rows(hits), ""]
    if any("proxy" in p["variant"] for p in points):
        out += [f"## Redis {s['redis_delay_ms']:g} ms further away (the delay proxy)",
                "", *_delay_table(points, s["redis_delay_ms"], rtt), "",
                "The same gateway process served the +0 ms and the delayed grid. *growth ÷ "
                "added RTT* (one connection only) estimates the waits on the latency path; "
                "above one connection the gateway is CPU-bound and the latency is queueing.",
                ""]
    if results.get("redis_delay_sweep_summary"):
        out += ["### Waits on the latency path: a one-connection sweep", "",
                *_sweep_lines(results["redis_delay_sweep_summary"], s["sweep_rounds"]), ""]
    out += ["## Peak RSS per worker process (VmHWM)", "",
            "| gateway | workers | peak RSS per worker (MiB) |", "|---|---:|---|"]
    for m in results["memory"]:
        rss = ", ".join(f"{k / 1024:.1f}" for k in m["peak_rss_kib"])
        out.append(f"| {m['variant'].removeprefix('gateway, ')} | {m['workers']} | {rss} |")
    out.append("")
    if results.get("profile"):
        out += ["## Where one worker's CPU goes (py-spy, 32 connections, non-streaming)", "",
                *profile_lines(results["profile"]), ""]
    out += [
        "## Reading these numbers", "",
        "* Columns: *vs direct* is req/s relative to the direct point of the same shape; "
        "*added* is gateway minus direct latency; CPU is per request, per process "
        "(gateway: all its workers), divided like the Redis figures by the requests served "
        "in the window (the gateway's count, or wrk's plus one in flight per connection "
        "when /metrics cannot see every worker); Redis figures come from the server's "
        "INFO: scripts = EVALSHA/EVAL calls, cmds = every command including those the scripts run, "
        "reads = network reads by the server (about one per pipeline); waits "
        "and settler flushes come from the gateway's /metrics (1-worker runs only: with 2 "
        "workers a scrape reaches one worker at random).",
        "* One machine, shared cores: at 32 and 256 connections every process competes for "
        "the same CPUs, so throughput is a CPU-share measurement and *added* latency is "
        "mostly queueing. Ratios measured within this run are meaningful; absolute values "
        "depend on the machine.",
        "* *other CPU*: cores kept busy by processes outside this benchmark during the "
        "point (the machine's user and system time minus the benchmark's processes and "
        "wrk's): interference from whatever else ran on the machine. Interrupt time "
        "(mostly the loopback traffic's softirq work) is in load.json as irq_cpu_cores.",
        "* *canary ms*: the machine-speed yardstick timed just before the point (lower is "
        "faster); compare rows with similar values.",
        "* wrk is closed-loop (no coordinated-omission correction); its latency is to the "
        "last byte of the response, which for streams is the end of the stream.",
    ]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- profile


_LINE = re.compile(r":\d+\)$")


def _frame(raw: str) -> str:
    return _LINE.sub(")", raw.strip())


def _path(frame: str) -> str:
    match = re.search(r"\(([^)]*)\)$", frame)
    return match.group(1) if match else frame


def _package(frame: str) -> str:
    """``trio``, ``httpcore``, ``triogate/batch``, ``stdlib:contextlib``..."""
    path = _path(frame).split("site-packages/")[-1]
    parts = path.split("/")
    if parts[0] == "triogate" and len(parts) > 2:
        return "/".join(parts[:2])
    if len(parts) > 1:
        return parts[0]
    return "stdlib:" + path.removesuffix(".py")


def profile_summary(raw: str, top: int = 20) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks → self time by function and by package, and
    inclusive time by triogate function, as shares of the samples after start-up."""
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = startup = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame(f) for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        if any("importlib" in f for f in frames):
            startup += count  # imports: start-up (nothing imports per request)
            continue
        total += count
        own[frames[-1]] += count
        packages[_package(frames[-1])] += count
        for frame in set(frames):
            if _path(frame).startswith("triogate/") and "__main__" not in frame \
                    and "cli.py" not in frame:
                inclusive[frame] += count

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(v / total, 4)) for k, v in counter.most_common(top)]

    return {"samples": total, "startup_samples_excluded": startup,
            "self_by_function": shares(own),
            "self_by_package": shares(packages), "inclusive_triogate": shares(inclusive)}


def profile_lines(profile: dict[str, Any]) -> list[str]:
    lines = [f"{profile['samples']} samples of the thread holding the GIL "
             f"({profile['startup_samples_excluded']} more, in imports at start-up, "
             "left out); shares of those samples.", "", "| self time by package | share |",
             "|---|---:|"]
    lines += [f"| {k} | {v:.1%} |" for k, v in profile["self_by_package"][:12]]
    lines += ["", "| self time by function | share |", "|---|---:|"]
    lines += [f"| `{k}` | {v:.1%} |" for k, v in profile["self_by_function"][:15]]
    lines += ["", "| inclusive time, triogate functions | share |", "|---|---:|"]
    lines += [f"| `{k}` | {v:.1%} |" for k, v in profile["inclusive_triogate"][:15]]
    return lines


# --------------------------------------------------------------------------- files


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in results["points"] if p["cache"] == "miss"]
    variants = list(dict.fromkeys(p["variant"] for p in points))
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True)
    for row, (mode, title) in enumerate((("json", "non-streaming"), ("stream", "streaming"))):
        panels: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
            ("p50 latency (ms)", lambda p: p["latency_ms"]["p50"]),
            ("p99 latency (ms)", lambda p: p["latency_ms"]["p99"]),
            ("requests/s", lambda p: p["rps"]),
        ]
        for col, (label, value) in enumerate(panels):
            ax = axes[row][col]
            for variant in variants:
                mine = sorted((p for p in points if p["variant"] == variant
                               and p["mode"] == mode), key=lambda p: p["connections"])
                if mine:
                    ax.plot([p["connections"] for p in mine], [value(p) for p in mine],
                            marker="o", linestyle="--" if variant == "direct" else "-",
                            label=variant)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            conns = sorted({p["connections"] for p in points})
            ax.set_xticks(conns, [str(c) for c in conns])
            ax.set_xlabel("concurrent connections")
            ax.set_title(f"{title}: {label}")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    s = results["settings"]
    fig.suptitle(f"triogate vs direct upstream ({s['upstream_latency_ms']:g} ms upstream "
                 f"latency, {s['cpus']} shared CPUs, governance on)")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    add_baselines(results["points"])
    paths = {"json": out_dir / "load.json", "md": out_dir / "load.md",
             "png": out_dir / "load.png"}
    if results.get("redis_delay_sweep"):
        results["redis_delay_sweep_summary"] = sweep_summary(results["redis_delay_sweep"])
    paths["json"].write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    paths["md"].write_text(markdown(results))
    plot(results, paths["png"])
    return paths
