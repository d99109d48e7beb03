"""One gateway per source tree, for the benches that compare trees on one Redis and one
upstream (``task_steps.py``, ``loop_passes.py``, ``callgrind_req.py``).

Each tree gets ``load.py``'s governed configuration with a state folder of its own, a free
port, ``PYTHONPATH`` set to the tree (and ``PYTHONSAFEPATH``, so that the working directory
does not shadow it: the mistake ``ab.py``'s fix row in bench/README.md describes), and a
provisioned virtual key.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

import load as L
import load_procs as procs
import yaml

if TYPE_CHECKING:
    from pathlib import Path


def start(i: int, tree: str, *, work: Path, logs: Path, upstream_url: str, redis_port: int,
          settings: dict[str, Any] | None = None, env: dict[str, str] | None = None,
          command: list[str] | None = None, extra_args: tuple[str, ...] = (),
          ready_timeout_s: float = 30, settle_s: float = 1) -> tuple[procs.Proc, str, str]:
    """Start tree ``i``'s gateway; ``(process, url, key)`` once it answers.

    ``settings``: merged into the ``triogate:`` section. ``env``: added to the process's.
    ``command``: what runs ``triogate`` (default ``python -m triogate``; a launcher with
    an instrument, or valgrind in front of it).
    """
    cfg = L.gateway_yaml(work / f"state{i}", upstream_url)
    if "base" in tree:  # a base tree from before the setting existed
        cfg["triogate"].pop("max_in_flight", None)
    cfg["triogate"].update(settings or {})
    path = work / f"gw{i}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = procs.free_port()
    full_env = {**os.environ, "PYTHONPATH": tree, "PYTHONSAFEPATH": "1",
                "TRIOGATE_REDIS_URL": f"redis://127.0.0.1:{redis_port}",
                "TRIOGATE_LOG_LEVEL": "warning", **(env or {})}
    argv = [*(command or [sys.executable, "-m", "triogate"]), "serve", "--config", str(path),
            "--port", str(port), *extra_args]
    gateway = procs.Proc.start(f"gw{i}", argv, logs, env=full_env)
    procs.wait_tcp(port, gateway, timeout_s=ready_timeout_s)
    url = f"http://127.0.0.1:{port}"
    time.sleep(settle_s)
    return gateway, url, L.provision(url)
