"""Listen-queue overflows (the kernel's TcpExt counters, machine-wide) while wrk opens
4,096 connections to a gateway built from each tree, alternating, two rounds.

    python bench/listen_overflows.py /tmp/tree-before "$PWD"

Each gateway: 1 worker, governed, ``max_in_flight`` 256; wrk 8 s at 4,096 connections.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import load as L
import load_procs as procs
import yaml


def overflows() -> tuple[int, int]:
    lines = Path("/proc/net/netstat").read_text().splitlines()
    fields = dict(zip(lines[0].split(), lines[1].split(), strict=True))
    return int(fields["ListenOverflows"]), int(fields["ListenDrops"])


def main(trees: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="tg-backlog-"))
    logs = work / "logs"
    logs.mkdir()
    redis, rport = procs.start_redis(logs)
    up, upurl = procs.start_upstream(logs, latency_ms=20, api_key=L.UPSTREAM_KEY)
    try:
        for round_ in range(2):
            for i, tree in enumerate(trees):
                os.environ["PYTHONPATH"] = tree
                cfg = L.gateway_yaml(work / f"state-{round_}-{i}", upurl)
                cfg["triogate"]["max_in_flight"] = 256
                path = work / "gw.yaml"
                path.write_text(yaml.safe_dump(cfg))
                gw, url = procs.start_gateway(logs, config=path, workers=1,
                                              redis_url=f"redis://127.0.0.1:{rport}", name="gw")
                try:
                    key = L.provision(url)
                    env = {"WRK_AUTH": f"Bearer {key}", "WRK_MODEL": L.GROUP,
                           "WRK_USER": L.END_USER, "WRK_STREAM": "0", "WRK_FIXED": "0",
                           "WRK_RUN": os.urandom(4).hex()}
                    before = overflows()
                    res = procs.run_wrk(f"{url}/v1/chat/completions", connections=4096,
                                        duration_s=8, env=env, out_dir=work)
                    after = overflows()
                    print(f"r{round_} {tree}: listen overflows {after[0] - before[0]} drops "
                          f"{after[1] - before[1]}; answers {res['requests']}, refused "
                          f"{res['errors']['status']}, errors {res['errors']}, p50 "
                          f"{res['latency_us']['p50'] / 1000:.0f} ms, p99 "
                          f"{res['latency_us']['p99'] / 1000:.0f} ms", flush=True)
                finally:
                    gw.stop()
    finally:
        up.stop()
        redis.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
