"""The SQL store against real SQLite and real PostgreSQL (every test runs on both)."""

from __future__ import annotations

import functools
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import sqlalchemy as sa
import trio

from triogate.errors import StoreError
from triogate.governance.from_rows import (
    end_user_principal,
    key_principal,
    tag_principal,
    team_principal,
    user_principal,
)
from triogate.store import (
    SpendLogRow,
    StoreConflict,
    hash_key,
    open_store,
    queries_spend,
    schema,
)
from triogate.store.schema import metadata

if TYPE_CHECKING:
    from pathlib import Path

    from triogate.store import Store

    from .conftest import FakeWallClock, SqlTarget, TcpProxy

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000


# --------------------------------------------------------------------------- opening


async def test_default_is_a_sqlite_file_in_the_state_folder_in_wal_mode(tmp_path: Path) -> None:
    state = tmp_path / "nested" / "state"
    with trio.fail_after(10):
        async with open_store(None, state_dir=state) as store:
            assert store.dialect == "sqlite"
            await store.ping()
            with store.engine.connect() as conn:
                assert conn.execute(sa.text("PRAGMA journal_mode")).scalar() == "wal"
                assert conn.execute(sa.text("PRAGMA busy_timeout")).scalar() == 10_000
    assert (state / "triogate.db").is_file()


async def test_schema_creation_is_idempotent_and_safe_for_concurrent_openers(
    sql_target: SqlTarget,
) -> None:
    opened: list[str] = []

    async def open_one() -> None:
        async with open_store(sql_target.url, state_dir=sql_target.state_dir) as store:
            await store.ping()
            opened.append(store.dialect)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(open_one)
        await open_one()  # a fifth, on an existing schema
    assert opened == [sql_target.dialect] * 5


_OPEN_IN_A_PROCESS = """
import pathlib, sys, time
import trio
from triogate.store import open_store

async def main() -> None:
    async with open_store(sys.argv[1] or None, state_dir=pathlib.Path(sys.argv[2])) as store:
        await store.ping()

time.sleep(max(0.0, float(sys.argv[3]) - time.time()))  # start together
trio.run(main)
"""


async def test_processes_starting_at_once_all_open_the_same_new_database(
    sql_target: SqlTarget,
) -> None:
    start_at = time.time() + 2.0
    args = [
        sys.executable,
        "-c",
        _OPEN_IN_A_PROCESS,
        sql_target.url or "",
        str(sql_target.state_dir),
        str(start_at),
    ]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(functools.partial(trio.run_process, args, check=True))
        async with open_store(sql_target.url, state_dir=sql_target.state_dir) as store:
            assert (await store.list_keys())[1] == 0


async def test_postgres_url_schemes_all_map_to_psycopg(postgres_target: SqlTarget) -> None:
    assert postgres_target.url is not None
    tail = postgres_target.url.split("://", 1)[1]
    with trio.fail_after(20):
        for scheme in ("postgres", "postgresql", "postgresql+psycopg"):
            async with open_store(f"{scheme}://{tail}", state_dir=postgres_target.state_dir) as s:
                assert s.dialect == "postgresql"
                assert s.engine.dialect.driver == "psycopg"
                await s.ping()


async def test_unreachable_database_is_a_store_error_without_the_password(tmp_path: Path) -> None:
    with trio.fail_after(20), pytest.raises(StoreError) as info:
        async with open_store("postgresql://someone:s3cret-pw@127.0.0.1:1/db", state_dir=tmp_path):
            pass
    assert "s3cret-pw" not in str(info.value)
    assert "create schema failed" in str(info.value)


@pytest.mark.parametrize("url", ["mysql://u:s3cret-pw@h/db", "::not a url s3cret-pw::"])
async def test_unsupported_or_invalid_urls_are_refused_without_the_password(
    url: str, tmp_path: Path
) -> None:
    with trio.fail_after(5), pytest.raises(StoreError) as info:
        async with open_store(url, state_dir=tmp_path):
            pass
    assert "s3cret-pw" not in str(info.value)


async def test_ping_fails_while_postgres_is_down_and_recovers(
    postgres_proxy: tuple[TcpProxy, str], tmp_path: Path
) -> None:
    proxy, url = postgres_proxy
    with trio.fail_after(30):
        async with open_store(url, state_dir=tmp_path) as store:
            await store.ping()
            proxy.down()
            with pytest.raises(StoreError, match="ping failed"):
                await store.ping()
            with pytest.raises(StoreError):
                await store.get_keys(["x"])
            await proxy.up()
            await store.ping()  # the pool replaced the dead connections
            assert await store.get_keys(["x"]) == {}


async def test_a_missing_table_is_a_store_error(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE teams"))
    with trio.fail_after(10), pytest.raises(StoreError, match="get teams failed"):
        await store.get_teams(["t"])


# --------------------------------------------------------------------------- keys


async def test_key_crud(store: Store, wall_clock: FakeWallClock) -> None:
    with trio.fail_after(10):
        raw, row = await store.create_key(
            key_alias="ci",
            team_id="t1",
            models=["gpt-4o", "claude"],
            max_budget_nanousd=5_000_000_000,
            budget_duration="30d",
            rpm_limit=60,
            tpm_limit=10_000,
            max_parallel_requests=3,
            model_rpm_limit={"gpt-4o": 10},
            model_tpm_limit={"gpt-4o": 1000},
            metadata={"owner": "ci", "n": 1},
            tags=["prod"],
            expires_at_ms=wall_clock.now_ms + 3_600_000,
        )
        assert raw.startswith("sk-") and len(raw) == 46
        assert row.token_hash == hash_key(raw)
        assert row.key_hint == f"sk-...{raw[-4:]}"
        assert row.models == ("gpt-4o", "claude")
        assert row.budget_duration_s == 30 * 86_400
        assert row.budget_anchor_s == wall_clock.now_ms // 1000
        assert row.created_at_ms == row.updated_at_ms == wall_clock.now_ms
        assert row.blocked is False

        got = await store.get_keys([row.token_hash, "missing"])
        assert got == {row.token_hash: row}

        wall_clock.now_ms += 5000
        updated = await store.update_key(row.token_hash, key_alias="renamed", blocked=True)
        assert updated == attrs.evolve(
            row, key_alias="renamed", blocked=True, updated_at_ms=wall_clock.now_ms
        )
        assert await store.update_key("missing", key_alias="x") is None

        assert await store.delete_keys([row.token_hash, "missing"]) == 1
        assert await store.get_keys([row.token_hash]) == {}
        assert await store.delete_keys([]) == 0


async def test_a_chosen_raw_key_is_stored_hashed_and_cannot_be_created_twice(store: Store) -> None:
    with trio.fail_after(10):
        raw, row = await store.create_key(raw_key="sk-my-own-key-1234")
        assert raw == "sk-my-own-key-1234"
        assert row.token_hash == hash_key(raw)
        with pytest.raises(StoreConflict):
            await store.create_key(raw_key="sk-my-own-key-1234")


async def test_the_raw_key_appears_nowhere_in_the_database(
    store: Store, sql_target: SqlTarget
) -> None:
    with trio.fail_after(10):
        raw, row = await store.create_key(key_alias="a", metadata={"x": "y"}, tags=["t"])
        await store.update_key(row.token_hash, budget_duration="1d")
        await store.insert_spend_logs(
            [SpendLogRow(request_id="r", api="chat", key_hash=row.token_hash)]
        )
    found: list[str] = []
    with store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            columns = [sa.cast(c, sa.Text) for c in table.c]
            for values in conn.execute(sa.select(*columns)):
                found.extend(str(v) for v in values if v is not None)
    assert row.token_hash in found  # the check sees the keys table
    assert not [v for v in found if raw in v or raw[3:] in v]
    if sql_target.dialect == "sqlite":
        for path in sql_target.state_dir.glob("triogate.db*"):
            assert raw[3:].encode() not in await trio.Path(path).read_bytes()


async def test_list_keys_filters_and_pages_with_totals(
    store: Store, wall_clock: FakeWallClock
) -> None:
    with trio.fail_after(20):
        hashes = []
        for i in range(7):
            wall_clock.now_ms += 1
            _, row = await store.create_key(team_id="a" if i % 2 else "b", user_id=f"u{i % 3}")
            hashes.append(row.token_hash)
        page1, total = await store.list_keys(size=3)
        page3, total3 = await store.list_keys(page=3, size=3)
        assert total == total3 == 7
        assert [r.token_hash for r in page1] == hashes[:3]
        assert [r.token_hash for r in page3] == hashes[6:]
        team_a, total_a = await store.list_keys(team_id="a", size=2)
        assert total_a == 3 and [r.token_hash for r in team_a] == [hashes[1], hashes[3]]
        both, total_both = await store.list_keys(team_id="b", user_id="u0")
        assert total_both == 2 and {r.token_hash for r in both} == {hashes[0], hashes[6]}
        with pytest.raises(ValueError):
            await store.list_keys(page=0)


async def test_budget_anchor_moves_only_when_the_duration_changes(
    store: Store, wall_clock: FakeWallClock
) -> None:
    with trio.fail_after(10):
        _, row = await store.create_key(budget_duration="1d")
        created_s = wall_clock.now_ms // 1000
        wall_clock.now_ms += 10_000
        same = await store.update_key(row.token_hash, budget_duration="1d", rpm_limit=5)
        assert same is not None and same.budget_anchor_s == created_s
        changed = await store.update_key(row.token_hash, budget_duration="7d")
        assert changed is not None
        assert changed.budget_anchor_s == created_s + 10
        assert changed.budget_duration_s == 7 * 86_400
        explicit = await store.update_key(row.token_hash, budget_duration="1h", budget_anchor_s=42)
        assert explicit is not None and explicit.budget_anchor_s == 42
        cleared = await store.update_key(row.token_hash, budget_duration=None)
        assert cleared is not None and cleared.budget_duration_s is None


async def test_bad_fields_are_refused_before_any_sql(store: Store) -> None:
    with trio.fail_after(10):
        with pytest.raises(TypeError, match="unknown key field"):
            await store.create_key(max_budget=5)
        with pytest.raises(TypeError, match="accepted"):
            await store.update_team("t", team_name="x")
        with pytest.raises(ValueError, match="invalid duration"):
            await store.create_team(budget_duration="1 fortnight")
        with pytest.raises(TypeError, match="list of strings"):
            await store.create_key(models="gpt-4o")
        with pytest.raises(TypeError):
            await store.update_key("h", key_hint="sk-...abcd")
        assert (await store.list_keys())[1] == 0


# --------------------------------------------------------------------------- other entities


@attrs.frozen
class EntityApi:
    name: str
    id_field: str
    fields: dict[str, Any]
    update: dict[str, Any]


ENTITIES = [
    EntityApi(
        "team",
        "team_id",
        {"team_alias": "A", "models": ["m"], "rpm_limit": 5, "max_parallel_requests": 2},
        {"team_alias": "B"},
    ),
    EntityApi(
        "user",
        "user_id",
        {"user_email": "a@x", "user_alias": "al", "tpm_limit": 9, "max_budget_nanousd": 10**12},
        {"blocked": True},
    ),
    EntityApi(
        "end_user",
        "user_id",
        {"alias": "cust", "budget_duration": "1mo"},
        {"max_budget_nanousd": 7},
    ),
    EntityApi(
        "tag", "tag", {"description": "prod traffic", "rpm_limit": 100}, {"budget_duration": "15m"}
    ),
]


@pytest.mark.parametrize("api", ENTITIES, ids=lambda e: e.name)
async def test_entity_crud_and_pagination(
    store: Store, wall_clock: FakeWallClock, api: EntityApi
) -> None:
    create = getattr(store, f"create_{api.name}")
    get = getattr(store, f"get_{api.name}s")
    update = getattr(store, f"update_{api.name}")
    delete = getattr(store, f"delete_{api.name}s")
    list_ = getattr(store, f"list_{api.name}s")
    with trio.fail_after(20):
        rows = []
        for i in range(5):
            wall_clock.now_ms += 1
            rows.append(await create(**{api.id_field: f"id-{i}"}, **api.fields))
        ids = [getattr(r, api.id_field) for r in rows]
        assert ids == [f"id-{i}" for i in range(5)]
        for name, value in api.fields.items():
            expected = tuple(value) if isinstance(value, list) else value
            assert getattr(rows[0], name) == expected
        assert rows[0].created_at_ms == wall_clock.now_ms - 4

        assert await get(["id-1", "id-3", "nope"]) == {"id-1": rows[1], "id-3": rows[3]}

        with pytest.raises(StoreConflict):
            await create(**{api.id_field: "id-0"})

        wall_clock.now_ms += 100
        changed = await update("id-2", **api.update)
        assert changed is not None
        for name, value in api.update.items():
            assert getattr(changed, name) == value
        unchanged = {
            k: v
            for k, v in attrs.asdict(rows[2]).items()
            if k not in api.update
            and k not in ("updated_at_ms", "budget_duration_s", "budget_anchor_s")
        }
        assert {k: attrs.asdict(changed)[k] for k in unchanged} == unchanged
        assert changed.updated_at_ms == wall_clock.now_ms
        assert await update("nope", **api.update) is None

        page, total = await list_(page=2, size=2)
        assert total == 5 and [getattr(r, api.id_field) for r in page] == ["id-2", "id-3"]

        assert await delete(["id-0", "id-4", "nope"]) == 2
        _, total = await list_()
        assert total == 3


async def test_teams_and_users_get_generated_ids(store: Store) -> None:
    with trio.fail_after(10):
        team = await store.create_team(team_alias="x")
        user = await store.create_user()
        assert len(team.team_id) == 36 and len(user.user_id) == 36
        assert (await store.list_users(user_email="nobody"))[1] == 0


async def test_rows_map_to_principals(store: Store, wall_clock: FakeWallClock) -> None:
    with trio.fail_after(10):
        _, key = await store.create_key(
            key_alias="k",
            models=["m"],
            max_budget_nanousd=100,
            budget_duration="1h",
            rpm_limit=1,
            tpm_limit=2,
            max_parallel_requests=3,
            model_rpm_limit={"m": 4},
            expires_at_ms=123,
            blocked=True,
        )
        team = await store.create_team(team_id="t", team_alias="T", tpm_limit=5)
        user = await store.create_user(user_id="u", user_email="u@x", models=["a"])
        end_user = await store.create_end_user(user_id="e", max_parallel_requests=9)
        tag = await store.create_tag(tag="g", max_budget_nanousd=1, budget_duration="1d")
    p = key_principal(key)
    assert (p.kind, p.id, p.models, p.blocked, p.expires_ms, p.alias) == (
        "key",
        key.token_hash,
        ("m",),
        True,
        123,
        "k",
    )
    assert p.model_rpm == {"m": 4} and p.model_tpm == {}
    assert attrs.asdict(p.limits) == {
        "max_budget_nanousd": 100,
        "budget_duration_s": 3600,
        "budget_anchor_s": wall_clock.now_ms // 1000,
        "rpm": 1,
        "tpm": 2,
        "max_parallel": 3,
    }
    assert team_principal(team).limits.tpm == 5 and team_principal(team).alias == "T"
    assert user_principal(user).alias == "u@x" and user_principal(user).models == ("a",)
    assert end_user_principal(end_user).limits.max_parallel == 9
    tp = tag_principal(tag)
    assert (tp.kind, tp.id, tp.limits.budget_duration_s) == ("tag", "g", 86_400)


# --------------------------------------------------------------------------- spend logs


def spend_row(request_id: str, **fields: Any) -> SpendLogRow:
    return SpendLogRow(request_id=request_id, api="chat", **fields)


async def test_insert_spend_logs_is_idempotent_by_request_id(store: Store) -> None:
    rows = [spend_row(f"r{i}", tags=("a", "b"), cost_nanousd=i) for i in range(3)]
    with trio.fail_after(10):
        assert await store.insert_spend_logs(rows) == 3
        assert await store.insert_spend_logs(rows) == 0
        assert await store.insert_spend_logs([*rows, spend_row("r9")]) == 1
        assert await store.insert_spend_logs([spend_row("x"), spend_row("x")]) == 1
        found, total = await store.query_spend_logs()
        totals = await store.spend_totals(tag="a")
    assert total == 5
    assert {r.request_id for r in found} == {"r0", "r1", "r2", "r9", "x"}
    assert totals.requests == 3 and totals.cost_nanousd == 3


async def test_spend_rows_round_trip_every_field(store: Store) -> None:
    row = SpendLogRow(
        request_id="req-1",
        api="messages",
        key_hash="h",
        key_alias="ka",
        team_id="t",
        user_id="u",
        end_user="e",
        tags=("x", "y", "naïve \"quoted\" ✓"),
        model_group="claude",
        deployment_id="d1",
        upstream_model="claude-3-5",
        input_tokens=10,
        output_tokens=20,
        cost_nanousd=2**62,
        cache_hit=True,
        status="error",
        http_status=502,
        latency_ms=33,
        start_time_ms=1_700_000_000_000,
        end_time_ms=1_700_000_000_033,
        response_id="msg_1",
        client_request_id="client-1",
    )
    with trio.fail_after(10):
        await store.insert_spend_logs([row])
        found, _ = await store.query_spend_logs()
        by_tag, _ = await store.query_spend_logs(tag="naïve \"quoted\" ✓")
    assert found == [row]
    assert by_tag == [row]


def test_the_sqlite_insert_binds_every_column_of_a_row() -> None:
    """The SQLite insert names its columns itself (the driver's executemany, no
    SQLAlchemy per row): every column of the table, each a field of the row."""
    columns = [c.name for c in schema.spend_logs.columns]
    assert sorted([*queries_spend._PLAIN_COLUMNS, "tags"]) == sorted(columns)
    assert {f.name for f in attrs.fields(SpendLogRow)} == set(columns)
    values = queries_spend.row_to_sqlite(spend_row("r", tags=("a",), cache_hit=True))
    assert len(values) == len(columns) and values[-1] == '["a"]'


SPEND = [
    # request id, key, team, user, end user, tags, start day offset (ms), cost
    ("a1", "k1", "t1", "u1", "e1", ("prod",), 0, 10),
    ("a2", "k1", "t1", "u2", None, ("prod", "beta"), DAY_MS - 1, 20),
    ("a3", "k2", "t1", "u1", "e2", (), DAY_MS, 40),
    ("a4", "k2", "t2", None, "e1", ("production",), DAY_MS + 5, 80),
    ("a5", "k3", None, "u2", None, ("beta",), 3 * DAY_MS, 160),
]
BASE_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z


async def insert_sample(store: Store) -> None:
    await store.insert_spend_logs(
        [
            spend_row(
                rid,
                key_hash=k,
                team_id=t,
                user_id=u,
                end_user=e,
                tags=tags,
                start_time_ms=BASE_MS + off,
                end_time_ms=BASE_MS + off + 1,
                cost_nanousd=cost,
                input_tokens=cost // 10,
                output_tokens=1,
            )
            for rid, k, t, u, e, tags, off, cost in SPEND
        ]
    )


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, {"a1", "a2", "a3", "a4", "a5"}),
        ({"key_hash": "k1"}, {"a1", "a2"}),
        ({"team_id": "t1"}, {"a1", "a2", "a3"}),
        ({"user_id": "u2"}, {"a2", "a5"}),
        ({"end_user": "e1"}, {"a1", "a4"}),
        ({"tag": "prod"}, {"a1", "a2"}),  # exact: "production" does not match
        ({"tag": "beta"}, {"a2", "a5"}),
        ({"tag": "nope"}, set()),
        ({"start_ms": BASE_MS + DAY_MS}, {"a3", "a4", "a5"}),
        ({"end_ms": BASE_MS + DAY_MS}, {"a1", "a2"}),
        ({"start_ms": BASE_MS + 1, "end_ms": BASE_MS + DAY_MS + 5}, {"a2", "a3"}),
        ({"team_id": "t1", "user_id": "u1"}, {"a1", "a3"}),
        ({"key_hash": "k2", "end_user": "e1"}, {"a4"}),
        ({"tag": "beta", "start_ms": BASE_MS + DAY_MS}, {"a5"}),
        ({"tag": "prod", "team_id": "t1", "end_ms": BASE_MS + 1}, {"a1"}),
    ],
)
async def test_spend_filters_alone_and_combined(
    store: Store, filters: dict[str, Any], expected: set[str]
) -> None:
    with trio.fail_after(10):
        await insert_sample(store)
        found, total = await store.query_spend_logs(**filters)
        totals = await store.spend_totals(**filters)
    assert {r.request_id for r in found} == expected
    assert total == totals.requests == len(expected)
    costs = {rid: cost for rid, *_, cost in SPEND}
    assert totals.cost_nanousd == sum(costs[r] for r in expected)
    assert totals.input_tokens == sum(costs[r] // 10 for r in expected)
    assert totals.output_tokens == len(expected)


async def test_a_large_batch_is_one_call(store: Store) -> None:
    # More bound parameters than SQLite allows in one statement: SQLAlchemy splits it.
    rows = [spend_row(f"r{i}", tags=("a", f"t{i % 7}"), cost_nanousd=i) for i in range(2500)]
    with trio.fail_after(30):
        assert await store.insert_spend_logs(rows) == 2500
        assert (await store.spend_totals(tag="t3")).requests == len(range(3, 2500, 7))
        assert (await store.spend_totals()).cost_nanousd == sum(range(2500))


async def test_spend_pages_are_newest_first_with_totals(store: Store) -> None:
    with trio.fail_after(10):
        await insert_sample(store)
        page1, total = await store.query_spend_logs(size=2)
        page2, _ = await store.query_spend_logs(size=2, page=2)
        page3, _ = await store.query_spend_logs(size=2, page=3)
    assert total == 5
    assert [r.request_id for r in page1 + page2 + page3] == ["a5", "a4", "a3", "a2", "a1"]


async def test_spend_totals_are_exact_integers(store: Store) -> None:
    # Beyond float precision: a float sum would be off by one somewhere.
    costs = [2**53 + 1, 2**53 + 3, 7, 10**15 + 1]
    with trio.fail_after(10):
        await store.insert_spend_logs(
            [spend_row(f"r{i}", cost_nanousd=c) for i, c in enumerate(costs)]
        )
        totals = await store.spend_totals()
    assert totals.cost_nanousd == sum(costs)
    assert isinstance(totals.cost_nanousd, int)


async def test_daily_spend_groups_by_utc_day(store: Store) -> None:
    with trio.fail_after(10):
        await insert_sample(store)
        by_key = await store.daily_spend(group_by="key")
        by_team = await store.daily_spend(group_by="team", start_ms=BASE_MS + DAY_MS)
        empty = await store.daily_spend(group_by="team", start_ms=BASE_MS + 10 * DAY_MS)
    assert [(d.day, d.group_id, d.requests, d.cost_nanousd) for d in by_key] == [
        ("2024-01-01", "k1", 2, 30),  # 23:59:59.999 is still the first day
        ("2024-01-02", "k2", 2, 120),
        ("2024-01-04", "k3", 1, 160),
    ]
    assert by_key[1].input_tokens == 12 and by_key[1].output_tokens == 2
    assert [(d.day, d.group_id, d.cost_nanousd) for d in by_team] == [
        ("2024-01-02", "t1", 40),
        ("2024-01-02", "t2", 80),
        ("2024-01-04", None, 160),
    ]
    assert empty == []
    with pytest.raises(ValueError, match="group_by"):
        await store.daily_spend(group_by="planet")  # type: ignore[arg-type]


async def test_top_spend_is_largest_first_and_limited(store: Store) -> None:
    with trio.fail_after(10):
        await insert_sample(store)
        await store.insert_spend_logs([
            spend_row("m1", upstream_model="gpt-a", cost_nanousd=2**53 + 1),
            spend_row("m2", upstream_model="gpt-a", cost_nanousd=2**53 + 3),
            spend_row("m3", upstream_model="", cost_nanousd=10**18),
        ])
        keys = await store.top_spend(column="key", limit=2, start_ms=BASE_MS)
        teams = await store.top_spend(column="team", start_ms=BASE_MS)
        models = await store.top_spend(column="model", skip_empty=True)
    assert [(r["key"], r["requests"], r["cost_nanousd"]) for r in keys] == [
        ("k3", 1, 160), ("k2", 2, 120)]
    assert [(r["team"], r["cost_nanousd"]) for r in teams] == [
        (None, 160), ("t2", 80), ("t1", 70)]
    # Beyond float precision, and without the rows that name no model.
    assert models == [{"model": "gpt-a", "requests": 2, "input_tokens": 0,
                       "output_tokens": 0, "cost_nanousd": 2**54 + 4}]


async def test_tag_spend_counts_a_request_under_each_of_its_tags(store: Store) -> None:
    with trio.fail_after(10):
        await insert_sample(store)
        every = await store.tag_spend()
        chosen = await store.tag_spend(tags=["prod", "nope"])
        later = await store.tag_spend(start_ms=BASE_MS + DAY_MS)
        by_team = await store.tag_spend(team_id="t1")
    assert [(r["tag"], r["requests"], r["cost_nanousd"]) for r in every] == [
        ("beta", 2, 180), ("production", 1, 80), ("prod", 2, 30)]
    assert [(r["tag"], r["cost_nanousd"]) for r in chosen] == [("prod", 30)]
    assert [(r["tag"], r["cost_nanousd"]) for r in later] == [
        ("beta", 160), ("production", 80)]
    assert [(r["tag"], r["cost_nanousd"]) for r in by_team] == [("prod", 30), ("beta", 20)]


# --------------------------------------------------------------------------- the loop


async def test_sql_never_blocks_the_event_loop(store: Store) -> None:
    """Every statement runs in a worker thread. Each statement here is slow (it sleeps), so
    one run on the loop's thread would also fail the suite's loop-blocking guard
    (tests/blocking.py); no timing is measured."""
    loop_thread = threading.get_ident()
    statement_threads: list[int] = []

    def slow_statement(*_args: object) -> None:
        statement_threads.append(threading.get_ident())
        time.sleep(0.01)  # the database is slow; only a worker thread may wait on it

    sa.event.listen(store.engine, "before_cursor_execute", slow_statement)
    try:
        with trio.fail_after(30):
            _, key = await store.create_key()
            await store.get_keys([key.token_hash])
            await store.update_key(key.token_hash, rpm_limit=1)
            await store.list_keys()
            await store.insert_spend_logs([spend_row("r1", tags=("t",))])
            await store.query_spend_logs(tag="t")
            await store.spend_totals()
            await store.daily_spend(group_by="key")
            await store.ping()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", slow_statement)
    assert len(statement_threads) >= 10
    assert loop_thread not in statement_threads
