"""Redis CPU of a governed request's scripts, two or more trees interleaved on ONE server.

A gateway-driven run (``bench/redis_cpu.py``) measures the server while a gateway shares
the host's two cores with it and with other work: its figures move by ±20 % between runs.
This bench takes the gateway out: it loads every tree's scripts into one private server
and replays the script sequence of a governed request (``script_instructions.request``:
routing_state, rate_admit x3, budget_reserve x3, budget_settle x3, rate_settle, routing
_record at base; a key and a team with budgets and RPM/TPM, an end user with a budget and RPM),
each tree under its own principals' hash tags (``--principals``: how many of each kind
the requests are spread over), in blocks of ``--block`` requests sent as
one pipeline per request, the trees alternating block by block. The server's own CPU
(utime + stime from /proc) and INFO commandstats are read around every block; the
figures are the median over blocks of µs per request. Where a tree's Python side sends
fewer scripts (w5-redis: no rate_settle where an admitted request changes nothing, and a
principal's rate windows settled by its budget_settle; w6-redis: its windows admitted by
its budget_reserve), the sequence follows the tree (detected from its source).

    python bench/script_ab.py /tmp/base-redis /work/wt/redis --blocks 20 --block 500
    python bench/script_ab.py A B --server /usr/bin/redis-server
    python bench/script_ab.py A B B@nomerge --group-instructions 256 --group 8

``--group G``: G requests' pre-call calls, then their post-call calls as one flush (a
settler group commit), one principal's settlements merged into one
``budget_settle_many.lua`` call where a tree has it (every group of 2 or more: the
gateway itself merges from 4). ``--group-instructions N``: callgrind instructions per
request over N requests so grouped, per tree, deterministic.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import valkey

sys.path.insert(0, str(Path(__file__).resolve().parent))

NAMES = ("routing_state", "rate_admit", "budget_reserve", "budget_settle", "rate_settle",
         "routing_record")
#: (kind, rate windows, budget TTL ms): TTL 0 is a lifetime budget.
PRINCIPALS = (("key", (("r", 10**6), ("t", 10**9)), 172_799_525),
              ("team", (("r", 10**6), ("t", 10**9)), 2_678_399_525),
              ("eu", (("r", 10**6),), 0))


class Tree:
    def __init__(self, path: Path, index: int, client: valkey.Valkey, principals: int) -> None:
        self.path, self.index, self.principals = path, index, principals
        lua = path / "triogate" / "lua"
        self.sha = {n: client.script_load((lua / f"{n}.lua").read_text()) for n in NAMES}
        self.recs = "recs:" in (lua / "routing_record.lua").read_text()
        rate_limits = (path / "triogate" / "governance" / "rate_limits.py").read_text()
        self.skips_plain_settle = "Nothing to change at this principal" in rate_limits
        self.merged = (path / "triogate" / "governance" / "settle.py").exists()
        #: w6-redis: a principal's rate windows admitted by its budget_reserve call
        self.merged_admit = (path / "triogate" / "governance" / "admit.py").exists()
        #: w5-agg: one principal's settlements of a settler flush in one call
        many = lua / "budget_settle_many.lua"
        self.many = client.script_load(many.read_text()) if many.exists() else None

    def request(self, p: valkey.client.Pipeline, i: int) -> None:
        sha, now = self.sha, int(time.time() * 1000)
        rid, minute, bucket = f"r{i:08d}{now}", now // 60_000, now // 1000
        g = f"tg:{{rt:g{self.index}}}"
        p.evalsha(sha["routing_state"], 5, f"{g}:usage:{minute}", f"{g}:cooldown",
                  f"{g}:latency", f"{g}:inflight:a", f"{g}:inflight:b", now, "read", rid,
                  600_000, 300, i % 2, "a", 0, 0, "b", 0, 0)
        who = f"x{self.index}-{i % self.principals}"
        tags = [f"tg:{{{kind}:{who}}}" for kind, _, _ in PRINCIPALS]
        for t, (_, wins, _) in zip(tags, PRINCIPALS, strict=True):
            if self.merged_admit:
                continue
            keys = [f"{t}:rl:rpm", f"{t}:rl:tpm"][: len(wins)]
            p.evalsha(sha["rate_admit"], len(keys), *keys, now, rid, 222, 600_000,
                      *[v for w in wins for v in w])
        for t, (_, wins, ttl) in zip(tags, PRINCIPALS, strict=True):
            b = f"{t}:bud:7"
            keys = [b, f"{b}:res", f"{b}:exp"]
            args = [now, rid, 39_000, 10**15, 600_000, ttl]
            if self.merged_admit:
                # the principal's windows admitted with its budget (governance/admit.py)
                keys += [f"{t}:rl:rpm", f"{t}:rl:tpm"][: len(wins)]
                args += [222, *[v for w in wins for v in w]]
            p.evalsha(sha["budget_reserve"], len(keys), *keys, *args)
        for t, (_, wins, ttl) in zip(tags, PRINCIPALS, strict=True):
            b = f"{t}:bud:7"
            keys = [b, f"{b}:res", f"{b}:exp", f"{t}:bud:done:{minute}"]
            args: list[object] = [rid, 35_000, ttl, 660_000]
            if self.merged and any(w[0] != "r" for w in wins):
                # the principal's windows ride with its budget settlement (governance/settle.py)
                keys += [f"{t}:rl:rpm", f"{t}:rl:tpm"][: len(wins)]
                args += ["a", bucket, 222, 200, now, *[w[0] for w in wins]]
            p.evalsha(sha["budget_settle"], len(keys), *keys, *args)
        for t, (_, wins, _) in zip(tags, PRINCIPALS, strict=True):
            if self.skips_plain_settle and all(w[0] == "r" for w in wins):
                continue
            if self.merged:
                continue
            keys = [f"{t}:rl:rpm", f"{t}:rl:tpm"][: len(wins)]
            p.evalsha(sha["rate_settle"], len(keys) + 1, *keys, f"{t}:rl:done:{minute}", rid,
                      "a", bucket, 222, 200, now, 660_000, *[w[0] for w in wins])
        marker = f"{g}:recs:{minute}" if self.recs else f"{g}:rec:{rid}"
        p.evalsha(sha["routing_record"], 4, marker, f"{g}:usage:{minute}", f"{g}:cooldown",
                  f"{g}:latency", now, rid, 660_000 if self.recs else 600_000, 120_000, 3,
                  5000, "0.3", 3_600_000, "a" if i % 2 else "b", "ok", 21, "0.077")


class _Recorder:
    """Stands in for a pipeline: keeps the EVALSHA calls of one request."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def evalsha(self, *args: object) -> None:
        self.calls.append(args)


def per_script(client: valkey.Valkey, trees: list[Tree], requests: int) -> None:
    """µs per call of each script (commandstats around every call, one call at a time: the
    caches are colder than in a pipeline, so read the figures side by side only)."""
    for tree in trees:
        usec: dict[str, list[int]] = {}
        for i in range(requests + 200):
            recorder = _Recorder()
            tree.request(recorder, 10**9 + i)  # type: ignore[arg-type]
            for call in recorder.calls:
                name = _name(tree, call)
                before = evalsha_usec(client)
                client.evalsha(*call)  # type: ignore[arg-type]
                if i >= 200:
                    usec.setdefault(name, []).append(evalsha_usec(client) - before)
        print(f"{tree.path}, per script (µs per call, calls per request):")
        for name, values in sorted(usec.items()):
            mean, per_request = statistics.mean(values), len(values) / requests
            print(f"    {name:22s} {mean:6.2f} µs  x{per_request:.0f}")


def _name(tree: Tree, call: tuple[object, ...]) -> str:
    name = {sha: n for n, sha in tree.sha.items()}[str(call[0])]
    if name == "budget_settle" and int(call[1]) > 4:  # type: ignore[call-overload]
        return "budget_settle+windows"
    if name == "budget_reserve" and int(call[1]) > 3:  # type: ignore[call-overload]
        return "budget_reserve+windows"
    return name


def per_script_instructions(paths: list[Path], server_bin: str, requests: int,
                            batch: int = 50) -> None:
    """Instructions per call of each script, deterministic: for each tree and script, a
    fresh server under callgrind with instrumentation off; requests run in batches of
    ``batch`` (every request's calls before that script, then -- instrumented -- its calls,
    then the rest), so the count covers exactly those calls (command parsing, EVALSHA,
    the Lua body, its redis.calls, the reply)."""
    for path in paths:
        with tempfile.TemporaryDirectory(prefix="triogate-sab-cg-") as work:
            probe_sock = f"{work}/probe.sock"
            probe = subprocess.Popen([server_bin, "--port", "0", "--unixsocket", probe_sock,
                                      "--save", ""], stdout=subprocess.DEVNULL)
            while not os.path.exists(probe_sock):
                time.sleep(0.05)
            probe_tree = Tree(path, 0, valkey.Valkey(unix_socket_path=probe_sock), 1)
            names = sorted({_name(probe_tree, c) for c in _calls(probe_tree, 0)})
            probe.kill()
            probe.wait()
            print(f"{path}, instructions per script call (callgrind):", flush=True)
            total = 0.0
            for target in names:
                sock, out = f"{work}/{target}.sock", f"{work}/{target}.cg"
                server = subprocess.Popen(
                    ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                     "--instr-atstart=no", server_bin, "--port", "0", "--unixsocket", sock,
                     "--save", "", "--appendonly", "no"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                while not os.path.exists(sock):
                    time.sleep(0.1)
                client = valkey.Valkey(unix_socket_path=sock)
                tree = Tree(path, 0, client, 1)
                calls_made = 0
                for start in range(0, requests, batch):
                    seqs = [_calls(tree, i) for i in range(start, min(start + batch, requests))]
                    parts: list[list[tuple[object, ...]]] = [[], [], []]
                    for seq in seqs:
                        at = [j for j, c in enumerate(seq) if _name(tree, c) == target]
                        first, last = (at[0], at[-1] + 1) if at else (len(seq), len(seq))
                        parts[0] += seq[:first]
                        parts[1] += seq[first:last]
                        parts[2] += seq[last:]
                    for k, part in enumerate(parts):
                        if k == 1:
                            subprocess.run(["callgrind_control", "-i", "on", str(server.pid)],
                                           capture_output=True, check=False)
                        p = client.pipeline(transaction=False)
                        for call in part:
                            p.evalsha(*call)
                        p.execute()
                        if k == 1:
                            subprocess.run(["callgrind_control", "-i", "off", str(server.pid)],
                                           capture_output=True, check=False)
                            calls_made += len(part)
                server.terminate()  # SIGTERM: the server exits, callgrind writes its counts
                server.wait(300)
                if os.environ.get("CG_KEEP"):  # a folder to keep the counts in (annotate)
                    subprocess.run(["cp", *map(str, Path(work).glob(f"{target}.cg*")),
                                    os.environ["CG_KEEP"]], check=False)
                ir = sum(int(line.split()[1]) for name in Path(work).glob(f"{target}.cg*")
                         for line in Path(name).read_text(errors="replace").splitlines()
                         if line.startswith(("summary:", "totals:")))
                per_call, per_request = ir / max(calls_made, 1), ir / requests
                total += per_request
                print(f"    {target:22s} {per_call / 1000:7.1f}k per call  "
                      f"x{calls_made / requests:.0f}  {per_request / 1000:7.1f}k per request",
                      flush=True)
            print(f"    {'all scripts':22s} {total / 1000:7.1f}k per request", flush=True)


def group_instructions(paths: list[str], server_bin: str, requests: int, group: int) -> None:
    """Instructions per request of the whole script sequence, deterministic: per tree, a
    fresh server under callgrind, instrumented only while the measured requests run;
    requests go in groups of ``group`` (their pre-call calls, then their post-call calls
    as one flush, merged where the tree can: see :func:`grouped`). ``TREE@nomerge``: the
    tree without merging. Warm-up: one group per tree before instrumenting."""
    for spec in paths:
        name, _, flag = spec.partition("@")
        path = Path(name).resolve()
        with tempfile.TemporaryDirectory(prefix="triogate-sab-gi-") as work:
            sock, out = f"{work}/r.sock", f"{work}/r.cg"
            server = subprocess.Popen(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                 "--instr-atstart=no", server_bin, "--port", "0", "--unixsocket", sock,
                 "--save", "", "--appendonly", "no"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not os.path.exists(sock):
                time.sleep(0.1)
            client = valkey.Valkey(unix_socket_path=sock)
            tree = Tree(path, 0, client, 1)
            merge = flag != "nomerge"

            def run(first: int, count: int, tree: Tree = tree, merge: bool = merge,
                    client: valkey.Valkey = client) -> None:
                for start in range(first, first + count, group):
                    for part in grouped(tree, start, group, merge=merge):
                        p = client.pipeline(transaction=False)
                        for call in part:
                            p.evalsha(*call)
                        p.execute()

            run(0, group)
            subprocess.run(["callgrind_control", "-i", "on", str(server.pid)],
                           capture_output=True, check=False)
            run(group, requests)
            subprocess.run(["callgrind_control", "-i", "off", str(server.pid)],
                           capture_output=True, check=False)
            server.terminate()
            server.wait(300)
            if os.environ.get("CG_KEEP"):  # a folder to keep the callgrind output in
                for f in Path(work).glob("r.cg*"):
                    Path(os.environ["CG_KEEP"], f"{path.name}{flag}{f.name}").write_bytes(
                        f.read_bytes())
            ir = sum(int(line.split()[1]) for f in Path(work).glob("r.cg*")
                     for line in Path(f).read_text(errors="replace").splitlines()
                     if line.startswith(("summary:", "totals:")))
            print(f"{spec}: group {group}: {ir / requests / 1000:,.1f}k instructions per "
                  "request (all scripts)", flush=True)


def _calls(tree: Tree, i: int) -> list[tuple[object, ...]]:
    recorder = _Recorder()
    tree.request(recorder, 10**9 + i)  # type: ignore[arg-type]
    return recorder.calls


POST_CALL = ("budget_settle", "rate_settle", "routing_record")


def grouped(tree: Tree, first: int, count: int, *, merge: bool = True
            ) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """The calls of ``count`` requests as a gateway under load sends them: every request's
    calls before the model call, then their post-call calls as one settler flush (group
    commit), where a tree with ``budget_settle_many.lua`` merges one principal's
    settlements into one call (as ``batch/_merge.py`` does)."""
    names = {sha: n for n, sha in tree.sha.items()}
    before: list[tuple[object, ...]] = []
    after: list[tuple[object, ...] | list[tuple[object, ...]]] = []
    groups: dict[tuple[object, ...], list[tuple[object, ...]]] = {}
    for i in range(first, first + count):
        for call in _calls(tree, i):
            name = names[str(call[0])]
            if name not in POST_CALL:
                before.append(call)
            elif name == "budget_settle" and merge and tree.many is not None:
                nkeys = int(call[1])  # type: ignore[call-overload]
                keys = call[2:2 + nkeys]
                if keys not in groups:
                    groups[keys] = []
                    after.append(groups[keys])  # the group, at its first call's place
                groups[keys].append(call)
            else:
                after.append(call)
    out: list[tuple[object, ...]] = []
    for entry in after:
        if isinstance(entry, tuple):
            out.append(entry)
        elif len(entry) == 1:
            out.append(entry[0])
        else:
            nkeys = int(entry[0][1])  # type: ignore[call-overload]
            args: list[object] = []
            for call in entry:
                args += [len(call) - 2 - nkeys, *call[2 + nkeys:]]
            out.append((tree.many, *entry[0][1:2 + nkeys], *args))
    return before, out


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def evalsha_usec(client: valkey.Valkey) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per tree")
    parser.add_argument("--block", type=int, default=500, help="requests per block")
    parser.add_argument("--server", default=None)
    parser.add_argument("--per-script", type=int, default=0, metavar="N",
                        help="also time each script alone over N requests per tree")
    parser.add_argument("--per-script-instructions", type=int, default=0, metavar="N",
                        help="only count each script's instructions under callgrind, over N "
                        "requests per tree (deterministic)")
    parser.add_argument("--principals", type=int, default=1,
                        help="spread the requests over this many keys, teams and end users "
                        "(many principals at a low rate each: small marker hashes)")
    parser.add_argument("--group", type=int, default=1, metavar="G",
                        help="send G requests' pre-call calls, then their post-call calls as "
                        "one flush (group commit; merged settlements where a tree has them)")
    parser.add_argument("--no-merge", action="store_true",
                        help="with --group: never merge settlements")
    parser.add_argument("--group-instructions", type=int, default=0, metavar="N",
                        help="only count instructions per request under callgrind, N "
                        "requests per tree in groups of --group (deterministic); TREE@nomerge")
    args = parser.parse_args()
    server_bin = args.server
    if server_bin is None:
        from triogate.redis_server import find_server_binary
        server_bin = find_server_binary()
    if args.group_instructions:
        group_instructions([str(t) for t in args.trees], server_bin, args.group_instructions,
                           max(1, args.group))
        return
    if args.per_script_instructions:
        per_script_instructions([Path(t).resolve() for t in args.trees], server_bin,
                                args.per_script_instructions)
        return
    with tempfile.TemporaryDirectory(prefix="triogate-sab-") as work:
        sock = f"{work}/r.sock"
        server = subprocess.Popen([server_bin, "--port", "0", "--unixsocket", sock, "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL)
        try:
            while not os.path.exists(sock):
                time.sleep(0.05)
            client = valkey.Valkey(unix_socket_path=sock)
            trees = [Tree(Path(t).resolve(), i, client, args.principals)
                     for i, t in enumerate(args.trees)]
            cpu: dict[int, list[float]] = {i: [] for i in range(len(trees))}
            usec: dict[int, list[float]] = {i: [] for i in range(len(trees))}
            n = 0
            for block in range(args.blocks + 1):  # the first block of each tree warms up
                for tree in trees:
                    c0, u0 = server_cpu_s(server.pid), evalsha_usec(client)
                    if args.group > 1:
                        for _ in range(0, args.block, args.group):
                            for part in grouped(tree, n, args.group, merge=not args.no_merge):
                                p = client.pipeline(transaction=False)
                                for call in part:
                                    p.evalsha(*call)
                                p.execute()
                            n += args.group
                    for _ in range(args.block if args.group <= 1 else 0):
                        p = client.pipeline(transaction=False)
                        tree.request(p, n)
                        p.execute()
                        n += 1
                    c1, u1 = server_cpu_s(server.pid), evalsha_usec(client)
                    if block:
                        cpu[tree.index].append((c1 - c0) * 1e6 / args.block)
                        usec[tree.index].append((u1 - u0) / args.block)
            if args.per_script:
                per_script(client, trees, args.per_script)
        finally:
            server.kill()
            server.wait()
    print(f"server {server_bin}; {args.blocks} blocks of {args.block} requests per tree, "
          f"{args.principals} principal(s) of each kind, group commits of {args.group}"
          + (" (no merge)" if args.no_merge else ""))
    first = None
    for tree in trees:
        c, u = statistics.median(cpu[tree.index]), statistics.median(usec[tree.index])
        first = first or (c, u)
        print(f"{tree.path}: server CPU {c:.1f} µs/request ({c / first[0]:.3f}), EVALSHA "
              f"commandstats {u:.1f} µs/request ({u / first[1]:.3f}); quartiles CPU "
              f"{statistics.quantiles(cpu[tree.index], n=4)[0]:.1f}.."
              f"{statistics.quantiles(cpu[tree.index], n=4)[2]:.1f}")


if __name__ == "__main__":
    main()
