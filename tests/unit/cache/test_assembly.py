"""The incremental assemblers give exactly the body the batch ``assemble`` gave before them
(but for a value nested too deep to copy: None, where the batch code raised).

The reference is the batch code as it was (``assemble_before.py``, verbatim). Each case is
checked three ways against it: ``assemble`` on the list; an assembler fed one event at a
time, each a fresh copy emptied (``clear()``) right after it was fed, as the stream's
dicts are dropped (the assembler must keep no event); and the same body's key order
(``repr``), which is what the cache entry's bytes follow. ``assemble`` must leave the
events it is given as they were. The cases: the stream fixtures of
``test_assemble.py``, replays of every round-trip body, hand-made streams (interleaved
choices, logprobs, tool calls, content blocks restarted, thinking and citations), then
every prefix of each (unfinished streams), each with an error event inserted, and each
with one event broken (a key missing, a value of the wrong type); and random streams
(hypothesis) built from each API's event kinds with odd values in every field.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triogate.cache.replay import assemble, assembler, replay

from . import assemble_before
from .bodies import BODIES
from .test_assemble import (
    ANTHROPIC,
    BASE,
    INCOMPLETE,
    INTERLEAVED,
    RESPONSES,
    STREAMS,
    USAGE,
    call,
    choice_chunk,
    chunk,
)

Case = tuple[str, str, list[dict[str, Any]]]


def check(api: str, events: list[Any]) -> dict[str, Any] | None:
    """The new code's body, once all three ways agree with the reference's."""
    expected = assemble_before.assemble(api, copy.deepcopy(events))  # type: ignore[arg-type]
    given = copy.deepcopy(events)
    whole = assemble(api, given)  # type: ignore[arg-type]
    assert repr(given) == repr(events)  # the events are left as they were
    assembly = assembler(api)  # type: ignore[arg-type]
    if assembly is None:
        assert expected is None and whole is None
        return None
    for event in events:
        fresh = copy.deepcopy(event)
        assembly.feed(fresh)
        if isinstance(fresh, dict):
            fresh.clear()
    fed = assembly.result()
    assert whole == expected and repr(whole) == repr(expected)
    assert fed == expected and repr(fed) == repr(expected)
    assert assembly.result() is fed  # asked again: the same answer
    return fed


# --------------------------------------------------------------------------- the cases

LOGPROB = {"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}


def with_logprobs(delta: dict[str, Any], finish: str | None = None, **logprobs: Any
                  ) -> dict[str, Any]:
    event = chunk(delta, finish)
    event["choices"][0]["logprobs"] = logprobs or None
    return event


HAND_MADE: list[Case] = [
    ("chat interleaved choices", "chat", INTERLEAVED),
    ("chat content before the role", "chat", [
        chunk({"content": "a"}), chunk({"content": "b"}), chunk({"role": "assistant"}),
        chunk({"content": "c"}), chunk({}, "stop")]),
    ("chat repeated tool-call ids", "chat", [
        chunk({"role": "assistant"}),
        chunk(call(0, id="c", type="function", function={"name": "f", "arguments": '{"a"'})),
        chunk(call(1, id="d", type="function", function={"name": "g", "arguments": ""})),
        chunk(call(0, id="c", type="function", function={"name": "f", "arguments": ":1}"})),
        chunk(call(1, function={"arguments": "{}"})),
        chunk({}, "tool_calls")]),
    ("chat logprobs", "chat", [
        with_logprobs({"role": "assistant", "content": ""}),
        with_logprobs({"content": "a"}, content=[LOGPROB]),
        with_logprobs({"content": "b"}, content=[LOGPROB, LOGPROB]),
        with_logprobs({"refusal": "r"}, refusal=[LOGPROB]),
        with_logprobs({"content": "c"}, content=[LOGPROB], refusal=[LOGPROB]),
        with_logprobs({}, "stop", content=[]),
        {**BASE, "choices": [], "usage": USAGE.to_chat()}]),
    ("chat usage twice, head fields late and null", "chat", [
        {"object": "chat.completion.chunk", "id": None, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": "x"}}]},
        {"object": "chat.completion.chunk", "usage": {"a": 1}, "choices": []},
        {**BASE, "system_fingerprint": None, "choices": [
            {"index": 0, "delta": {"content": "y"}, "finish_reason": "length"}]},
        {**BASE, "usage": {"b": {"c": 2}}, "choices": []}]),
    ("messages restarted block, thinking, citations, tools", "messages", [
        ANTHROPIC[0],
        {"type": "ping"},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "hm"}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": "m."}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "signature_delta", "signature": "sig"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text"}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "citations_delta", "citation": {"cited_text": "c"}}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "text_delta", "text": "dropped"}},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "text", "text": "A", "citations": None}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "text_delta", "text": "B"}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "citations_delta", "citation": {"cited_text": "d"}}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "text_delta", "text": "C"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2,
         "content_block": {"type": "tool_use", "id": "t", "name": "f", "input": {}}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "input_json_delta", "partial_json": '{"a":'}},
        {"type": "content_block_delta", "index": 2,
         "delta": {"type": "input_json_delta", "partial_json": "[1]}"}},
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_delta", "index": 1,  # after its stop: still applied
         "delta": {"type": "text_delta", "text": "D"}},
        *ANTHROPIC[-2:],
    ]),
    ("messages a text block that is not a string", "messages", [
        ANTHROPIC[0],
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "text", "text": ["a"]}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": ["b"]}},
        {"type": "content_block_stop", "index": 0},
        *ANTHROPIC[-2:],
    ]),
    ("responses with an empty final output", "responses", [
        *RESPONSES[:-1],
        {**RESPONSES[-1], "response": {**RESPONSES[-1]["response"], "output": []}}]),
]


# Long enough for the text pieces to be joined on the way (cache/assembly.py, _JOIN_AT).
LONG: list[Case] = [
    ("chat two long choices", "chat", [
        choice_chunk(0, {"role": "assistant", "content": ""}),
        choice_chunk(1, {"role": "assistant", "content": "1"}),
        *[choice_chunk(i % 2, {"content": f"{i}."}) for i in range(300)],
        choice_chunk(0, {"refusal": "r"}),
        *[choice_chunk(i % 2, {"content": f"{i}!"}) for i in range(140)],
        choice_chunk(0, {}, "stop"), choice_chunk(1, {}, "length")]),
    # Tool-call arguments in hundreds of pieces (their own fast path): two calls and two
    # choices interleaved, content and a piece repeating the call's id and name between,
    # an argument that is not a string so far (the generic path sets, not appends).
    ("chat long tool-call arguments", "chat", [
        choice_chunk(0, {"role": "assistant", "content": None,
                         **call(0, id="c0", type="function",
                                function={"name": "write", "arguments": ""})}),
        choice_chunk(1, {"role": "assistant", **call(0, id="d0", type="function",
                                                     function={"name": "w"})}),
        *[choice_chunk(0, call(i % 2 if i > 40 else 0, function={"arguments": f"{i},"}))
          if i != 41 else choice_chunk(0, call(1, id="c1", type="function",
                                               function={"name": "read", "arguments": "{"}))
          for i in range(300)],
        *[choice_chunk(1, call(0, function={"arguments": f"<{i}>"})) for i in range(90)],
        choice_chunk(0, {"content": "between"}),
        choice_chunk(0, call(0, id="c0", function={"name": "write", "arguments": "+"})),
        *[choice_chunk(0, call(0, function={"arguments": f"{i}-"})) for i in range(130)],
        choice_chunk(0, {}, "tool_calls"), choice_chunk(1, {}, "tool_calls")]),
    ("messages long text and thinking", "messages", [
        ANTHROPIC[0],
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        *[{"type": "content_block_delta", "index": 0,
           "delta": {"type": "thinking_delta", "thinking": f"{i},"}} for i in range(200)],
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text"}},
        *[{"type": "content_block_delta", "index": i % 2,
           "delta": {"type": "text_delta", "text": f"{i};"} if i % 2 else
           {"type": "thinking_delta", "thinking": f"{i};"}} for i in range(260)],
        *ANTHROPIC[-2:]]),
]


@pytest.mark.parametrize(("label", "api", "events"), LONG, ids=[c[0] for c in LONG])
def test_long_streams_agree_too(label: str, api: str, events: list[dict[str, Any]]) -> None:
    body = check(api, events)
    assert body is not None
    for version in (events[:-1], [*events[:100], ERRORS[api], *events[100:]]):
        check(api, version)


def base_cases() -> list[Case]:
    cases: list[Case] = [(f"stream: {label}", api, events) for label, api, events in STREAMS]
    cases += [(f"refusal: {label}", api, events) for label, api, events in INCOMPLETE]
    cases += [(f"replay: {label}", api, replay(api, body))  # type: ignore[arg-type]
              for label, api, body in BODIES]
    return cases + HAND_MADE


ERRORS = {
    "chat": {"error": {"message": "boom"}},
    "messages": {"type": "error", "error": {"type": "overloaded_error"}},
    "responses": {"type": "error", "message": "boom"},
}


def broken(event: Any) -> list[Any]:
    """Versions of ``event`` that break one thing: a key gone, or a value swapped for a
    number, a string, a list or a dict, one level down as well."""
    if not isinstance(event, dict):
        return []
    out: list[Any] = []
    for key, value in event.items():
        out.append({k: v for k, v in event.items() if k != key})
        for odd in (7, "x", [], [1], {}):
            out.append({**event, key: odd})
        if isinstance(value, dict):
            out += [{**event, key: inner} for inner in broken(value)[:12]]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            out += [{**event, key: [inner, *value[1:]]} for inner in broken(value[0])[:12]]
    return out


def variants(api: str, events: list[dict[str, Any]]) -> list[list[Any]]:
    out: list[list[Any]] = [events[:end] for end in range(len(events))]
    error = ERRORS.get(api, ERRORS["chat"])
    out += [[*events[:at], error, *events[at:]] for at in range(len(events) + 1)]
    for at, event in enumerate(events):
        out += [[*events[:at], odd, *events[at + 1:]] for odd in broken(event)]
    return out


CASES = base_cases()


@pytest.mark.parametrize(("label", "api", "events"), CASES, ids=[c[0] for c in CASES])
def test_the_assemblers_give_the_bodies_the_batch_code_gave(
    label: str, api: str, events: list[dict[str, Any]]
) -> None:
    check(api, events)


@pytest.mark.parametrize(("label", "api", "events"), CASES, ids=[c[0] for c in CASES])
def test_unfinished_errored_and_broken_versions_agree_too(
    label: str, api: str, events: list[dict[str, Any]]
) -> None:
    answers = [check(api, version) for version in variants(api, events)]
    if api in ERRORS and len(events) > 2:  # the variants do reach both kinds of answer
        assert any(a is None for a in answers)


def test_the_hand_made_streams_are_answers() -> None:
    answers = {label: check(api, events) for label, api, events in HAND_MADE}
    assert answers.pop("messages a text block that is not a string") is not None
    assert all(answers.values())
    restarted = answers["messages restarted block, thinking, citations, tools"]
    assert restarted is not None
    thinking, text, tool = restarted["content"]
    assert (thinking["thinking"], thinking["signature"]) == ("hmm.", "sig")
    assert text == {"type": "text", "text": "ABCD", "citations": [{"cited_text": "d"}]}
    assert tool["input"] == {"a": [1]}


def test_feeding_after_a_refusal_or_the_result_changes_nothing() -> None:
    assembly = assembler("chat")
    assert assembly is not None
    assembly.feed({"object": "chat.completion.chunk", "choices": "not a list of choices"})
    for event in STREAMS[0][2]:
        assembly.feed(event)
    assert assembly.result() is None
    finished = assembler("chat")
    assert finished is not None
    for event in STREAMS[0][2]:
        finished.feed(event)
    body = finished.result()
    finished.feed(chunk({"content": "more"}))
    assert finished.result() is body and body == assemble("chat", STREAMS[0][2])


def test_a_value_nested_too_deep_to_copy_is_no_answer_and_raises_nothing() -> None:
    # The one input where the batch code before did not answer: it raised RecursionError.
    deep: Any = []
    for _ in range(700):
        deep = [deep]
    events = [chunk({"role": "assistant", "content": "a", "audio": {"data": deep}}, "stop")]
    with pytest.raises(RecursionError):
        assemble_before.assemble("chat", events)
    assert assemble("chat", events) is None
    start = {**ANTHROPIC[0], "message": {**ANTHROPIC[0]["message"], "container": deep}}
    assert assemble("messages", [start, *ANTHROPIC[1:]]) is None


# --------------------------------------------------------------------------- random streams

ODD = st.one_of(st.none(), st.integers(-1, 2), st.sampled_from(["", "a", "{", " "]),
                st.lists(st.sampled_from(["a", 1]), max_size=2),
                st.dictionaries(st.sampled_from(["a", "index", "type"]), st.integers(0, 1),
                                max_size=2))
TEXT = st.integers(0, 5).flatmap(
    lambda roll: ODD if roll == 0 else st.sampled_from(["", "a", "bc", "é"]))


def maybe(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict that may hold each of ``fields``."""
    return st.fixed_dictionaries({}, optional=fields)


def odd_or(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``strategy``, now and then an odd value."""
    return st.integers(0, 11).flatmap(lambda roll: ODD if roll == 0 else strategy)


CHAT_CALL = st.fixed_dictionaries({"index": odd_or(st.integers(0, 1))}, optional={
    "id": TEXT, "type": TEXT, "function": odd_or(maybe(name=TEXT, arguments=TEXT))})
CHAT_DELTA = odd_or(maybe(role=TEXT, content=TEXT, refusal=TEXT,
                          tool_calls=odd_or(st.lists(CHAT_CALL, max_size=2))))
CHAT_CHOICE = maybe(index=odd_or(st.integers(0, 1)), delta=CHAT_DELTA,
                    finish_reason=odd_or(st.sampled_from(["stop", None])),
                    logprobs=odd_or(maybe(content=odd_or(st.just([LOGPROB])),
                                          refusal=odd_or(st.just([LOGPROB])))))
CHAT_EVENT = st.fixed_dictionaries(
    {"object": odd_or(st.just("chat.completion.chunk"))},
    optional={"id": TEXT, "model": TEXT, "created": ODD, "service_tier": TEXT,
              "usage": odd_or(st.just({"total_tokens": 3})),
              "choices": odd_or(st.lists(CHAT_CHOICE, max_size=2))})

INDEX = odd_or(st.integers(0, 2))
BLOCK = maybe(type=st.sampled_from(["text", "thinking", "tool_use", "other"]), text=TEXT,
              thinking=TEXT, input=ODD, citations=ODD)
BLOCK_DELTA = st.fixed_dictionaries({
    "type": odd_or(st.sampled_from(["text_delta", "thinking_delta", "input_json_delta",
                                    "signature_delta", "citations_delta"])),
    "text": TEXT, "thinking": TEXT, "signature": TEXT, "citation": ODD,
    "partial_json": odd_or(st.sampled_from(['{"a":', "1}", "", " ", "{}"]))})
MESSAGE_START = st.fixed_dictionaries({"type": st.just("message_start")}, optional={
    "message": odd_or(maybe(id=TEXT, content=odd_or(st.just([{"type": "text"}])), usage=ODD))})
BLOCK_START = st.fixed_dictionaries({"type": st.just("content_block_start"), "index": INDEX,
                                     "content_block": odd_or(BLOCK)})
BLOCK_DELTA_EVENT = st.fixed_dictionaries({"type": st.just("content_block_delta"),
                                           "index": INDEX, "delta": odd_or(BLOCK_DELTA)})
BLOCK_STOP = st.fixed_dictionaries({"type": st.just("content_block_stop"), "index": INDEX})
MESSAGE_DELTA = st.fixed_dictionaries({"type": st.just("message_delta")}, optional={
    "delta": odd_or(maybe(stop_reason=TEXT, id=TEXT)),
    "usage": odd_or(maybe(output_tokens=st.one_of(st.none(), st.integers(0, 3))))})
# By weight: mostly deltas, now and then an error or an unknown event.
MESSAGES_EVENT = st.sampled_from([
    MESSAGE_START, *[BLOCK_START] * 3, *[BLOCK_DELTA_EVENT] * 8, *[BLOCK_STOP] * 2,
    MESSAGE_DELTA, st.fixed_dictionaries({"type": st.sampled_from(["message_stop", "ping"])}),
    st.fixed_dictionaries({"type": st.sampled_from(["error", "x"])}),
]).flatmap(lambda strategy: strategy)
RESPONSES_EVENT = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["response.completed",
                                                    "response.incomplete"])},
                          optional={"response": odd_or(maybe(id=TEXT, output=ODD))}),
    st.fixed_dictionaries({"type": st.just("response.output_item.done")},
                          optional={"output_index": INDEX, "item": ODD}),
    st.fixed_dictionaries({"type": st.sampled_from(
        ["response.created", "response.output_text.delta", "error", "response.failed"])}),
)
FINISH = st.lists(st.builds(lambda index: chunk({}, "stop") | {"choices": [
    {"index": index, "delta": {}, "finish_reason": "stop"}]}, st.integers(0, 1)),
    max_size=2)
START = st.just(ANTHROPIC[0])
END = st.just(ANTHROPIC[-2:])


@st.composite
def streams(draw: st.DrawFn) -> tuple[str, list[Any]]:
    """A random stream of one API, framed as a finished one more often than not."""
    api = draw(st.sampled_from(["chat", "messages", "responses"]))
    framed = draw(st.integers(0, 3)) > 0
    if api == "chat":
        return api, draw(st.lists(CHAT_EVENT, max_size=8)) + (draw(FINISH) if framed else [])
    if api == "messages":
        middle = draw(st.lists(MESSAGES_EVENT, max_size=10))
        if not framed:
            return api, middle
        blocks = [{"type": "content_block_start", "index": index, "content_block": draw(BLOCK)}
                  for index in range(draw(st.integers(0, 3)))]
        return api, [draw(START), *blocks, *middle, *draw(END)]
    return api, draw(st.lists(RESPONSES_EVENT, max_size=6))


STREAM = streams()


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STREAM)
def test_random_streams_agree_with_the_batch_code(stream: tuple[str, list[Any]]) -> None:
    api, events = stream
    check(api, events)
