"""The rejection explainer on real engine output (tests/app/data): which tokens open it, and what each
panel says — q against p, the rule of the run's temperature, the rank under p, the top-5 lists."""

from __future__ import annotations

import pytest

from app.explainer import explain_counterfactual, explain_event
from app.tokens import fmt_prob, shown_text
from app.trace_html import trace_html
from tests.app.html_tree import Node, parse


def _events(block: dict) -> list[dict]:
    return [*block["drafts"], *([block["extra"]] if block.get("extra") else [])]


def _find(run: dict, status: str) -> tuple[dict, int]:
    """The first speculative block with a token of `status`, and that token's position."""
    for block in run["blocks"]:
        for position, token in enumerate(_events(block)):
            if block["kind"] == "speculative" and token["status"] == status:
                return block, position
    raise AssertionError(f"the fixture has no {status} token")


def _lists(panel: Node) -> dict[str, list[list[str]]]:
    """Each top-5 table of a panel: caption → rows of [rank, “text”, bar, probability]."""
    return {
        t.find(tag="caption").text: [[td.text for td in tr.find_all(tag="td")] for tr in t.find_all(tag="tr")]
        for t in panel.find_all("sd2-why-list")
    }


def _expected_rows(candidates: list[dict]) -> list[list[str]]:
    return [
        [str(i), f"“{shown_text(c['text'])}”", "", fmt_prob(c["prob"])] for i, c in enumerate(candidates, 1)
    ]


def test_judged_and_counterfactual_tokens_carry_their_explanation_right_after_them(real_runs):
    for temperature, run in real_runs.items():
        tree = parse(trace_html(run["blocks"], temperature=temperature))
        (wrapper,) = tree.find_all("sd2-explain")
        assert "panel.replaceChildren" in wrapper.attrs["onclick"]
        assert "hidden" in wrapper.find("sd2-why-panel").attrs  # closed until a click
        tokens = [n for n in wrapper.walk() if {"sd2-tok", "sd2-cf"} & set(n.classes)]
        events = [t for b in run["blocks"] for t in _events(b)]
        events += [t for b in run["blocks"] if b.get("counterfactual") for t in b["counterfactual"]["drafts"]]
        assert len(tokens) == len(events)
        clickable = [t for t in tokens if "data-why" in t.attrs]
        assert len(clickable) == sum(bool(e["target_top"]) for e in events) > 0
        for token in tokens:
            after = tree.parent_of(token).following(token)
            has_template = after is not None and after.tag == "template"
            assert has_template == ("data-why" in token.attrs)
        # discarded drafts of the run were never judged: nothing to explain
        assert not any("sd2-discarded" in t.classes for t in clickable)


def test_a_rejected_draft_at_t0_says_argmax_differs_with_both_top5_lists(real_runs):
    block, position = _find(real_runs[0.0], "rejected")
    token = block["drafts"][position]
    panel = parse(explain_event(block, position, greedy=True))
    verdict = panel.find("sd2-why-verdict").text
    top = token["target_top"][0]
    assert "argmax differs" in verdict and f"“{shown_text(top['text'])}”" in verdict
    assert f"its #{token['target_rank']}" in verdict and token["target_rank"] > 1
    bars = {tr.find(tag="th").text: tr.find_all(tag="td")[-1].text for tr in panel.find_all(tag="tr")[:2]}
    assert bars == {
        "q(x) drafter": fmt_prob(token["draft_prob"]),
        "p(x) verifier": fmt_prob(token["target_prob"]),
    }
    lists = _lists(panel)
    assert lists == {
        "verifier p top-5": _expected_rows(token["target_top"]),
        "drafter q top-5": _expected_rows(token["draft_top"]),
    }
    outlined = {tr.find_all(tag="td")[1].text for tr in panel.find_all("sd2-why-self", tag="tr")}
    assert outlined == {f"“{shown_text(token['text'])}”"}  # its rows, and no other token's


def test_at_t_above_0_a_rejection_shows_its_acceptance_probability(real_runs):
    block, position = _find(real_runs[1.0], "rejected")
    token = block["drafts"][position]
    verdict = parse(explain_event(block, position, greedy=False)).find("sd2-why-verdict").text
    p, q = token["target_prob"], token["draft_prob"]
    assert f"min(1, p/q) = min(1, {fmt_prob(p)} / {fmt_prob(q)}) = {min(1, p / q):.3f}" in verdict
    assert "argmax" not in verdict


def test_a_resampled_token_shows_the_residual_it_was_drawn_from(real_runs):
    for temperature, run in real_runs.items():
        block, position = _find(run, "resampled")
        token, rejected = block["extra"], next(d for d in block["drafts"] if d["status"] == "rejected")
        panel = parse(explain_event(block, position, greedy=temperature == 0))
        assert "Resampled" in panel.find("sd2-why-verdict").text
        lists = _lists(panel)
        residual = lists["residual norm(max(0, p − q)) top-5"]
        assert residual == _expected_rows(token["residual_top"]) and residual
        assert lists["drafter q top-5 (at the rejected draft)"] == _expected_rows(rejected["draft_top"])
        crossed = [tr for tr in panel.find_all(tag="tr") if "sd2-why-crossed" in tr.classes]
        assert all(tr.find_all(tag="td")[1].text == f"“{shown_text(rejected['text'])}”" for tr in crossed)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_counterfactual_token_says_what_it_would_have_got(real_runs, temperature):
    run = real_runs[temperature]
    said = []
    for block in (b for b in run["blocks"] if b.get("counterfactual")):
        record = block["counterfactual"]
        for position, token in enumerate(record["drafts"]):
            panel = parse(explain_counterfactual(block, position, greedy=temperature == 0))
            verdict = panel.find("sd2-why-verdict").text
            if temperature == 0:
                assert verdict.startswith(f"Would have been {token['status']}")
            else:
                assert f"survived with probability {token['survival']:.3f}" in verdict
            notes = " ".join(n.text for n in panel.find_all("sd2-why-note"))
            assert f"→ steering {record['outcome']}" in notes
            assert set(_lists(panel)) == {"verifier p top-5", "unsteered drafter q top-5"}
            said.append(verdict.split(":")[0])
    assert len(set(said)) >= (2 if temperature == 0 else 1)


def test_the_explainer_escapes_token_texts():
    evil = {"token_id": 1, "prob": 0.5, "text": "<img src=x onerror=alert(1)>"}
    token = {"token_id": 1, "status": "rejected", "draft_prob": 0.5, "target_prob": 0.1, "text": evil["text"],
             "target_rank": 2, "target_top": [evil], "draft_top": [evil]}  # fmt: skip
    block = {"index": 1, "kind": "speculative", "drafts": [token], "extra": None}
    html = explain_event(block, 0, greedy=True)
    assert "<img" not in html and "&lt;img" in html
    assert "<img" not in trace_html([block], temperature=0).replace("&lt;img", "")
