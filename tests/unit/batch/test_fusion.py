"""Script fusion without a server: generated source, wire, reply splitting, planning.

The server-side behaviour (that the generated Lua runs and answers as lone scripts do)
is checked against a real server in tests/integration/test_script_fusion.py.
"""

from __future__ import annotations

import trio

from triogate.batch import BackendUnavailable, Command, CommandError, Script
from triogate.batch._flush import send_round
from triogate.batch._fusion import MAX_HEADER_FIELD, FusedScript, Fuser
from triogate.batch._slots import key_slot
from triogate.batch.testing import RecordingBackend

A = Script.from_source("a", "-- a\nreturn 1\n")
B = Script.from_source("b", "-- b, three lines\nlocal x = 1\nreturn x")
BARE = Script(name="a", source=b"", sha=A.sha)
FLAGGED = Script.from_source("f", "#!lua flags=no-writes\nreturn 1\n")


def call(script: Script, keys: tuple[str, ...] = ("k",), args: tuple[str | int, ...] = ()
         ) -> Command:
    return Command(name="EVALSHA", keys=keys, args=args, owner=script.name,
                   backend="default", script=script)


def plain(name: str = "GET") -> Command:
    return Command(name=name, keys=("p",), args=(), owner="plain", backend="default")


def test_one_set_is_one_script_whatever_the_order_or_number_of_calls() -> None:
    fuser = Fuser()
    assert fuser.fused([A, B]) is fuser.fused([B, A, B, A])
    assert fuser.fused([A, B]).script.sha != fuser.fused([A]).script.sha
    members = fuser.fused([B, A]).members
    assert [m.sha for m in members] == sorted([A.sha, B.sha])


def test_generated_source_keeps_each_members_lines_at_a_known_offset() -> None:
    fused = FusedScript.generate(sorted([A, B], key=lambda s: s.sha))
    lines = fused.script.source.decode().split("\n")
    for member, offset, length in zip(fused.members, fused.offsets, fused.lengths,
                                      strict=True):
        own = member.source.decode().split("\n")
        assert length == len(own)
        assert lines[offset].endswith(own[0])  # line 1 shares the function line
        assert lines[offset + 1 : offset + length] == own[1:]
        assert lines[offset].startswith(f"local f_{fused.index[member.sha]} = function()")
    assert fused.script.sha == Script.from_source("x", fused.script.source).sha


def test_the_wire_carries_a_byte_header_then_keys_and_args_in_call_order() -> None:
    fused = Fuser().fused([A, B])
    calls = [call(B, ("k1", "k2"), (1, "x")), call(A, (), ("y",)), call(B, ("k3",), ())]
    wire = fused.wire(calls)
    ib, ia = fused.index[B.sha], fused.index[A.sha]
    assert wire == ("EVALSHA", fused.script.sha, 3, "k1", "k2", "k3",
                    bytes((ib, 2, 2, ia, 0, 1, ib, 1, 0)), 1, "x", "y")
    assert fused.wire(calls, use_eval=True)[:2] == ("EVAL", fused.script.source)


def test_split_restores_values_nils_and_returned_errors() -> None:
    fused = Fuser().fused([A, B])
    calls = [call(A), call(B), call(B), call(A)]
    returned = CommandError("XERR returned")
    out = fused.split(calls, [b"v", None, returned, [1, None, b"x"], []])
    assert out[:2] == [b"v", None] and out[2] is returned and out[3] == [1, None, b"x"]


def test_split_keys_errors_by_call_number_and_shifts_lines_back() -> None:
    fused = Fuser().fused([A, B])
    calls = [call(A), call(B), call(A)]
    b = fused.offsets[fused.index[B.sha] - 1]
    reply = [1, None, None, [
        2, [f"ERR user_script:{b + 2}: boom".encode(), b + 2, b"@user_script"],
        3, [b"MYERR raised as a table"],
    ]]
    out = fused.split(calls, reply)
    assert out[0] == 1
    assert isinstance(out[1], CommandError)
    assert out[1].reply == f"ERR user_script:2: boom script: {B.sha}, on @user_script:2."
    assert isinstance(out[2], CommandError) and out[2].reply == "MYERR raised as a table"


def test_an_error_of_the_whole_call_is_every_members_own_instance() -> None:
    fused = Fuser().fused([A, B])
    calls = [call(A), call(B)]
    for whole in (CommandError("BUSY Redis is busy"), BackendUnavailable("r", "reset")):
        out = fused.split(calls, whole)
        assert [type(o) for o in out] == [type(whole)] * 2
        assert out[0] is not out[1] and str(out[0]) == str(whole)
    bad = fused.split(calls, [1, 2])  # not n + 1 elements
    assert all(isinstance(o, CommandError) and "unexpected reply" in o.reply for o in bad)


def test_plan_fuses_script_calls_at_the_first_ones_place_and_loads_a_new_set_once() -> None:
    fuser = Fuser()
    commands = [plain(), call(A), plain("SET"), call(B), call(BARE), call(FLAGGED), call(A)]
    units = fuser.plan(commands, range(len(commands)))
    shape = [(u.members, u.fused is not None) for u in units]
    assert shape == [((0,), False), ((), True), ((1, 3, 6), True), ((2,), False),
                     ((4,), False), ((5,), False)]
    assert units[1].wire(commands) == ("SCRIPT", "LOAD", units[2].fused.script.source)  # type: ignore[union-attr]
    again = fuser.plan(commands, range(len(commands)))
    assert [u.members for u in again] == [(0,), (1, 3, 6), (2,), (4,), (5,)]
    assert [u.members for u in fuser.plan(commands, [0, 1, 2])] == [(0,), (1,), (2,)]


def test_plan_per_slot_fuses_only_calls_whose_keys_share_a_slot() -> None:
    fuser = Fuser(per_slot=True)
    x1, x2, y = call(A, ("{x}a",)), call(B, ("{x}b", "{x}c")), call(A, ("{y}a",))
    split, keyless = call(B, ("{x}a", "{y}a")), call(A, ())
    commands = [x1, y, split, x2, keyless, call(B, ("{y}b",))]
    assert key_slot("{x}") != key_slot("{y}")
    units = [u for u in fuser.plan(commands, range(len(commands))) if u.members]
    assert [u.members for u in units] == [(0, 3), (1, 5), (2,), (4,)]


def test_calls_too_big_for_a_byte_header_are_sent_alone() -> None:
    big = call(A, args=tuple(range(MAX_HEADER_FIELD + 1)))
    units = Fuser().plan([call(A), big, call(B)], range(3))
    assert [u.members for u in units if u.members] == [(0, 2), (1,)]


def test_a_set_whose_load_fails_is_sent_unfused_from_then_on() -> None:
    fuser = Fuser()
    commands = [call(A), call(B)]
    load, fused = fuser.plan(commands, range(2))
    fuser.loaded(load, CommandError("ERR Error compiling script"))
    assert [u.members for u in fuser.for_retry(fused)] == [(0,), (1,)]
    assert [u.members for u in fuser.plan(commands, range(2))] == [(0,), (1,)]


async def test_backends_without_a_fuser_see_one_evalsha_per_call() -> None:
    backend = RecordingBackend({"EVALSHA": 7})
    replies: dict[int, object] = {}
    with trio.fail_after(5):
        await send_round([call(A), call(B)], {"default": backend}, replies.__setitem__)
    assert backend.commands == ["EVALSHA", "EVALSHA"] and replies == {0: 7, 1: 7}
