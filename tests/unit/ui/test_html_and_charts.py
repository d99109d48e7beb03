"""The dashboard's markup: everything is escaped unless it is trusted markup."""

from __future__ import annotations

import pytest

from triogate.ui.charts import histogram, nice_max, stacked_bars, usd_axis
from triogate.ui.entities import KINDS, columns
from triogate.ui.html import Html, el, field, join, post_button, safe_url, table, url, usd

XSS = "<script>alert(1)</script>"


def test_text_and_attributes_are_escaped() -> None:
    out = el("td", XSS, title='"><img src=x onerror=alert(1)>')
    assert XSS not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "<img" not in out and "&quot;&gt;&lt;img" in out


def test_trusted_markup_is_not_escaped_twice() -> None:
    inner = el("b", "a & b")
    assert el("td", inner) == "<td><b>a &amp; b</b></td>"
    assert join(["<i>", inner]) == "&lt;i&gt;<b>a &amp; b</b>"


def test_a_plain_str_subclass_is_still_text() -> None:
    class Sneaky(str):
        pass

    assert el("p", Sneaky("<b>")) == "<p>&lt;b&gt;</p>"


@pytest.mark.parametrize("href", ["javascript:alert(1)", "//evil.example/x",
                                  "https://evil.example", " javascript:alert(1)",
                                  "data:text/html,<script>"])
def test_urls_from_data_cannot_leave_the_site(href: str) -> None:
    assert safe_url(href) == "#"
    assert 'href="#"' in el("a", "x", href=href)


def test_same_site_urls_are_kept_and_query_values_encoded() -> None:
    assert safe_url("/ui/keys?q=1") == "/ui/keys?q=1"
    link = url("/ui/keys/view", id="a&b=<c>", empty="")
    assert link == "/ui/keys/view?id=a%26b%3D%3Cc%3E"
    assert 'href="/ui/keys/view?id=a%26b%3D%3Cc%3E"' in el("a", "k", href=link)


def test_boolean_and_missing_attributes() -> None:
    assert el("input", name="x", required=True, disabled=False, value=None) == (
        '<input name="x" required>')


def test_every_field_has_a_label_bound_to_it() -> None:
    out = field("max_budget", "Budget (USD)", hint="per period")
    assert '<label for="f-max_budget">Budget (USD)</label>' in out
    assert 'id="f-max_budget"' in out and 'aria-describedby="f-max_budget-hint"' in out


def test_one_button_forms_carry_the_csrf_token_and_a_confirmation() -> None:
    out = post_button("/ui/keys/delete", "Delete", "tok<en>", fields={"id": XSS},
                      danger=True, confirm="Sure?")
    assert 'name="csrf" value="tok&lt;en&gt;"' in out
    assert 'method="post"' in out and 'data-confirm="Sure?"' in out
    assert XSS not in out


def test_a_key_list_renders_a_script_alias_as_text() -> None:
    headers, cells = columns(KINDS["keys"], now_ms=0)
    row = {"token": "ab" * 32, "key_alias": XSS, "key_hint": "sk-...abcd", "team_id": XSS,
           "blocked": False}
    out = table(headers, [cells(row)])
    assert XSS not in out
    assert out.count("&lt;script&gt;alert(1)&lt;/script&gt;") == 2
    assert f'href="/ui/keys/view?id={"ab" * 32}"' in out


def test_chart_labels_and_legends_are_escaped() -> None:
    out = stacked_bars(["2026-12-01", "2026-12-02"], {XSS: [0.5, 1.5], "b": [0.1, 0]},
                       label=XSS)
    assert XSS not in out
    assert "&lt;script&gt;" in out
    assert out.count("<rect") >= 3  # two bars of one series, one of the other (+ swatches)
    hist = histogram([(XSS, 3)], label="waits")
    assert XSS not in hist


def test_an_empty_chart_says_so() -> None:
    assert "No data" in stacked_bars([], {}, label="x")
    assert "No requests" in histogram([("1", 0)], label="x")


def test_axis_maxima_are_round_and_cover_the_data() -> None:
    for value, top in ((0.7, 1), (3, 5), (7, 10), (12, 20), (0.00013, 0.0002), (240, 250)):
        assert nice_max(value) == pytest.approx(top)
    assert usd_axis(0.0001)(0.000025) == "$0.000025"
    assert usd_axis(0.00005)(0.0000125) == "$0.0000125"
    assert usd_axis(40)(10) == "$10.00"


def test_money_is_shown_exactly_enough() -> None:
    assert usd(None) == "—"
    assert usd(5_000_000_000) == "$5.0000"
    assert usd(22_000) == "$0.000022"
    assert usd(2_200) == "$0.0000022" and usd(1) == "$0.000000001"  # never rounded to zero
    assert usd(0) == "$0" and usd(-2_200) == "-$0.0000022"
    assert usd(12_345_678) == "$0.0123"
    assert isinstance(el("p", usd(1)), Html)


def test_the_axis_makes_room_for_its_longest_label() -> None:
    # "$0.000025" in a half-width chart was cut at the left edge.
    from triogate.ui.charts import _left, usd_axis
    for top in (0.0001, 0.001, 1.0, 2500.0):
        fmt = usd_axis(top)
        longest = max(len(fmt(top * i / 4)) for i in range(5))
        for width, font in ((720, 13), (1120, 11)):
            assert _left(top, fmt, width) >= longest * font * 0.6 + 6


def test_each_chart_carries_its_numbers_as_a_table() -> None:
    out = stacked_bars(["2026-11-30", "2026-12-01", "2026-12-02"],
                       {"alpha": [0.5, 0.0, 1.25], "<b>": [0.1, 0.0, 0.0]}, label="By key")
    table_part = out.split("<details", 1)[1]
    assert "<summary>The numbers</summary>" in table_part
    assert "2026-11-30" in table_part and "2026-12-02" in table_part
    assert "2026-12-01" not in table_part  # a day without spend is left out
    assert "$0.600000" in table_part and "$1.25" in table_part  # the day's total
    assert "&lt;b&gt;" in table_part and "<b>" not in table_part
    hist = histogram([("1", 7), ("2", 0), ("3", 2)], label="waits")
    assert "<tr><td>1</td><td>7</td></tr>" in hist and "<tr><td>2</td>" not in hist
