"""`build_ui(client)` → the Gradio Blocks of the sd2 lab: Generate, Compare, Train, History, Theory.

The UI only talks to the REST API through `client` (docs/architecture.md#import-rules); behaviour lives in
`app.handlers`, rendering in `app.trace_html`, `app.cards`, `app.plots` and `app.theory_plots`.
"""

from __future__ import annotations

import gradio as gr

from app import plots, theory_plots
from app.cards import cards_html
from app.client import ApiClient
from app.handlers import Handlers
from app.theme import LARGE_FONT_JS
from app.trace_html import columns_html, trace_html
from app.views import AUTO_K, BENCH_COLUMNS, DECODE_CONTROLS, DEMO_PROMPT, RUN_COLUMNS, UI_MAX_K

MAX_K = 64  # the API's bound (sd2.config.MAX_K); the slider stops lower, the API names the field past it


def build_ui(client: ApiClient, docs_url: str | None = None, interval_s: float = 0.25) -> gr.Blocks:
    """The whole app; `docs_url` links the REST docs (default: the API's own /docs)."""
    h = Handlers(client, interval_s)
    with gr.Blocks(title="sd2 — steered speculative decoding lab") as demo:
        _header(docs_url or f"{client.base_url}/docs")
        with gr.Row():
            server = gr.HTML(elem_id="sd2-server", scale=5)
            large = gr.Checkbox(
                label="Large fonts (projector)", elem_id="sd2-large", container=False, scale=1
            )
        large.change(None, large, None, js=LARGE_FONT_JS)
        with gr.Tabs():
            with gr.Tab("Generate", id="generate"):
                gen_method, gen_controls = _generate_tab(h)
            with gr.Tab("Compare", id="compare"):
                cmp_methods, cmp_controls = _compare_tab(h)
            with gr.Tab("Train", id="train"):
                base = _train_tab(h, gen_method, cmp_methods)
            with gr.Tab("History", id="history") as history_tab:
                hist_method, refresh = _history_tab(h)
            with gr.Tab("Theory", id="theory") as theory_tab:
                theory_inputs, theory_outputs = _theory_tab(h)
        demo.load(h.server_line, None, server)
        demo.load(h.decode_defaults, None, [*gen_controls, *cmp_controls])
        demo.load(h.choices, None, [gen_method, cmp_methods, base, hist_method])
        history_tab.select(**refresh)
        theory_tab.select(h.theory, theory_inputs, theory_outputs)
    return demo


def _header(docs_url: str) -> None:
    gr.HTML(
        '<div class="sd2-header"><h1>SD² lab · steered speculative decoding</h1>'
        "<p>A small drafter proposes k tokens, the verifier checks them in one pass; the output is "
        "exactly the verifier's (lossless). SD² steers the drafter with a vector computed from the "
        "verifier's hidden states. "
        f'Everything here goes through the <a href="{docs_url}" target="_blank">REST API</a>.</p></div>'
    )


def _decode_controls(with_method: bool) -> dict:
    """Prompt and decoding settings shared by Generate and Compare (same names as the API fields). The
    decode controls start empty: page load fills them with the API's defaults (GET /defaults)."""
    c = {"prompt": gr.Textbox(DEMO_PROMPT, label="Prompt", lines=3, elem_id=None)}
    if with_method:
        c["method"] = gr.Dropdown(
            elem_id="gen-method",
            choices=["verifier"],
            value="verifier",
            label="Method / drafter",
            info="SD² drafter selected by default; verifier = no drafter",
        )
    with gr.Row():
        c["k"] = gr.Dropdown(
            [AUTO_K, *(str(k) for k in range(1, UI_MAX_K + 1))],
            value=None,
            label="k (drafts per block)",
            info="auto: each block's k from this machine's measured costs and the acceptance so far",
        )
        c["threshold"] = gr.Slider(
            0,
            1,
            value=None,
            step=0.05,
            label="Draft threshold",
            info="stop drafting once the drafter's probability of its draft is ≤ this (0 = off)",
        )
    with gr.Row():
        c["temperature"] = gr.Slider(0, 2, value=None, step=0.05, label="Temperature", info="0 = greedy")
        c["top_p"] = gr.Slider(0.05, 1, value=None, step=0.05, label="Top-p", info="1 = off")
    with gr.Row():
        c["max_new"] = gr.Slider(1, 1024, value=None, step=1, label="Max new tokens")
    with gr.Row():
        c["seed"] = gr.Number(None, label="Seed", precision=0, minimum=0, info="empty = a fresh seed")
        c["steering"] = gr.Checkbox(True, label="Steering (SD² head on)")
        c["counterfactual"] = gr.Checkbox(
            False,
            label="Counterfactual",
            info="also draft each block unsteered, judged on the side: won / tied / lost per block "
            "(on for a steered drafter; the output stays the same)",
        )
    return c


def _generate_tab(h: Handlers) -> tuple[gr.Dropdown, list]:
    """The Generate tab; returns its method menu and its decode controls (views.DECODE_CONTROLS)."""
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            c = _decode_controls(with_method=True)
            c["prompt"].elem_id = "gen-prompt"
            c["k"].elem_id, c["max_new"].elem_id = "gen-k", "gen-max-new"
            c["counterfactual"].elem_id = "gen-counterfactual"
            with gr.Accordion("Conversation (chat history)", open=False):
                keep = gr.Checkbox(False, label="Continue the conversation (send the history as messages)")
                chat = gr.Chatbot([], label="History", height=220)
                clear = gr.Button("Clear history", size="sm")
            with gr.Row():
                go = gr.Button("Generate", variant="primary", elem_id="gen-run")
                stop = gr.Button("Stop", variant="stop", elem_id="gen-stop")
        with gr.Column(scale=3, min_width=420):
            status = gr.HTML(elem_id="gen-status")
            cards = gr.HTML(cards_html(None), elem_id="gen-cards")
            trace = gr.HTML(trace_html([]), elem_id="gen-trace", elem_classes=["sd2-trace-box"])
    with gr.Row():
        acc = gr.Plot(plots.acceptance_plot([]), elem_id="gen-acc", show_label=False)
        steer = gr.Plot(plots.steering_plot([]), elem_id="gen-steer", show_label=False)
        gain = gr.Plot(plots.steering_gain_plot([]), elem_id="gen-gain", show_label=False)
    inputs = [
        c["prompt"],
        c["method"],
        c["k"],
        c["threshold"],
        c["temperature"],
        c["top_p"],
        c["max_new"],
        c["seed"],
        c["steering"],
        c["counterfactual"],
        keep,
        chat,
    ]
    outputs = [trace, cards, acc, steer, gain, status, chat]
    run = go.click(h.generate, inputs, outputs, concurrency_limit=4)
    c["method"].change(h.counterfactual_default, c["method"], c["counterfactual"])
    stop.click(None, None, None, cancels=[run])
    clear.click(lambda: [], None, chat)
    return c["method"], [c[name] for name in DECODE_CONTROLS]


def _compare_tab(h: Handlers) -> tuple[gr.CheckboxGroup, list]:
    """The Compare tab; returns its methods and its decode controls (views.DECODE_CONTROLS)."""
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            methods = gr.CheckboxGroup(
                ["verifier"],
                value=["verifier"],
                label="Methods (same prompt, settings, seed)",
                elem_id="cmp-methods",
            )
            c = _decode_controls(with_method=False)
            c["prompt"].elem_id, c["max_new"].elem_id = "cmp-prompt", "cmp-max-new"
            c["counterfactual"].elem_id = "cmp-counterfactual"
            with gr.Row():
                go = gr.Button("Compare", variant="primary", elem_id="cmp-run")
                stop = gr.Button("Stop", variant="stop", elem_id="cmp-stop")
        with gr.Column(scale=3, min_width=420):
            note = gr.HTML(elem_id="cmp-note")
            bars = gr.Plot(plots.compare_bars([]), elem_id="cmp-bars", show_label=False)
            curves = gr.Plot(plots.position_curves([]), elem_id="cmp-curves", show_label=False)
    columns = gr.HTML(columns_html([]), elem_id="cmp-columns")
    inputs = [
        c["prompt"],
        methods,
        c["k"],
        c["threshold"],
        c["temperature"],
        c["top_p"],
        c["max_new"],
        c["seed"],
        c["steering"],
        c["counterfactual"],
    ]
    run = go.click(h.compare, inputs, [note, columns, bars, curves], concurrency_limit=2)
    methods.change(h.counterfactual_default, methods, c["counterfactual"])
    stop.click(None, None, None, cancels=[run])
    return methods, [c[name] for name in DECODE_CONTROLS]


def _train_tab(h: Handlers, gen_method: gr.Dropdown, cmp_methods: gr.CheckboxGroup) -> gr.Dropdown:
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            name = gr.Textbox(
                "my-drafter", label="New drafter name", info="letters, digits, _ . -", elem_id="train-name"
            )
            method = gr.Radio(
                [
                    ("pretrained (next-token)", "pretrain"),
                    ("distilled (to the verifier)", "distill"),
                    ("SD² (steered, distilled)", "sd2"),
                ],
                value="pretrain",
                label="Recipe",
                elem_id="train-method",
            )
            base = gr.Dropdown([], label="Base drafter", elem_id="train-base")
            with gr.Row():
                steps = gr.Number(20, label="Steps", precision=0, minimum=1, elem_id="train-steps")
                lr = gr.Number(1e-4, label="Learning rate")
                k = gr.Number(8, label="k (SD² offset range)", precision=0, minimum=1)
            with gr.Row():
                seq_len = gr.Number(64, label="Sequence length", precision=0)
                batch = gr.Number(4, label="Batch size", precision=0)
                seed = gr.Number(0, label="Seed", precision=0)
                precision = gr.Dropdown(
                    ["auto", "fp32", "bf16"],
                    value="auto",
                    label="Precision",
                    info="bf16 ≈ 2× faster on CPUs with AVX-512 BF16",
                    elem_id="train-precision",
                )
            loss = gr.Dropdown(
                [("forward KL", "kl"), ("TV distance (1 − acceptance)", "tvd"), ("mean of both", "mixed")],
                value="kl",
                label="Loss (distilled and SD²)",
                info="the divergence from the verifier; pretraining always learns next tokens",
                elem_id="train-loss",
            )
            data = gr.Textbox("", label="Training texts (optional; blank line between texts)", lines=3)
            key = gr.Textbox("", label="API key (only if the server sets SD2_API_KEY)", type="password")
            with gr.Row():
                go = gr.Button("Start training", variant="primary", elem_id="train-run")
                cancel = gr.Button("Cancel job", variant="stop", elem_id="train-cancel")
        with gr.Column(scale=3, min_width=420):
            status = gr.HTML(elem_id="train-status")
            bar = gr.HTML(elem_id="train-progress")
            curve = gr.Plot(plots.train_plot([]), elem_id="train-curve", show_label=False)
            job_id = gr.Number(None, label="Job id", precision=0, interactive=False)
    inputs = [name, method, base, steps, lr, k, seq_len, batch, seed, precision, loss, data, key]
    go.click(h.train, inputs, [bar, curve, status, job_id, gen_method, cmp_methods, base])
    cancel.click(h.cancel, [job_id, key], status)
    return base


def _history_tab(h: Handlers) -> tuple[gr.Dropdown, dict]:
    with gr.Row():
        method = gr.Dropdown(["all"], value="all", label="Method")
        status_filter = gr.Dropdown(["all", "succeeded", "failed", "cancelled"], value="all", label="Status")
        limit = gr.Slider(10, 200, value=50, step=10, label="Rows")
        refresh = gr.Button("Refresh", elem_id="hist-refresh")
    info = gr.HTML(elem_id="hist-info")
    table = gr.Dataframe(
        headers=RUN_COLUMNS, value=[], interactive=False, elem_id="hist-table", max_height=320
    )
    with gr.Row():
        run_id = gr.Number(None, label="Run id (click a row)", precision=0, elem_id="hist-run-id")
        fmt = gr.Radio(["json", "csv"], value="json", label="Export format")
        export = gr.Button("Export")
        key = gr.Textbox("", label="API key (for delete, if set)", type="password")
        delete = gr.Button("Delete run", variant="stop")
    file = gr.File(label="Download", interactive=False, visible=False, height=90)
    cards = gr.HTML(cards_html(None))
    trace = gr.HTML(
        trace_html([], "Click a run to reopen its full trace."),
        elem_id="hist-trace",
        elem_classes=["sd2-trace-box"],
    )
    with gr.Row():
        acc = gr.Plot(plots.acceptance_plot([]), show_label=False)
        steer = gr.Plot(plots.steering_plot([]), show_label=False)
        gain = gr.Plot(plots.steering_gain_plot([]), show_label=False)
    gr.Markdown(
        "**Stored benchmark results** — `sd2 bench ... --store URL` sends one here; "
        "their cells appear as open markers in the Theory tab."
    )
    benchmarks = gr.Dataframe(
        headers=BENCH_COLUMNS, value=[], interactive=False, elem_id="hist-benchmarks", max_height=240
    )
    listing = {
        "fn": h.history,
        "inputs": [method, status_filter, limit],
        "outputs": [table, info, benchmarks],
    }
    refresh.click(**listing)
    for control in (method, status_filter):
        control.change(**listing)
    opened = [trace, cards, acc, steer, gain, info]
    table.select(h.pick_run, None, run_id).then(h.open_run, run_id, opened)
    run_id.submit(h.open_run, run_id, opened)
    export.click(h.export, [run_id, fmt], [file, info])
    delete.click(h.delete, [run_id, key], info).then(**listing)
    return method, listing


def _theory_tab(h: Handlers) -> tuple[list, list]:
    gr.Markdown(
        "Under i.i.d. acceptance α, a block with k drafts emits **E[τ] = (1 − αᵏ⁺¹) / (1 − α)** "
        "tokens per "
        "verifier forward, and the idealised speed-up is **S(α, k, c) = E[τ] / (1 + c·k)** with "
        "c = drafter step time ÷ verifier step time (Leviathan et al. 2023). "
        "Filled markers are this server's stored runs "
        "(α̂ measured; speed-up = run tok/s ÷ the verifier's mean tok/s); open markers are the cells of "
        "stored `sd2 bench` results (speed-up over the bench's own verifier baseline)."
    )
    with gr.Row():
        k = gr.Slider(1, 16, value=8, step=1, label="k (drafts per block)")
        cost = gr.Slider(0, 1, value=0.1, step=0.01, label="c (cost ratio)")
        alpha = gr.Slider(0, 1, value=0.8, step=0.01, label="α (readout)")
    readout = gr.HTML(elem_id="theory-readout")
    with gr.Row():
        tau = gr.Plot(theory_plots.theory_tau([1, 2, 4, 8, 16]), show_label=False, elem_id="theory-tau")
        speed = gr.Plot(
            theory_plots.theory_speedup(8, [0, 0.1, 0.25, 0.5]), show_label=False, elem_id="theory-speed"
        )
    inputs, outputs = [k, cost, alpha], [tau, speed, readout]
    for control in inputs:
        control.release(h.theory, inputs, outputs)
    return inputs, outputs
