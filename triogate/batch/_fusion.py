"""Script fusion: the script calls of one pipeline leave as one ``EVALSHA``, not one each.

Why: every ``EVALSHA`` has a fixed cost on the server beyond its Lua body (parsing the
command, the script lookup, building KEYS and ARGV, the protected call, the reply, the
command's statistics); a governed request sends fourteen. Fused, the calls of one round
pay it once, plus a smaller per-call cost in the dispatcher. Measured on redis 7.0
(callgrind and INFO commandstats): the fixed cost is about 2 µs a call and the dispatcher's about
1.4 µs, so fusion saves a little under 1 µs per script call: small against today's
script bodies, a larger share as they shrink.

How: for the distinct scripts of a group (sorted by SHA, so one set is one fused script
whatever the order or number of the calls), a Lua source is generated once per set and
cached on the backend's :class:`Fuser`. Each member's source becomes the body of
``local f_i = function() local KEYS, ARGV = K, A <source> end``, its first line on the
``function`` line, so a member's line numbers are those of the fused script shifted by
a known offset; ``K`` and ``A`` are upvalues the dispatcher sets per call, so the
member is called by ``xpcall`` directly (Lua 5.1's ``xpcall`` passes no arguments, and
a trampoline closure per call cost more than the EVALSHA it saved). The wire is::

    EVALSHA <fused sha> <key count> <all keys> <header> <all args>

where ``header`` is three bytes per call (script index, key count, argument count; a
call with more than 255 keys or arguments is sent alone), read with one
``string.byte``. The dispatcher gives each call fresh KEYS and ARGV tables (``{unpack
(KEYS, i, j)}``) and runs it under ``xpcall`` with the server's own error handler
(``__redis__err__handler``, the one Redis 7 and Valkey use at a script's top level),
in the order the calls were declared. The reply is one flat array: element ``c`` is
call ``c``'s result, converted by Redis exactly as a lone script's reply (numbers,
strings, status and error-reply tables, recursively: an error *returned* with
``redis.error_reply`` arrives nested and hiredis decodes it as a
:class:`CommandError`), with nil written as false (a nil would end the array); a last
element lists the raised errors as ``c, {err, line, source}`` (a Lua runtime error,
``error(...)``, a failed ``redis.call``), or is false (nil) when none was raised: an empty
table would cost the reply conversion its type probes on every fused call.
:meth:`FusedScript.split` turns that back into what each owner's lone ``EVALSHA`` would
have given: the value, ``None``, or a
:class:`CommandError` with the text Redis builds (``<err> script: <member sha>, on
@user_script:<line>.``, the line and the ``user_script:N:`` position in the message
shifted back to the member's own lines).

Semantics, compared with one EVALSHA per call:

* A fused group runs atomically: nothing of another client runs between its calls.
  Before, it could. This is stronger, never weaker: no one could rely on interleaving.
* A call that fails (an error returned or raised) does not stop the others: each runs
  under its own ``xpcall``, exactly as separate EVALSHAs are independent. What one call
  wrote before failing stays written, as before (Redis scripts never roll back).
* Order: calls run in declaration order. The fused call takes the place of the group's
  first script call; plain commands keep their order relative to each other and to it.
  So a plain command declared between two script calls now runs after both. A pipeline
  was never atomic against other clients, and the commands of one round come from
  participants that waited on nothing of each other, so no one can depend on it.
* An error of the fused call as a whole (``NOSCRIPT``, ``BUSY``, ``CROSSSLOT``,
  ``LOADING``, a timeout, ...) is every member's, as it would have been for each lone
  call; ``NOSCRIPT`` is retried with ``EVAL`` of the fused source by the flush.
* Loading: the first time a backend's fuser uses a set, the pipeline carries a
  ``SCRIPT LOAD`` of the fused source just ahead of the fused call (its reply is
  nobody's; a cluster sends it to every primary). Without it, every new *combination*
  of already loaded scripts would cost its owners a NOSCRIPT round, and which scripts
  meet in a pipeline varies (identity refreshes, routing, the settler's group commit).
  After a ``SCRIPT FLUSH`` or a restart the NOSCRIPT → ``EVAL`` path applies, as for
  lone scripts.
* Which scripts are fused: those with source (a script replayed from a journal without
  its source cannot be ``EVAL``ed on NOSCRIPT, so it is sent alone) and without a
  ``#!`` shebang (flags apply to a whole script). On a Redis Cluster only calls whose
  keys hash to the same slot are fused (one EVALSHA's keys must share a slot): the
  cluster backend's fuser groups by slot. A single server fuses every call of a pipeline.
* Counting: tracer records and round-trip counts list the logical commands per owner
  (the flush records member indices); a backend's ``statistics().commands`` counts what
  went on the wire, so a fused call counts one there. Waits per request do not change.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, final

import attrs

from ._errors import BackendUnavailable, CommandError
from ._scripts import Script
from ._slots import Spread, command_slot

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._backend import Wire
    from ._command import Arg, Command

#: Distinct script sets a fuser remembers; past it the cache starts afresh (a gateway
#: has a handful of scripts, so a handful of sets).
MAX_CACHED_SETS = 256

_DISPATCHER = """\
local fns = {%(functions)s}
local xpcall, unpack, type, tostring = xpcall, unpack, type, tostring
local handler = rawget(_G, '__redis__err__handler') or function(e)
  if type(e) ~= 'table' then e = {err = 'ERR ' .. tostring(e)} end
  return e
end
local header = {string.byte(ARGV[1], 1, -1)}
local out, errors = {}, false
local k, a = 0, 1
for c = 1, #header / 3 do
  local p = 3 * c
  local nk, na = header[p - 1], header[p]
  K, A = {unpack(KEYS, k + 1, k + nk)}, {unpack(ARGV, a + 1, a + na)}
  k, a = k + nk, a + na
  local ok, r = xpcall(fns[header[p - 2]], handler)
  if ok then
    if r == nil then r = false end
    out[c] = r
  else
    if type(r) ~= 'table' then r = {err = 'ERR ' .. tostring(r)} end
    out[c] = false
    errors = errors or {}
    errors[#errors + 1] = c
    errors[#errors + 1] = {tostring(r.err), r.line, r.source}
  end
end
out[#header / 3 + 1] = errors
return out
"""

#: A call is fused only if its header fits a byte each: script index, keys, arguments.
MAX_HEADER_FIELD = 255

_POSITION = re.compile(r"^(ERR user_script:)(\d+)(:)")


def fusable(command: Command) -> bool:
    """Whether ``command`` may be fused: a script call with source and no shebang (flags),
    at most :data:`MAX_HEADER_FIELD` keys and as many arguments."""
    script = command.script
    return (
        script is not None
        and bool(script.source)
        and not script.source.startswith(b"#!")
        and len(command.keys) <= MAX_HEADER_FIELD
        and len(command.args) <= MAX_HEADER_FIELD
    )


@final
@attrs.frozen(kw_only=True, eq=False)
class FusedScript:
    """The generated script for one set of member scripts."""

    script: Script
    members: tuple[Script, ...]
    #: Fused line of each member's line 1, minus one.
    offsets: tuple[int, ...]
    #: Lines of each member's source.
    lengths: tuple[int, ...]
    #: Member SHA → 1-based index in the dispatcher's table.
    index: dict[str, int]

    @classmethod
    def generate(cls, members: Sequence[Script]) -> FusedScript:
        """Generate the fused script of ``members`` (distinct, sorted by the caller)."""
        parts = [
            "-- generated by triogate.batch (script fusion): "
            + ", ".join(m.name for m in members) + "\n"
        ]
        parts.append("local K, A\n")
        line = 3  # the line the next part starts on
        offsets, lengths = [], []
        for i, member in enumerate(members, 1):
            body = member.source.decode()
            offsets.append(line - 1)
            lengths.append(body.count("\n") + 1)
            parts.append(f"local f_{i} = function() local KEYS, ARGV = K, A {body}\nend\n")
            line += body.count("\n") + 2
        functions = ", ".join(f"f_{i}" for i in range(1, len(members) + 1))
        parts.append(_DISPATCHER % {"functions": functions})
        name = "fused(" + "+".join(m.name for m in members) + ")"
        return cls(
            script=Script.from_source(name, "".join(parts)),
            members=tuple(members),
            offsets=tuple(offsets),
            lengths=tuple(lengths),
            index={m.sha: i for i, m in enumerate(members, 1)},
        )

    def wire(self, calls: Sequence[Command], *, use_eval: bool = False) -> Wire:
        """One ``EVALSHA`` (or ``EVAL``) carrying ``calls``, in their order."""
        keys: list[Arg] = []
        header = bytearray()
        args: list[Arg] = []
        index = self.index
        for call in calls:
            assert call.script is not None
            header += bytes((index[call.script.sha], len(call.keys), len(call.args)))
            keys += call.keys
            args += call.args
        head: tuple[Arg, ...] = (
            ("EVAL", self.script.source) if use_eval else ("EVALSHA", self.script.sha))
        return (*head, len(keys), *keys, bytes(header), *args)

    def split(self, calls: Sequence[Command], reply: object) -> list[object]:
        """The reply each of ``calls`` would have had from its own EVALSHA."""
        if isinstance(reply, CommandError):
            return [CommandError(reply.reply) for _ in calls]
        if isinstance(reply, BackendUnavailable):
            return [BackendUnavailable(reply.backend, reply.reason) for _ in calls]
        if isinstance(reply, BaseException):
            return [reply for _ in calls]
        n = len(calls)
        if not isinstance(reply, list) or len(reply) != n + 1 or not (
                reply[n] is None or isinstance(reply[n], list)):
            bad = f"ERR fused script {self.script.sha[:8]}: unexpected reply {reply!r:.100}"
            return [CommandError(bad) for _ in calls]
        out: list[object] = reply[:n]
        errors = reply[n] or []
        for at in range(0, len(errors) - 1, 2):
            c = errors[at] - 1
            out[c] = self._error(calls[c], errors[at + 1])
        return out

    def _error(self, call: Command, raised: object) -> CommandError:
        """A raised error as Redis would have answered it for ``call`` alone."""
        if not isinstance(raised, list) or not raised:
            return CommandError(f"ERR fused script: unexpected error {raised!r:.100}")
        assert call.script is not None
        member = self.index[call.script.sha] - 1
        offset, length = self.offsets[member], self.lengths[member]

        def own(line: int) -> int:
            return line - offset if offset < line <= offset + length else line

        message = _POSITION.sub(lambda m: f"{m[1]}{own(int(m[2]))}{m[3]}", _text(raised[0]),
                                count=1)
        if len(raised) > 2 and isinstance(raised[1], int):
            line, source = own(raised[1]), _text(raised[2])
            message = f"{message} script: {call.script.sha}, on {source}:{line}."
        return CommandError(message)


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@attrs.frozen
class Unit:
    """What one wire of a pipeline carries: one command, a fused group of calls, or (no
    members, ``fused`` set) the ``SCRIPT LOAD`` of a fused script, whose reply is nobody's.
    """

    #: Positions, in the round's command list, of the commands this wire answers.
    members: tuple[int, ...]
    fused: FusedScript | None = None

    def wire(self, commands: Sequence[Command], *, use_eval: bool = False) -> Wire:
        if self.fused is None:
            return commands[self.members[0]].wire(use_eval=use_eval)
        if not self.members:
            return ("SCRIPT", "LOAD", self.fused.script.source)
        return self.fused.wire([commands[i] for i in self.members], use_eval=use_eval)

    def split(self, commands: Sequence[Command], reply: object) -> list[object]:
        if self.fused is None:
            return [reply]
        return self.fused.split([commands[i] for i in self.members], reply)

    def evalable(self, commands: Sequence[Command]) -> bool:
        """Whether a NOSCRIPT can be retried with EVAL (the script has source)."""
        if self.fused is not None:
            return bool(self.members)
        script = commands[self.members[0]].script
        return script is not None and bool(script.source)


@final
class Fuser:
    """A backend's fusion policy and its cache of generated scripts.

    Args:
        per_slot: fuse only calls whose keys hash to one slot (Redis Cluster); calls
            without keys, or with keys in several slots, are sent alone.
    """

    def __init__(self, *, per_slot: bool = False) -> None:
        self.per_slot = per_slot
        self._cache: dict[tuple[str, ...], FusedScript] = {}
        self._loaded: set[str] = set()
        #: Fused scripts the server would not compile (a member that only compiles as a
        #: chunk of its own): their members are sent alone from then on.
        self._broken: set[str] = set()
        #: Fused calls sent, and the script calls they carried.
        self.fused_calls = 0
        self.fused_members = 0

    def fused(self, scripts: Sequence[Script]) -> FusedScript:
        """The fused script of the distinct ``scripts``, generated once per set."""
        distinct = sorted({s.sha: s for s in scripts}.values(), key=lambda s: s.sha)
        key = tuple(s.sha for s in distinct)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= MAX_CACHED_SETS:
                self._cache.clear()
                self._loaded.clear()
                self._broken.clear()
            found = self._cache[key] = FusedScript.generate(distinct)
        return found

    def plan(self, commands: Sequence[Command], indices: Sequence[int]) -> list[Unit]:
        """The wires of one pipeline: script calls grouped, each group at its first place."""
        groups: dict[int, list[int]] = {}  # slot (or 0 on a single server) → positions
        order: list[int | list[int]] = []  # a lone command's position, or a group
        per_slot = self.per_slot
        for i in indices:
            command = commands[i]
            if not fusable(command):
                order.append(i)
                continue
            slot = command_slot(command.wire()) if per_slot else 0
            if isinstance(slot, Spread):
                order.append(i)
                continue
            members = groups.get(slot)
            if members is None:
                members = groups[slot] = []
                order.append(members)
            members.append(i)
        units: list[Unit] = []
        for entry in order:
            if isinstance(entry, int):
                units.append(Unit((entry,)))
            elif len(entry) == 1:
                units.append(Unit((entry[0],)))
            else:
                scripts = [s for s in (commands[i].script for i in entry) if s is not None]
                if len({s.sha for s in scripts}) > MAX_HEADER_FIELD:
                    units += [Unit((i,)) for i in entry]
                    continue
                fused = self.fused(scripts)
                if fused.script.sha in self._broken:
                    units += [Unit((i,)) for i in entry]
                    continue
                if fused.script.sha not in self._loaded:
                    # New to this backend: load it in the same pipeline, ahead of its
                    # first call (on a cluster, SCRIPT LOAD reaches every primary), so a
                    # new set of scripts costs no NOSCRIPT round when its members were
                    # known. After a SCRIPT FLUSH or a restart, NOSCRIPT → EVAL, as ever.
                    self._loaded.add(fused.script.sha)
                    units.append(Unit((), fused))
                self.fused_calls += 1
                self.fused_members += len(entry)
                units.append(Unit(tuple(entry), fused))
        return units

    def loaded(self, unit: Unit, reply: object) -> None:
        """Note the reply to a fused script's ``SCRIPT LOAD``: an error reply (it did not
        compile) marks its set as not to be fused."""
        if unit.fused is not None and isinstance(reply, CommandError):
            self._broken.add(unit.fused.script.sha)

    def for_retry(self, unit: Unit) -> list[Unit]:
        """How ``unit`` is retried with EVAL after NOSCRIPT: as it is, or its members one
        by one if its fused script did not compile."""
        if unit.fused is not None and unit.fused.script.sha in self._broken:
            return [Unit((i,)) for i in unit.members]
        return [unit]
