"""assemble and replay: stream <-> complete answer, judged by the official SDKs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from triogate.cache.replay import assemble, replay

from .bodies import BODIES
from .sdk import sdk_final

IDS = [b[0] for b in BODIES]

# What the SDKs add to their final objects on their own (parsing helpers), not ours.
_SDK_EXTRAS = frozenset({"parsed", "parsed_arguments", "parsed_output"})


def comparable(value: Any, *, in_tool_calls: bool = False) -> Any:
    """An answer without nulls and SDK helper fields, for comparing with an SDK's object.

    The SDKs fill every optional field they know with None (``audio``,
    ``function_call``, ``stop_details``, ...) and keep the streamed ``index`` of chat
    tool calls; neither is a difference in the answer.
    """
    if isinstance(value, dict):
        return {
            k: comparable(v, in_tool_calls=k == "tool_calls")
            for k, v in value.items()
            if k not in _SDK_EXTRAS and v is not None and not (in_tool_calls and k == "index")
        }
    if isinstance(value, list):
        return [comparable(v, in_tool_calls=in_tool_calls) for v in value]
    return value


@pytest.mark.parametrize(("label", "api", "body"), BODIES, ids=IDS)
def test_assemble_inverts_replay(label: str, api: str, body: dict[str, Any]) -> None:
    events = replay(api, body)  # type: ignore[arg-type]
    assert assemble(api, events) == body  # type: ignore[arg-type]


@pytest.mark.parametrize(("label", "api", "body"), BODIES, ids=IDS)
def test_the_sdks_accumulate_a_replay_into_the_same_answer(
    label: str, api: str, body: dict[str, Any]
) -> None:
    final = sdk_final(api, replay(api, body))  # type: ignore[arg-type]
    assert comparable(final) == comparable(body)


@pytest.mark.parametrize(("label", "api", "body"), BODIES, ids=IDS)
def test_replay_does_not_alias_the_body(label: str, api: str, body: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(body)
    events = replay(api, body)  # type: ignore[arg-type]
    assembled = assemble(api, events)  # type: ignore[arg-type]
    assert assembled is not None
    # Mutating what came out must not reach the cached body (shared by later hits).
    for event in events:
        event.clear()
    assembled.clear()
    assert body == snapshot


def test_replay_chat_ends_with_a_usage_chunk_and_each_choice_finishes() -> None:
    body = next(b for label, _, b in BODIES if label == "chat n=2 logprobs")
    events = replay("chat", body)
    assert events[-1]["choices"] == [] and events[-1]["usage"] == body["usage"]
    finishes = {c["index"]: c["finish_reason"] for e in events for c in e["choices"]
                if c["finish_reason"]}
    assert finishes == {0: "stop", 1: "length"}
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == body["id"] for e in events)


def test_replay_messages_is_bracketed_by_start_and_stop() -> None:
    body = next(b for label, _, b in BODIES if label == "messages thinking tools")
    kinds = [e["type"] for e in replay("messages", body)]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 5


def test_replay_responses_numbers_its_events_and_ends_in_the_status() -> None:
    for label, api, body in BODIES:
        if api != "responses":
            continue
        events = replay("responses", body)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[0]["type"] == "response.created"
        assert events[-1]["type"] == f"response.{body['status']}", label


def test_embeddings_have_no_stream() -> None:
    with pytest.raises(ValueError, match="no streamed form"):
        replay("embeddings", {"object": "list", "data": []})


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_replay_refuses_a_body_of_another_shape(api: str) -> None:
    with pytest.raises(ValueError, match=f"not a complete {api} answer"):
        replay(api, {"unexpected": True})  # type: ignore[arg-type]
