"""A finished stream's outcome from its assembly and its naming event is the outcome its
kept events gave: the same response id in the spend row, the same answer stored.

Before, the producer kept every event and settlement read the response id from them and
assembled the answer from them; now the producer folds each event into an assembler and
keeps only the first event that names the id (``flow._outcome_events``), and settlement
stores ``outcome.body`` alone. Checked on every stream of the cache's assembly tests, their
prefixes, error and broken versions, with and without the cache storing the answer.

One difference, by design: with the cache storing the answer, the response id is the
answer's own (settlement reads ``outcome.body["id"]`` first), where the kept events gave
the first id the stream named. The two differ only for a stream that names two ids (among
these, broken versions of Responses streams whose ``response.created`` and
``response.completed`` disagree: 60 of ~10,700 versions); the non-streaming path has
always used the answer's own.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.cache import assemble_before
from tests.unit.cache.test_assembly import CASES, variants
from triogate.api import flow, settlement
from triogate.cache.replay import assembler


def stored(outcome: settlement.Outcome, api: str) -> dict[str, Any] | None:
    """What ``settlement.settle`` hands the cache for a successful stream: its body (the
    events are only read for the response id)."""
    return outcome.body


def outcomes(api: str, events: list[Any]) -> tuple[settlement.Outcome, settlement.Outcome]:
    """The outcome with the cache storing the answer, and without."""
    assembly = assembler(api)  # type: ignore[arg-type]
    assert assembly is not None
    naming = None
    for event in events:
        assembly.feed(event)
        if naming is None and settlement.named_id(event) is not None:
            naming = [event]
    made = []
    for used in (assembly, None):
        body, kept = flow._outcome_events(used, naming or [])
        made.append(settlement.Outcome(admitted=True, status="success", http_status=200,
                                       body=body, events=kept))
    return made[0], made[1]


STREAMS = [(label, api, events) for label, api, events in CASES if api != "embeddings"]


@pytest.mark.parametrize(("label", "api", "events"), STREAMS, ids=[s[0] for s in STREAMS])
def test_the_response_id_and_the_stored_answer_are_those_of_the_kept_events(
    label: str, api: str, events: list[dict[str, Any]]
) -> None:
    for version in [events, *variants(api, events)]:
        before = settlement.Outcome(admitted=True, status="success", http_status=200,
                                    events=list(version))
        expected_id = settlement.response_id(before)
        expected = assemble_before.assemble(api, version)  # type: ignore[arg-type]
        with_cache, without = outcomes(api, version)
        assert settlement.response_id(without) == expected_id
        if settlement.response_id(with_cache) != expected_id:
            # The one difference: the id is the stored answer's own now, where the kept
            # events gave the first one named. They differ only when the stream names
            # two ids (here, a broken one), as a Responses stream whose
            # response.created and response.completed disagree.
            assert with_cache.body is not None and with_cache.body.get("id") is not None
            assert version is not events and api == "responses"
            assert with_cache.events and with_cache.body["id"] != settlement.named_id(
                with_cache.events[0])
        answer = stored(with_cache, api)
        assert answer == expected and repr(answer) == repr(expected)
