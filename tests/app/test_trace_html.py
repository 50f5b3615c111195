"""The trace renderer: statuses → exact colours, escaping, block boundaries, tooltips, and the
unsteered counterfactual rows with their won / tied / lost marks (on real engine output)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from app.tokens import fmt_prob, visible_text
from app.trace_html import COLOURS, columns_html, token_span, trace_html
from tests.app.html_tree import parse


def _tok(text: str, status: str, q: float | None = 0.5, p: float | None = 0.25, token_id: int = 7) -> dict:
    return {"token_id": token_id, "status": status, "draft_prob": q, "target_prob": p, "text": text}


def _block(index: int, drafts: list[dict], extra: dict | None, kind: str = "speculative") -> dict:
    accepted = sum(t["status"] == "accepted" for t in drafts)
    return {"index": index, "kind": kind, "drafts": drafts, "extra": extra, "k": len(drafts),
            "n_accepted": accepted, "complete": True}  # fmt: skip


BLOCKS = [
    _block(0, [], _tok("The", "bonus", q=None), kind="prefill"),
    _block(
        1,
        [_tok(" sky", "accepted"), _tok(" is", "rejected"), _tok(" red", "discarded")],
        _tok(" was", "resampled"),
    ),
    _block(2, [_tok(" blue", "accepted"), _tok(".", "accepted")], _tok("\n", "bonus", q=None)),
]


class _Spans(HTMLParser):
    """Collects (class, style, title, text) of every token span."""

    def __init__(self):
        super().__init__()
        self.tokens: list[dict] = []
        self.blocks: list[str] = []
        self._current: dict | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if "sd2-tok" in classes and self._current is None:
            self._current = {**attrs, "text": ""}
        if "sd2-block" in classes:
            self.blocks.append(attrs["data-block"])

    def handle_data(self, data):
        if self._current is not None:
            self._current["text"] += data

    def handle_endtag(self, tag):
        if self._current is not None and tag == "span":
            self.tokens.append(self._current)
            self._current = None


def _parse(html: str) -> _Spans:
    parser = _Spans()
    parser.feed(html)
    return parser


def test_each_status_gets_its_exact_colour_and_rejected_is_struck_through():
    parsed = _parse(trace_html(BLOCKS))
    trace_tokens = [t for t in parsed.tokens if "title" in t]
    assert [t["class"].split()[1] for t in trace_tokens] == [
        "sd2-bonus", "sd2-accepted", "sd2-rejected", "sd2-discarded", "sd2-resampled",
        "sd2-accepted", "sd2-accepted", "sd2-bonus",
    ]  # fmt: skip
    for token in trace_tokens:
        status = token["class"].split()[1].removeprefix("sd2-")
        assert f"color:{COLOURS[status]};" in token["style"]
        assert ("line-through" in token["style"]) == (status == "rejected")
    assert COLOURS["accepted"] == "#15803d" and COLOURS["rejected"] == "#dc2626"
    assert COLOURS["resampled"] == COLOURS["bonus"] == "#2563eb"


def test_token_text_is_escaped():
    html = trace_html([_block(1, [_tok("<script>alert(1)</script>", "accepted")], _tok('"&', "bonus"))])
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert _parse(html).tokens[-1]["text"] == '"&'  # the parser un-escapes: the text round-trips


def test_tooltip_names_p_q_status_block_and_position():
    title = _parse(token_span(_tok(" is", "rejected", q=0.8, p=0.125), block=3, position=1)).tokens[0][
        "title"
    ]
    assert "rejected · block 3 · position 1" in title
    assert "p (verifier) = 0.125" in title and "q (drafter) = 0.800" in title
    no_q = _parse(token_span(_tok("x", "bonus", q=None), block=0, position=0)).tokens[0]["title"]
    assert "q (drafter) = —" in no_q


def test_every_block_is_its_own_bordered_span_in_order():
    html = trace_html(BLOCKS)
    assert _parse(html).blocks == ["0", "1", "2"]
    assert len(re.findall(r'class="sd2-block"[^>]*border-left', html)) == 3
    assert 'data-blocks="3"' in html


def test_whitespace_and_control_characters_stay_visible():
    tokens = _parse(
        trace_html([_block(1, [_tok("a\nb", "accepted"), _tok("\t", "accepted")], _tok("\x01", "bonus"))])
    )
    texts = [t["text"] for t in tokens.tokens if "title" in t]
    assert texts == ["a↵\nb", "→\t", "␁"]
    assert _parse(trace_html([_block(1, [], _tok("", "bonus"))])).tokens[-1]["text"] == "∅"


def test_empty_trace_shows_the_placeholder():
    assert "Waiting" in trace_html([], "Waiting for the model…")
    assert "sd2-tok" not in trace_html([])


def test_columns_one_per_result_with_escaped_method_names():
    results = [{"method": name, "metrics": {"tau": 2.0}, "blocks": BLOCKS} for name in ("a", "b", "<c>")]
    html = columns_html(results)
    assert html.count('class="sd2-col"') == 3 and 'data-columns="3"' in html
    assert "&lt;c&gt;" in html and "<c>" not in html


def test_a_streaming_comparison_says_which_columns_wait_decode_or_failed():
    columns = [
        {"method": "a", "metrics": {"tau": 2.0}, "blocks": BLOCKS, "state": "done"},
        {"method": "b", "blocks": BLOCKS[:1], "state": "decoding"},
        {"method": "c", "blocks": [], "state": "waiting"},
        {"method": "d", "blocks": [], "state": "failed", "error": "RuntimeError: <boom>"},
    ]
    html = columns_html(columns)
    states = [part.split('"')[0] for part in html.split('data-state="')[1:]]
    assert states == ["done", "decoding", "waiting", "failed"]
    assert "decoding…" in html and "waiting for its turn…" in html
    assert "failed: RuntimeError: &lt;boom&gt;" in html
    assert columns_html([{"method": "x", "blocks": BLOCKS}]).count("sd2-col-state") == 0  # a stored run


def _opacity(style: str) -> float:
    return float(re.findall(r"opacity:([0-9.]+);", style)[-1])


def test_each_counterfactual_is_a_second_row_under_its_block_with_its_outcome_mark(real_runs):
    run = real_runs[0.0]
    tree = parse(trace_html(run["blocks"], temperature=0))
    blocks = tree.find_all("sd2-block")
    paired = [b for b in run["blocks"] if b.get("counterfactual")]
    assert [n.attrs["data-block"] for n in blocks if "sd2-has-cf" in n.classes] == [
        str(b["index"]) for b in paired
    ]
    assert {b["counterfactual"]["outcome"] for b in paired} == {"won", "tied"}  # what the fixture holds
    for node, block in zip([n for n in blocks if "sd2-has-cf" in n.classes], paired, strict=True):
        record = block["counterfactual"]
        main, row = node.elements()
        assert "sd2-row" in main.classes and "sd2-cf-row" in row.classes  # the unsteered draft under it
        assert "font-size:.8em" in row.attrs["style"]
        mark = row.find("sd2-mark")
        assert mark.attrs["data-outcome"] == node.attrs["data-outcome"] == record["outcome"]
        assert mark.text == {"won": "▲", "tied": "=", "lost": "▼"}[record["outcome"]]
        assert f"steered {record['steered_expected_accepted']:.2f} vs unsteered" in mark.attrs["title"]
        cf_tokens = row.find_all("sd2-cf")
        assert [t.text for t in cf_tokens] == [visible_text(d["text"]) for d in record["drafts"]]
        for span, draft in zip(cf_tokens, record["drafts"], strict=True):  # T = 0: by what it would get
            assert f"sd2-cf-{draft['status']}" in span.classes
            assert f"color:{COLOURS[draft['status']]};" in span.attrs["style"]
            assert _opacity(span.attrs["style"]) == 0.7  # fainter than the run's own tokens
            assert f"would be {draft['status']} (T = 0)" in span.attrs["title"]
    assert "sd2-cf" not in trace_html(BLOCKS) and "fainter row" not in trace_html(BLOCKS)
    assert "fainter row under a block" in tree.find("sd2-legend").text


def test_at_t_above_0_a_counterfactual_token_is_green_as_opaque_as_its_survival(real_runs):
    tree = parse(trace_html(real_runs[1.0]["blocks"], temperature=1))
    drafts = [
        d for b in real_runs[1.0]["blocks"] if b.get("counterfactual") for d in b["counterfactual"]["drafts"]
    ]
    spans = tree.find_all("sd2-cf")
    assert len(spans) == len(drafts) and {d["status"] for d in drafts} == {None}
    opacities = []
    for span, draft in zip(spans, drafts, strict=True):
        assert f"color:{COLOURS['accepted']};" in span.attrs["style"] and "sd2-cf-sampled" in span.classes
        opacities.append(_opacity(span.attrs["style"]))
        assert opacities[-1] == pytest.approx(0.25 + 0.75 * draft["survival"], abs=0.006)
        title = span.attrs["title"]
        assert f"survival = {draft['survival']:.3f}" in title
        assert f"p (verifier) = {fmt_prob(draft['target_prob'])}" in title
        assert f"q (unsteered) = {fmt_prob(draft['draft_prob'])}" in title
    assert max(opacities) > 0.9 and min(opacities) < 0.3  # a sure draft and a hopeless one both occur
    marks = [m.attrs["data-outcome"] for m in tree.find_all("sd2-mark")]
    assert marks == [
        b["counterfactual"]["outcome"] for b in real_runs[1.0]["blocks"] if b.get("counterfactual")
    ]
    assert {"won", "lost"} <= set(marks)


def test_a_compare_column_shows_its_steering_gain_and_its_counterfactual_rows(real_runs):
    run = {**real_runs[1.0], "state": "done"}
    plain = {"method": "pretrained", "metrics": {"tau": 1.2}, "blocks": BLOCKS, "state": "done"}
    tree = parse(columns_html([plain, run]))
    columns = tree.find_all("sd2-col")
    assert columns[0].find_all("sd2-col-gain") == []  # no counterfactual, no gain
    gain = real_runs[1.0]["metrics"]["steering_gain"]
    said = columns[1].find("sd2-col-gain").text
    assert said.startswith(f"steering gain {gain['gain']:+.2f} tokens/block [{gain['low']:+.2f}, ")
    assert f"▲{gain['won']} ={gain['tied']} ▼{gain['lost']}" in said
    assert len(columns[1].find_all("sd2-cf-row")) == gain["n_blocks"]
    assert len(tree.find_all("sd2-explain")) == 1  # one panel for all columns
    live = parse(columns_html([plain, run], explain=False))
    assert live.find_all(tag="template") == [] and live.find_all("sd2-cf-row")  # rows, no explanations
