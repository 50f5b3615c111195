"""Real headless Chromium against the live service with the UI mounted at `/` (see conftest)."""

from __future__ import annotations

import time
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.timeout(180)
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def _plot_points(page, elem_id: str) -> int:
    """Number of x values in the first trace of the Plotly figure inside #elem_id (0 if none)."""
    return page.evaluate(
        """(id) => { const gd = document.querySelector(`#${id} .js-plotly-plot`);
                     return gd && gd.data && gd.data.length ? (gd.data[0].x || []).length : 0; }""",
        elem_id,
    )


def test_page_loads_without_leaving_loopback(ui):
    ui.open()
    ui.page.wait_for_selector("#sd2-server .sd2-ok")  # /health answered through the UI's client
    ui.page.wait_for_timeout(1000)  # late requests (fonts, analytics) would show up here
    for name in ("Compare", "Train", "History", "Theory"):
        ui.tab(name)
        ui.page.wait_for_timeout(300)
    external = [
        u
        for u in ui.urls
        if urlparse(u).scheme in ("http", "https", "ws", "wss") and urlparse(u).hostname not in LOOPBACK
    ]
    assert ui.urls, "no requests were recorded at all"
    assert external == []


def test_generate_streams_coloured_tokens_and_a_growing_plot(ui):
    from sd2.config import DecodeConfig

    ui.open()
    # page load set the controls from GET /defaults: DecodeConfig's own values, no copy in the UI
    ui.page.wait_for_function(
        "(n) => document.querySelector('#gen-max-new input[type=number]')?.value === n",
        arg=str(DecodeConfig().max_new_tokens),
    )
    assert ui.page.input_value("#gen-k input") == DecodeConfig().k
    ui.page.fill("#gen-prompt textarea", "Tell me a short story about a cat.")
    # Record the plot's bar count every 30 ms in the page itself, so no repaint is missed.
    ui.page.evaluate(
        """() => {
            window.sd2Seen = [];
            setInterval(() => {
                const gd = document.querySelector('#gen-acc .js-plotly-plot');
                window.sd2Seen.push(gd && gd.data ? (gd.data[0].x || []).length : 0);
            }, 30);
        }"""
    )
    ui.page.click("#gen-run")
    ui.page.wait_for_selector("#gen-status .sd2-ok", timeout=90_000)
    final = _plot_points(ui.page, "gen-acc")
    seen = ui.page.evaluate("window.sd2Seen")
    partial = sorted({n for n in seen if 0 < n < final})
    assert len(partial) >= 2, f"the plot did not grow while decoding: {sorted(set(seen))}"
    assert ui.page.locator("#gen-trace .sd2-tok").count() > 0
    assert ui.page.locator("#gen-trace .sd2-block").count() == final + 1  # + the prefill block
    colour = ui.page.eval_on_selector("#gen-trace .sd2-tok", "el => getComputedStyle(el).color")
    assert colour in {"rgb(21, 128, 61)", "rgb(220, 38, 38)", "rgb(37, 99, 235)", "rgb(139, 147, 158)"}
    status = ui.page.inner_text("#gen-status")
    assert "run #" in status and "k = auto" in status  # the default, with the precision that ran
    assert "cpu/" in status
    ui.screenshot("generate")


def test_compare_shows_three_columns_and_says_text_is_identical_at_t0(ui):
    from sd2.config import DecodeConfig

    ui.open()
    ui.tab("Compare")
    # Compare's controls too start at the API's defaults (they once read their sliders' minimum: 1 token)
    ui.page.wait_for_function(
        "(n) => document.querySelector('#cmp-max-new input[type=number]')?.value === n",
        arg=str(DecodeConfig().max_new_tokens),
    )
    # Record each column's state and token count every 30 ms in the page itself, so no repaint is missed.
    ui.page.evaluate(
        """() => {
            window.sd2Columns = [];
            setInterval(() => {
                const cols = [...document.querySelectorAll('#cmp-columns .sd2-col')];
                const tokens = c => c.querySelectorAll('.sd2-tok').length;
                window.sd2Columns.push(cols.map(c => [c.dataset.state, tokens(c)]));
            }, 30);
        }"""
    )
    ui.page.fill("#cmp-prompt textarea", "Tell me a short story about a cat.")
    ui.page.click("#cmp-run")
    ui.page.wait_for_selector("#cmp-note .sd2-info >> text=identical", timeout=90_000)
    seen = ui.page.evaluate("window.sd2Columns")
    # The columns fill live, one method after another: the first shows tokens while the last waits.
    assert any(len(cols) == 3 and cols[0][1] > 0 and cols[-1] == ["waiting", 0] for cols in seen), (
        f"no snapshot had the first column filled before the last method started: {seen[-5:]}"
    )
    assert any(len(cols) == 3 and cols[1][0] == "decoding" and cols[1][1] > 0 for cols in seen)
    methods = ui.page.eval_on_selector_all("#cmp-columns .sd2-col", "els => els.map(e => e.dataset.method)")
    assert methods == ["pretrained", "distilled", "sd2"]  # one per recipe, by default
    assert "identical" in ui.page.inner_text("#cmp-note")
    assert ui.page.locator("#cmp-columns .sd2-col").nth(2).locator(".sd2-tok").count() > 0
    assert _plot_points(ui.page, "cmp-bars") == 3
    # the SD² column is steered: its counterfactual is on by default, and the column says its gain
    assert ui.page.is_checked("#cmp-counterfactual input")
    # the note and the final columns come in one update, which a loaded machine may render a frame apart
    ui.page.locator("#cmp-columns .sd2-col").nth(2).locator(".sd2-col-gain").wait_for(timeout=30_000)
    gains = ui.page.eval_on_selector_all(
        "#cmp-columns .sd2-col", "els => els.map(e => e.querySelector('.sd2-col-gain')?.innerText || '')"
    )
    assert gains[:2] == ["", ""] and gains[2].startswith("steering gain ") and "tokens/block" in gains[2]
    ui.screenshot("compare")


def test_stop_ends_a_comparison_mid_way_and_the_server_cancels_it(ui, live_ui):
    import httpx

    def cancelled() -> int:
        return httpx.get(f"{live_ui}/runs", params={"status": "cancelled"}, timeout=10).json()["total"]

    before = cancelled()
    ui.open()
    ui.tab("Compare")
    ui.page.fill("#cmp-prompt textarea", "Tell me a short story about a cat.")
    ui.page.locator("#cmp-max-new").get_by_role("spinbutton").fill("200")
    ui.page.click("#cmp-run")
    ui.page.wait_for_selector("#cmp-columns .sd2-col[data-state=decoding] .sd2-tok", timeout=60_000)
    ui.page.click("#cmp-stop")
    deadline = time.time() + 30
    while cancelled() == before and time.time() < deadline:
        time.sleep(0.1)
    assert cancelled() == before + 1  # the method decoding when Stop was pressed; the rest never ran
    states = ui.page.eval_on_selector_all("#cmp-columns .sd2-col", "els => els.map(e => e.dataset.state)")
    assert states[-1] == "waiting"


def test_training_job_runs_shows_its_curve_and_its_drafter_becomes_selectable(ui):
    ui.open()
    ui.tab("Train")
    ui.page.locator("#train-name").get_by_role("textbox").fill("ui-trained")
    ui.page.locator("#train-steps").get_by_role("spinbutton").fill("30")
    ui.page.click("#train-run")
    ui.page.wait_for_selector("#train-progress [data-status=succeeded]", timeout=120_000)
    assert _plot_points(ui.page, "train-curve") == 30  # one loss point per step
    status = ui.page.wait_for_selector("#train-status .sd2-ok")  # after the drafter list refreshed
    assert "now selectable" in status.inner_text()
    ui.screenshot("train")
    ui.tab("Generate")
    ui.page.click("#gen-method input")
    assert ui.page.get_by_role("option", name="ui-trained").count() == 1


def test_invalid_inputs_show_the_api_message(ui):
    ui.open()
    ui.page.fill("#gen-prompt textarea", "")
    ui.page.click("#gen-run")
    error = ui.page.wait_for_selector("#gen-status .sd2-error")
    assert "prompt: String should have at least 1 character" in error.inner_text()
    ui.tab("Train")
    ui.page.locator("#train-name").get_by_role("textbox").fill("sd2")  # taken: a loaded drafter
    ui.page.click("#train-run")
    error = ui.page.wait_for_selector("#train-status .sd2-error")
    assert "name: a drafter or job named 'sd2' already exists" in error.inner_text()


def test_history_reopens_a_run_and_theory_plots_measured_runs(ui, live_ui):
    import httpx

    for method in ("verifier", "sd2"):
        body = {"prompt": "Why is the sky blue?", "method": method, "max_new_tokens": 48}
        httpx.post(f"{live_ui}/generate", json=body, timeout=60).raise_for_status()
    ui.open()
    ui.tab("History")
    cell = ui.page.locator("#hist-table [role=gridcell]").filter(has_text="sd2").first
    cell.click()
    ui.page.wait_for_selector("#hist-trace .sd2-tok")
    assert "run #" in ui.page.inner_text("#hist-info")
    ui.screenshot("history")
    ui.tab("Theory")
    ui.page.wait_for_function(
        "document.querySelector('#theory-tau .js-plotly-plot')?.data.some(t => t.mode === 'markers')"
    )
    assert "measured runs (filled markers)" in ui.page.inner_text("#theory-readout")
    ui.page.wait_for_timeout(500)  # let the pending fade of the plots finish before the screenshot
    ui.screenshot("theory")


def test_large_font_toggle(ui):
    ui.open()
    ui.page.click("#sd2-large input")
    ui.page.wait_for_function("document.body.classList.contains('sd2-large')")
    ui.page.wait_for_selector("#gen-acc .js-plotly-plot")
    ui.screenshot("generate-large")


def test_a_stored_bench_result_shows_in_history_and_on_the_theory_curves(
    ui, live_ui, tiny_pair_dir, tmp_path
):
    from sd2.cli import main

    verifier_dir, _ = tiny_pair_dir
    args = ["bench", "--verifier", str(verifier_dir), "--quick", "--methods", "verifier", "self"]
    args += ["--prompt-sets", "demo", "--k", "2", "--max-prompts", "1", "--max-new-tokens", "6"]
    assert main([*args, "--out", str(tmp_path), "--store", live_ui, "--label", "browser-bench"]) == 0
    ui.open()
    ui.tab("History")
    ui.page.click("#hist-refresh")
    row = ui.page.locator("#hist-benchmarks [role=gridcell]").filter(has_text="browser-bench").first
    row.wait_for()
    ui.tab("Theory")
    ui.page.wait_for_function(
        "document.querySelector('#theory-tau .js-plotly-plot')?.data.some(t => t.name === 'bench: self')"
    )
    symbol = ui.page.evaluate(
        "document.querySelector('#theory-tau .js-plotly-plot').data.find(t => t.name === 'bench: self')"
        ".marker.symbol"
    )
    assert symbol.endswith("-open")
    assert "stored benchmark cells (open markers)" in ui.page.inner_text("#theory-readout")


def test_the_api_docs_render_offline(ui, live_ui):
    """Swagger UI at /docs, served from packaged assets rather than a CDN, draws the API's operations
    with every request kept on loopback."""
    ui.page.goto(f"{live_ui}/docs", wait_until="domcontentloaded")
    ui.page.wait_for_selector(".swagger-ui .opblock-summary-path", timeout=30_000)
    assert ui.page.locator(".swagger-ui .opblock").count() >= 20
    external = [
        u for u in ui.urls if urlparse(u).scheme in ("http", "https") and urlparse(u).hostname not in LOOPBACK
    ]
    assert external == []


def test_counterfactual_rows_marks_and_the_rejection_explainer(ui):
    """A steered run with its counterfactual on (the default for the SD² drafter): every block shows the
    unsteered draft under it with a won / tied / lost mark, and clicking a rejected token opens the
    explainer with the verifier's and the drafter's top-5 side by side."""
    ui.open()
    ui.page.wait_for_function("document.querySelector('#gen-counterfactual input')?.checked === true")
    ui.page.fill("#gen-prompt textarea", "Tell me a short story about a cat.")
    ui.page.locator("#gen-max-new").get_by_role("spinbutton").fill("48")
    ui.page.click("#gen-run")
    ui.page.wait_for_selector("#gen-status .sd2-ok", timeout=90_000)
    rows = ui.page.locator("#gen-trace .sd2-has-cf .sd2-cf-row")
    assert rows.count() > 0 and rows.count() == ui.page.locator("#gen-trace .sd2-mark").count()
    assert rows.first.locator(".sd2-cf").count() > 0
    outcomes = ui.page.eval_on_selector_all("#gen-trace .sd2-mark", "els => els.map(e => e.dataset.outcome)")
    assert {"won", "lost"} & set(outcomes), f"no block won or lost: {outcomes}"
    # the row sits under its block's tokens, not beside them
    below = ui.page.eval_on_selector(
        "#gen-trace .sd2-has-cf",
        "b => b.querySelector('.sd2-cf-row').getBoundingClientRect().top >= "
        "b.querySelector('.sd2-row').getBoundingClientRect().bottom - 1",
    )
    assert below
    assert ui.page.locator("#gen-cards [data-metric=steering_gain]").inner_text().count("tokens/block") == 1
    assert _plot_points(ui.page, "gen-gain") == rows.count()
    panel = ui.page.locator("#gen-trace .sd2-why-panel")
    assert panel.is_hidden()
    rejected = ui.page.locator("#gen-trace .sd2-tok.sd2-rejected[data-why]").first
    rejected.click()
    panel.wait_for(state="visible")
    captions = panel.locator("caption").all_inner_texts()
    assert captions == ["verifier p top-5", "drafter q top-5"]
    assert panel.locator(".sd2-why-list").nth(0).locator("tr").count() == 5
    assert panel.locator(".sd2-why-list").nth(1).locator("tr").count() == 5
    assert "Rejected: argmax differs" in panel.inner_text()  # T = 0, the API's default
    assert rejected.evaluate("el => el.classList.contains('sd2-picked')")
    ui.page.click("#sd2-large input")  # projector mode scales the panel with everything else
    ui.page.wait_for_function("document.body.classList.contains('sd2-large')")
    ui.screenshot("counterfactual-explainer")
    panel.locator(".sd2-why-close").click()
    panel.wait_for(state="hidden")
    ui.page.locator("#gen-trace .sd2-cf[data-why]").first.click()
    panel.wait_for(state="visible")
    assert "unsteered counterfactual" in panel.inner_text() and "Would have been" in panel.inner_text()
