"""Put on a gateway's PYTHONPATH by ``bench/tail_probe.py``: every collector pass over
1 ms is written to stderr (the gateway's log) as ``gcprobe gen<N> <ms> ms``."""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

# ``python -m triogate serve``: while site runs, argv is ``['-m', 'serve', ...]`` (the
# module's name is not in it yet), so look for ``-m`` too.
if "serve" in sys.argv and (sys.argv[0] == "-m" or any("triogate" in a for a in sys.argv)):
    _started = [0.0]

    def _pass(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - _started[0]) * 1000
        if ms > 1:
            sys.stderr.write(f"gcprobe gen{info['generation']} {ms:.1f} ms\n")
            sys.stderr.flush()

    gc.callbacks.append(_pass)
