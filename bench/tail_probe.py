"""Where the one-connection tail comes from (issue 13, goal 4).

    python bench/tail_probe.py

wrk at 1 connection (cache misses, then cache hits, twice) against one governed worker
whose collector passes over 1 ms are logged (``bench/gcprobe/sitecustomize.py`` on its
PYTHONPATH). Per request: the worker's and the upstream's CPU, the time they were
runnable but waiting for a CPU (``/proc/PID/schedstat``) and their time slices; wrk's
percentiles next to the gateway's own histogram.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import load as L
import load_procs as procs
import load_report as report
import yaml

BENCH = Path(__file__).resolve().parent


def sched(pid: int) -> tuple[int, int, int]:
    """CPU ns, run-queue wait ns, time slices (``/proc/PID/schedstat``)."""
    run, wait, slices = (int(x) for x in Path(f"/proc/{pid}/schedstat").read_text().split())
    return run, wait, slices


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="tg-tail-"))
    logs = work / "logs"
    logs.mkdir()
    os.environ["PYTHONPATH"] = os.pathsep.join([str(BENCH / "gcprobe"), str(BENCH.parent)])
    redis, rport = procs.start_redis(logs)
    up, upurl = procs.start_upstream(logs, latency_ms=20, api_key=L.UPSTREAM_KEY)
    config = work / "gw.yaml"
    config.write_text(yaml.safe_dump(L.gateway_yaml(work / "state", upurl)))
    gw, url = procs.start_gateway(logs, config=config, workers=1,
                                  redis_url=f"redis://127.0.0.1:{rport}", name="gw")
    try:
        key = L.provision(url)

        def env(fixed: bool) -> dict[str, str]:
            return {"WRK_AUTH": f"Bearer {key}", "WRK_MODEL": L.GROUP, "WRK_USER": L.END_USER,
                    "WRK_STREAM": "0", "WRK_FIXED": "1" if fixed else "0",
                    "WRK_RUN": os.urandom(4).hex()}

        chat = f"{url}/v1/chat/completions"
        procs.run_wrk(chat, connections=8, duration_s=3, env=env(False), out_dir=work)
        worker = procs.gateway_workers(gw, 1)[0].pid
        for fixed in (False, True, False, True):
            s0 = {"gateway": sched(worker), "upstream": sched(up.pid)}
            mark = len(gw.log.read_text().splitlines())
            m0 = procs.scrape(url)
            res = procs.run_wrk(chat, connections=1, duration_s=10, env=env(fixed), out_dir=work)
            m1 = procs.scrape(url)
            s1 = {"gateway": sched(worker), "upstream": sched(up.pid)}
            n = res["requests"]
            per = {k: (round((s1[k][0] - s0[k][0]) / 1e6 / n, 2),
                       round((s1[k][1] - s0[k][1]) / 1e6 / n, 2),
                       round((s1[k][2] - s0[k][2]) / n, 1)) for k in s0}
            pauses = [line for line in gw.log.read_text().splitlines()[mark:]
                      if line.startswith("gcprobe")]
            hist = report.histogram_quantiles(m1, m0, "triogate_request_duration_seconds",
                                              (0.5, 0.9, 0.99))
            lat = {k: round(v / 1000, 1) for k, v in res["latency_us"].items() if k != "mean"}
            print(f"{'hit ' if fixed else 'miss'} n={n} wrk ms {lat} gateway histogram {hist}")
            print(f"     per request (CPU ms, run-queue wait ms, slices): {per}; "
                  f"collector passes > 1 ms: {len(pauses)} {pauses[:5]}", flush=True)
    finally:
        gw.stop()
        up.stop()
        redis.stop()


if __name__ == "__main__":
    sys.exit(main())
