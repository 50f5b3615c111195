"""The trace renderer: statuses → exact colours, escaping, block boundaries, tooltips."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from app.trace_html import COLOURS, columns_html, token_span, trace_html


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
