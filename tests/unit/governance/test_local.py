"""Process-local fallback state: the same rules as the scripts, checked against the same models."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.lua.models import LedgerModel, WindowModel
from triogate.config_settings import GovernanceSettings, PolicySettings
from triogate.governance.facts import CheckSettings, Window
from triogate.governance.keys import budget_keys, principal_tag, rate_window_key
from triogate.governance.local import LocalBudgets, LocalGovernance, LocalWindows

KIND = {"r": "rpm", "t": "tpm", "p": "parallel"}
BASE_MS = 1_700_000_000_000
LEASE_MS = 20_000
STEPS_MS = [0, 1, 499, 999, 1000, 5_000, LEASE_MS - 1, LEASE_MS, 58_999, 59_000, 60_000, 61_000]


@settings(max_examples=300, deadline=None)
@given(
    windows=st.lists(
        st.one_of(
            st.tuples(st.just("r"), st.integers(0, 12)),
            st.tuples(st.just("t"), st.integers(0, 600)),
            st.tuples(st.just("p"), st.integers(0, 4)),
        ),
        min_size=1, max_size=4,
    ),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("admit"), st.integers(0, 200)),
            st.tuples(st.just("admit"), st.integers(0, 200)),
            st.tuples(st.just("settle"), st.integers(0, 50), st.sampled_from("aux"),
                      st.integers(0, 250)),
            st.tuples(st.just("advance"), st.sampled_from(STEPS_MS)),
        ),
        max_size=60,
    ),
    start=st.integers(0, 999),
)
def test_local_windows_match_the_sliding_window_model(
    windows: list[tuple[str, int]], ops: list[tuple[object, ...]], start: int
) -> None:
    ws = [Window(kind=KIND[k], key=f"w{i}", limit=lim) for i, (k, lim) in enumerate(windows)]
    model = WindowModel(kinds=[k for k, _ in windows], limits=[lim for _, lim in windows])
    local = LocalWindows(max_entries=100)
    now = BASE_MS + start
    counted: list[tuple[str, int, int]] = []
    for n, op in enumerate(ops):
        if op[0] == "admit":
            rid, estimate = f"r{n}", int(op[1])  # type: ignore[call-overload]
            verdict = local.admit(ws, request_id=rid, estimate_tokens=estimate, now_ms=now,
                                  lease_ms=LEASE_MS)
            got = [int(verdict.admitted), 0 if verdict.failed is None else verdict.failed + 1,
                   verdict.retry_after_ms, *verdict.remaining]
            assert got == model.admit(rid, estimate, now, LEASE_MS)
            if verdict.admitted:
                counted.append((rid, now // 1000, estimate))
        elif op[0] == "settle" and counted:
            rid, bucket, estimate = counted.pop(int(op[1]) % len(counted))  # type: ignore[call-overload]
            mode, actual = str(op[2]), int(op[3])  # type: ignore[call-overload]
            local.settle(ws, request_id=rid, mode=mode, bucket=bucket, estimate_tokens=estimate,
                         actual_tokens=actual, now_ms=now)
            model.settle(rid, mode, bucket, estimate, actual, now)
        elif op[0] == "advance":
            now += int(op[1])  # type: ignore[call-overload]
        assert [local.used(w, now) for w in ws] == [model.used(i, now) for i in range(len(ws))]


@settings(max_examples=300, deadline=None)
@given(
    max_budget=st.integers(0, 1000),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("reserve"), st.integers(0, 400)),
            st.tuples(st.just("reserve"), st.integers(0, 400)),
            st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 400)),
            st.tuples(st.just("advance"), st.sampled_from([0, 1, LEASE_MS - 1, LEASE_MS])),
        ),
        max_size=60,
    ),
)
def test_local_budgets_match_the_ledger_model(
    max_budget: int, ops: list[tuple[object, ...]]
) -> None:
    local = LocalBudgets(max_entries=100)
    model = LedgerModel(max_budget=max_budget)
    now = BASE_MS
    requests: list[str] = []
    for n, op in enumerate(ops):
        if op[0] == "reserve":
            rid = f"r{n}"
            v = local.reserve("key", "k", 0, request_id=rid, amount_nanousd=int(op[1]),  # type: ignore[call-overload]
                              max_budget_nanousd=max_budget, now_ms=now, lease_ms=LEASE_MS)
            got = [int(v.admitted), v.spend_nanousd, v.reserved_nanousd]
            assert got == model.reserve(rid, 0, int(op[1]), now, LEASE_MS)  # type: ignore[call-overload]
            requests.append(rid)
        elif op[0] == "settle" and requests:
            rid = requests.pop(int(op[1]) % len(requests))  # type: ignore[call-overload]
            local.settle("key", "k", 0, request_id=rid, actual_nanousd=int(op[2]))  # type: ignore[call-overload]
            model.settle(rid, 0, int(op[2]))  # type: ignore[call-overload]
        elif op[0] == "advance":
            now += int(op[1])  # type: ignore[call-overload]
        assert local.spend("key", "k", 0) == model.spend.get(0, 0)


def test_observed_spend_replaces_local_knowledge() -> None:
    local = LocalBudgets(max_entries=10)
    local.settle("team", "ml", 3, request_id="a", actual_nanousd=50)
    assert local.spend("team", "ml", 3) == 50
    local.observe("team", "ml", 3, 1_000)
    assert local.spend("team", "ml", 3) == 1_000
    assert local.spend("team", "ml", 4) == 0  # another period knows nothing


def test_local_state_is_bounded() -> None:
    local = LocalGovernance(max_entries=3)
    for i in range(10):
        local.budgets.observe("user", f"u{i}", 0, 100 + i)
        w = Window(kind="rpm", key=f"w{i}", limit=5)
        local.windows.admit([w], request_id=f"r{i}", estimate_tokens=0, now_ms=BASE_MS,
                            lease_ms=LEASE_MS)
    # The three most recently written survive; older ones are forgotten.
    assert [local.budgets.spend("user", f"u{i}", 0) for i in range(10)] == [0] * 7 + [107, 108, 109]
    assert [local.windows.used(Window(kind="rpm", key=f"w{i}", limit=5), BASE_MS)
            for i in range(10)] == [0] * 7 + [1, 1, 1]


def test_keys_share_one_tag_per_principal_and_hash_unsafe_ids() -> None:
    assert principal_tag("team", "ml") == "{team:ml}"
    unsafe = principal_tag("end_user", "a}b{c")
    assert unsafe.count("{") == 1 and unsafe.count("}") == 1 and unsafe.startswith("{end_user:#")
    assert principal_tag("end_user", "x" * 500) != principal_tag("end_user", "x" * 499)
    keys = [*budget_keys("end_user", "a}b", 4).as_tuple(),
            rate_window_key("end_user", "a}b", "rpm", "m{1}"),
            rate_window_key("end_user", "a}b", "parallel")]
    tags = {k[k.index("{"): k.index("}") + 1] for k in keys}
    assert tags == {principal_tag("end_user", "a}b")}


def test_check_settings_come_from_the_config_sections() -> None:
    built = CheckSettings.from_config(
        PolicySettings(budgets="fail-closed"), GovernanceSettings(lease_s=2.5)
    )
    assert (built.budgets_policy, built.rate_limits_policy, built.lease_ms) == (
        "fail-closed", "fail-open", 2_500,
    )


@settings(max_examples=300, deadline=None)
@given(
    windows=st.lists(
        st.one_of(
            st.tuples(st.just("r"), st.integers(0, 12)),
            st.tuples(st.just("t"), st.integers(0, 600)),
            st.tuples(st.just("p"), st.integers(0, 4)),
        ),
        min_size=1, max_size=4,
    ),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("count"), st.integers(0, 200)),
            st.tuples(st.just("count"), st.integers(0, 200)),
            st.tuples(st.just("admit"), st.integers(0, 200)),
            st.tuples(st.just("settle"), st.integers(0, 50), st.sampled_from("aux"),
                      st.integers(0, 250)),
            st.tuples(st.just("advance"), st.sampled_from(STEPS_MS)),
        ),
        max_size=80,
    ),
    start=st.integers(0, 999),
)
def test_counting_a_redis_admission_matches_the_sliding_window_model(
    windows: list[tuple[str, int]], ops: list[tuple[object, ...]], start: int
) -> None:
    # The mirror of a Redis decision (count) counts as an admission the model is told
    # to take whatever its limits say, and what follows decides as the model does.
    ws = [Window(kind=KIND[k], key=f"w{i}", limit=lim) for i, (k, lim) in enumerate(windows)]
    model = WindowModel(kinds=[k for k, _ in windows], limits=[lim for _, lim in windows])
    local = LocalWindows(max_entries=100)
    now = BASE_MS + start
    counted: list[tuple[str, int, int]] = []
    for n, op in enumerate(ops):
        rid = f"r{n}"
        if op[0] == "count":
            estimate = int(op[1])  # type: ignore[call-overload]
            local.count(ws, request_id=rid, estimate_tokens=estimate, now_ms=now,
                        lease_ms=LEASE_MS)
            # The model's own state, counted as an admission that cannot fail.
            model.limits, saved = [10**9] * len(ws), model.limits
            assert model.admit(rid, estimate, now, LEASE_MS)[0] == 1
            model.limits = saved
            counted.append((rid, now // 1000, estimate))
        elif op[0] == "admit":
            estimate = int(op[1])  # type: ignore[call-overload]
            verdict = local.admit(ws, request_id=rid, estimate_tokens=estimate, now_ms=now,
                                  lease_ms=LEASE_MS)
            got = [int(verdict.admitted), 0 if verdict.failed is None else verdict.failed + 1,
                   verdict.retry_after_ms, *verdict.remaining]
            assert got == model.admit(rid, estimate, now, LEASE_MS)
            if verdict.admitted:
                counted.append((rid, now // 1000, estimate))
        elif op[0] == "settle" and counted:
            rid, bucket, estimate = counted.pop(int(op[1]) % len(counted))  # type: ignore[call-overload]
            mode, actual = str(op[2]), int(op[3])  # type: ignore[call-overload]
            local.settle(ws, request_id=rid, mode=mode, bucket=bucket, estimate_tokens=estimate,
                         actual_tokens=actual, now_ms=now)
            model.settle(rid, mode, bucket, estimate, actual, now)
        elif op[0] == "advance":
            now += int(op[1])  # type: ignore[call-overload]
        assert [local.used(w, now) for w in ws] == [model.used(i, now) for i in range(len(ws))]
    for counts in local._counts.data.values():  # bounded: one window's buckets at most
        assert len(counts) <= 60 + len(ops)
