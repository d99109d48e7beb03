"""The cooling-down gauge reads the local mirror: its own failures and what Redis returned."""

from __future__ import annotations

from triogate.routing.state import LocalMirror


def test_the_mirror_counts_deployments_cooling_down_until_their_cooldown_ends() -> None:
    mirror = LocalMirror()
    now = 1_000_000
    assert mirror.cooling(now) == 0
    assert not mirror.note_failure("a", now_ms=now, allowed_fails=2, cooldown_s=30)
    assert mirror.cooling(now) == 0
    assert mirror.note_failure("a", now_ms=now, allowed_fails=2, cooldown_s=30)
    assert mirror.note_failure("b", now_ms=now + 5, allowed_fails=1, cooldown_s=10)
    assert mirror.cooling(now + 5) == 2
    assert mirror.cooling(now + 10_005) == 1  # b's 10 s are over; a's 30 s are not
    assert mirror.cooling(now + 30_000) == 0
