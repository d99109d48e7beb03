"""Merged calls: many calls of one script with the same keys sent as ONE script call.

Why: the settler's group commit carries, under load, several requests' settlements for
the same principal (same script, same KEYS) in one flush. Each call reads and writes the
same shared counters; a *merged* script settles every request in turn but touches the
shared counters once (one HINCRBY of the sum, one HDEL with many fields, ...), so the
server's work per request drops with the group's size (measured as the Redis
server's instructions per request under callgrind).

A :class:`Merge` names a script (``single``) and the script that does the work of many of
its calls (``merged``). The wire contract, the same for every merge:

* ``KEYS``: the calls' keys (identical in every call of a group, so one slot on a
  cluster);
* ``ARGV``: for each call in order, its argument count then its arguments;
* the reply: an array with each call's reply, in order, exactly what its own call of
  ``single`` would have returned had the calls run one after the other; or an error
  reply (the merged script refuses a group it cannot settle exactly: a bad argument,
  keys it does not expect), in which case it must have written nothing.

What :func:`send_merged` guarantees around it:

* Owners see their own replies, as if their calls had gone alone.
* A merged call that fails with an error reply (refused arguments, a Lua error, a
  NOSCRIPT that EVAL could not cure) or an unexpected reply fails nobody: its calls are
  sent again, one by one, in a second pipeline of the same flush (as fusion unfuses on a
  failed ``SCRIPT LOAD``), and each owner gets its own call's reply.
* A merged call whose backend is unavailable, or that got a transient error reply, gives
  each call that same error: the caller journals the calls one by one (the journal never
  sees a merged call, so a replay stays per request).
* Only the caller's ``commands`` are traced: pipeline indices are the calls a merged call
  carries, as for fusion.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, final

import attrs

from ._command import Command
from ._errors import BackendUnavailable, CommandError
from ._flush import PipelineSent, send_round

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from ._backend import Backend
    from ._command import Arg
    from ._scripts import Script

#: A merged call carries at most this many calls by default: it bounds how long one
#: script holds the server and the size of its argument list.
DEFAULT_MAX_CALLS = 128


@final
@attrs.frozen(kw_only=True)
class Merge:
    """``merged`` does the work of many calls of ``single`` with the same keys.

    Attributes:
        single: the script whose calls are merged.
        merged: the script that settles many of them (the contract in this module's
            docstring).
        max_calls: most calls one merged call carries (a larger group is split).
        min_calls: fewest calls worth a merged call; a smaller group goes as single
            calls (a merged script's own bookkeeping may cost more than it saves on a
            few calls: measure it).
    """

    single: Script
    merged: Script
    max_calls: int = DEFAULT_MAX_CALLS
    min_calls: int = 2

    def __attrs_post_init__(self) -> None:
        if not 2 <= self.min_calls <= self.max_calls:
            raise ValueError(f"need 2 <= min_calls <= max_calls, not {self.min_calls} and "
                             f"{self.max_calls}")

    def command(self, calls: Sequence[Command]) -> Command:
        """The merged call of ``calls`` (same script, keys and backend)."""
        args: list[Arg] = []
        for call in calls:
            args.append(len(call.args))
            args += call.args
        first = calls[0]
        return Command(name="EVALSHA", keys=first.keys, args=tuple(args), owner=first.owner,
                       backend=first.backend, script=self.merged)

    @staticmethod
    def split(count: int, reply: object) -> list[object] | None:
        """Each call's reply, or None when ``reply`` is not an array of ``count`` replies."""
        if isinstance(reply, list) and len(reply) == count:
            return reply
        return None


def plan_merges(
    commands: Sequence[Command], merges: Mapping[str, Merge]
) -> list[tuple[Command, tuple[int, ...], Merge | None]]:
    """The wire commands of ``commands``: each a lone command (its index, no merge) or a
    merged call (its calls' indices, the merge), at the place of its first call.

    Calls are grouped by script, backend and keys; a group smaller than its merge's
    ``min_calls`` is sent as single calls, in order, at the group's place.
    """
    groups: dict[tuple[str, str, tuple[Arg, ...]], list[int]] = defaultdict(list)
    order: list[int | list[int]] = []
    for i, command in enumerate(commands):
        script = command.script
        merge = merges.get(script.sha) if script is not None else None
        if merge is None:
            order.append(i)
            continue
        assert script is not None
        members = groups[script.sha, command.backend, command.keys]
        if not members or len(members) >= merge.max_calls:
            members = groups[script.sha, command.backend, command.keys] = [i]
            order.append(members)
        else:
            members.append(i)
    out: list[tuple[Command, tuple[int, ...], Merge | None]] = []
    for entry in order:
        if isinstance(entry, int):
            out.append((commands[entry], (entry,), None))
        else:
            script = commands[entry[0]].script
            assert script is not None
            merge = merges[script.sha]
            if len(entry) < merge.min_calls:
                out += [(commands[i], (i,), None) for i in entry]
            else:
                out.append((merge.command([commands[i] for i in entry]), tuple(entry), merge))
    return out


async def send_merged(
    commands: Sequence[Command],
    backends: Mapping[str, Backend],
    deliver: Callable[[int, object], None],
    *,
    merges: Mapping[str, Merge],
    sent: Callable[[PipelineSent], None] | None = None,
) -> int:
    """:func:`~._flush.send_round` with the calls of each :class:`Merge` merged.

    ``merges`` maps a single script's SHA to its merge. Returns how many calls went back
    to being sent alone (their merged call failed). A checkpoint.
    """
    if not merges:
        await send_round(commands, backends, deliver, sent=sent)
        return 0
    planned = plan_merges(commands, merges)
    wires = [command for command, _, _ in planned]
    fallback: list[int] = []

    def deliver_wire(w: int, reply: object) -> None:
        _, members, merge = planned[w]
        if merge is None:
            deliver(members[0], reply)
        elif isinstance(reply, BackendUnavailable) or (
                isinstance(reply, CommandError) and reply.is_transient):
            for i in members:
                deliver(i, reply)
        else:
            replies = None if isinstance(reply, BaseException) else merge.split(
                len(members), reply)
            if replies is None:
                fallback.extend(members)
            else:
                for i, own in zip(members, replies, strict=True):
                    deliver(i, own)

    def sent_wire(pipeline: PipelineSent) -> None:
        if sent is not None:
            sent(attrs.evolve(pipeline, indices=tuple(
                i for w in pipeline.indices for i in planned[w][1])))

    await send_round(wires, backends, deliver_wire, sent=sent_wire)
    if not fallback:
        return 0
    fallback.sort()

    def sent_alone(pipeline: PipelineSent) -> None:
        if sent is not None:
            sent(attrs.evolve(pipeline, retry=True,
                              indices=tuple(fallback[k] for k in pipeline.indices)))

    await send_round([commands[i] for i in fallback], backends,
                     lambda k, reply: deliver(fallback[k], reply), sent=sent_alone)
    return len(fallback)


def merge_table(merges: Iterable[Merge]) -> dict[str, Merge]:
    """``merges`` by their single script's SHA."""
    return {m.single.sha: m for m in merges}
