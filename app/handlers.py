"""Event handlers: each calls the API client and maps its JSON onto the widgets.

Errors from the API (`ApiError`) are shown in the tab's status box with the API's own message.
Generators stream: decoding yields the trace and plots every `interval_s`, training every line.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from app import plots, theory_plots, views
from app.cards import cards_html, progress_html, status_html
from app.client import ApiClient, ApiError
from app.trace_html import columns_html, trace_html

SKIP = gr.skip
BENCHMARKS_PLOTTED = 10  # newest stored benchmark results drawn on the Theory curves


class Handlers:
    """The UI's behaviour, bound to one API client."""

    def __init__(self, client: ApiClient, interval_s: float = 0.25):
        self.client, self.interval_s = client, interval_s

    # --- start-up and shared choices --------------------------------------------------------------
    def server_line(self) -> str:
        try:
            h = self.client.health()
        except ApiError as err:
            return status_html(err.message, "error")
        db = "DB ok" if h["database"] else "DB unreachable"
        kernels = "exact kernels" if h.get("batch_invariant") else "stock kernels (not exact)"
        line = f"verifier {h['verifier']} on {h['device']} ({kernels}) · {len(h['methods'])} methods · {db}"
        return status_html(line, "ok")

    def decode_defaults(self) -> tuple:
        """Updates for Generate's, then Compare's, decode controls (views.DECODE_CONTROLS): the API's
        defaults, so the UI starts where a request that leaves them out would."""
        try:
            values = views.decode_control_values(self.client.defaults())
        except ApiError:
            return tuple(SKIP() for _ in range(2 * len(views.DECODE_CONTROLS)))
        # One fresh update per control: Gradio consumes an update dict as it applies it, so the same
        # object twice would leave Compare's controls at their minimum.
        return tuple(gr.update(**values[name]) for _tab in range(2) for name in views.DECODE_CONTROLS)

    def choices(self) -> tuple[Any, Any, Any, Any]:
        """Updates for: Generate method, Compare methods, Train base drafter, History method filter."""
        try:
            methods, drafters = self.client.health()["methods"], self.client.drafters()
        except ApiError:
            return SKIP(), SKIP(), SKIP(), SKIP()
        options, names = views.method_choices(methods, drafters), [d["name"] for d in drafters]
        return (
            gr.update(choices=options, value=views.default_method(methods, drafters)),
            gr.update(choices=options, value=views.default_compare(methods, drafters)),
            gr.update(choices=names, value=views.default_method(names, drafters) if names else None),
            gr.update(choices=["all", *methods], value="all"),
        )

    def counterfactual_default(self, methods: str | list[str] | None) -> Any:
        """The Counterfactual switch follows the chosen method(s): on for a steered drafter."""
        try:
            drafters = self.client.drafters()
        except ApiError:
            return SKIP()
        return gr.update(value=views.counterfactual_default(methods, drafters))

    # --- Generate ---------------------------------------------------------------------------------
    def generate(
        self, prompt, method, k, threshold, temperature, top_p, max_new, seed, steering, counterfactual,
        keep_chat, chat,
    ) -> Iterator:  # fmt: skip
        history = list(chat or []) if keep_chat else []
        decode = views.decode_body(
            prompt, k, threshold, temperature, top_p, max_new, seed, steering, history, counterfactual
        )
        body = {**decode, "method": method}
        yield trace_html([], "Waiting for the model…"), cards_html(None, live=True), *[SKIP()] * 3, "", SKIP()
        try:
            for blocks, summary in views.stream_blocks(self.client, body, self.interval_s):
                yield self._generation(blocks, summary, prompt, history, temperature)
        except ApiError as err:
            yield SKIP(), cards_html(None), *[SKIP()] * 3, status_html(err.message, "error"), SKIP()

    def _generation(
        self,
        blocks: list[dict],
        summary: dict | None,
        prompt: str,
        history: list[dict],
        temperature: float | None,
    ) -> tuple:
        temperature = (summary or {}).get("config", {}).get("temperature", temperature)  # the one that ran
        trace = trace_html(blocks, temperature=temperature, explain=summary is not None)
        plotted = plots.acceptance_plot(blocks), plots.steering_plot(blocks), plots.steering_gain_plot(blocks)
        if summary is None:
            live = status_html(f"decoding… {len(blocks)} blocks so far", "info")
            return trace, cards_html(None, live=True), *plotted, live, SKIP()
        baseline = views.verifier_tps(self._stats())
        done = (
            f"run #{summary['run_id']} stored · {summary['metrics']['n_tokens']} tokens · "
            f"{summary['finish_reason']} · {summary['method']} · {views.drafting_label(summary)} · "
            f"{summary.get('precision') or 'precision unknown'}"
        )
        chat = [
            *history,
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": summary["text"]},
        ]
        return trace, cards_html(summary["metrics"], baseline), *plotted, status_html(done, "ok"), chat

    def _stats(self) -> list[dict]:
        try:
            return self.client.stats()
        except ApiError:
            return []

    # --- Compare ----------------------------------------------------------------------------------
    def compare(
        self, prompt, methods, k, threshold, temperature, top_p, max_new, seed, steering, counterfactual
    ) -> Iterator:
        """Streams: the columns fill one method after another; the note and plots come at the end."""
        decode = views.decode_body(
            prompt, k, threshold, temperature, top_p, max_new, seed, steering, counterfactual=counterfactual
        )
        body = {**decode, "methods": list(methods or [])}
        yield status_html("Waiting for the model…", "info"), SKIP(), SKIP(), SKIP()
        try:
            for columns, summary in views.stream_comparison(self.client, body, self.interval_s):
                if summary is None:
                    running = next((c["method"] for c in columns if c["state"] == "decoding"), None)
                    live = status_html(f"decoding {running}…" if running else "decoding…", "info")
                    yield live, columns_html(columns, temperature, explain=False), SKIP(), SKIP()
                    continue
                done = [c for c in columns if c["state"] == "done"]
                note = (
                    compare_note(done, float(temperature))
                    if len(done) == len(columns)
                    else status_html(f"comparison #{summary['comparison_id']} {summary['status']}", "error")
                )
                cols = columns_html(columns, temperature)
                yield note, cols, plots.compare_bars(done), plots.position_curves(done)
        except ApiError as err:
            yield status_html(err.message, "error"), SKIP(), SKIP(), SKIP()

    # --- Train ------------------------------------------------------------------------------------
    def train(
        self, name, method, base, steps, lr, k, seq_len, batch, seed, precision, loss, data, api_key
    ) -> Iterator:
        body = {
            "name": name,
            "method": method,
            "base_drafter": base or "",
            "steps": int(steps),
            "lr": float(lr),
            "k": int(k),
            "seq_len": int(seq_len),
            "batch_size": int(batch),
            "seed": int(seed),
            "precision": precision or "auto",
        }
        if method != "pretrain":  # the loss of a fine-tune; pretraining learns next tokens
            body["loss"] = loss or "kl"
        if data and data.strip():
            body["data"] = [t.strip() for t in data.split("\n\n") if t.strip()]
        try:
            job = self.client.train(body, api_key=api_key or None)
            yield from self._follow(job)
        except ApiError as err:
            yield SKIP(), SKIP(), status_html(err.message, "error"), SKIP(), SKIP(), SKIP(), SKIP()

    def _follow(self, job: dict) -> Iterator[tuple]:
        points: list[dict] = []
        for line in self.client.train_stream(job["id"]):
            points = views.job_points(line, points)
            detail = f"job #{line['id']} {line['name']}" + (
                f" · {line['error']}" if line.get("error") else ""
            )
            bar, plot = progress_html(line["progress"], line["status"], detail), plots.train_plot(points)
            yield bar, plot, "", line["id"], SKIP(), SKIP(), SKIP()
        kind = {"succeeded": "ok", "cancelled": "info"}.get(line["status"], "error")
        message = f"job #{line['id']} {line['status']}" + (
            f": drafter {line['name']!r} is now selectable in Generate and Compare" if kind == "ok" else ""
        )
        yield (
            bar,
            plot,
            status_html(message + (f" ({line['error']})" if line.get("error") else ""), kind),
            line["id"],
            *self.choices()[:3],
        )

    def cancel(self, job_id: float | None, api_key: str) -> str:
        if not job_id:
            return status_html("no job to cancel yet", "info")
        try:
            job = self.client.cancel(int(job_id), api_key=api_key or None)
        except ApiError as err:
            return status_html(err.message, "error")
        return status_html(
            f"job #{job['id']} is {job['status']} (a running job stops at its next step)", "info"
        )

    # --- History ----------------------------------------------------------------------------------
    def history(self, method: str, status: str, limit: float) -> tuple:
        filters = {
            "method": None if method == "all" else method,
            "status": None if status == "all" else status,
        }
        try:
            page = self.client.runs(limit=int(limit), **filters)
        except ApiError as err:
            return SKIP(), status_html(err.message, "error"), SKIP()
        rows = views.runs_rows(page)
        try:
            bench_rows = views.benchmark_rows(self.client.benchmarks())
        except ApiError:
            bench_rows = []
        note = f"{len(rows)} of {page['total']} runs; {len(bench_rows)} stored benchmark results"
        return gr.update(value=rows), status_html(note, "info"), gr.update(value=bench_rows)

    def pick_run(self, evt: gr.SelectData) -> Any:
        row = evt.row_value or []
        return row[0] if row else SKIP()

    def open_run(self, run_id: float | None) -> tuple:
        if not run_id:
            return *[SKIP()] * 5, status_html("pick a run in the table", "info")
        try:
            run = self.client.run(int(run_id))
        except ApiError as err:
            return *[SKIP()] * 5, status_html(err.message, "error")
        blocks, baseline = run["blocks"], views.verifier_tps(self._stats())
        info = f"run #{run['id']} · {run['method']} · {run['status']}" + (
            f" · {run['error']}" if run["error"] else ""
        )
        return (
            trace_html(blocks, "This run has no stored trace.", run["config"].get("temperature")),
            cards_html(run["metrics"], baseline),
            plots.acceptance_plot(blocks),
            plots.steering_plot(blocks),
            plots.steering_gain_plot(blocks),
            status_html(info, "ok"),
        )

    def export(self, run_id: float | None, fmt: str) -> tuple:
        if not run_id:
            return SKIP(), status_html("pick a run first", "info")
        try:
            data = self.client.export(int(run_id), fmt)
        except ApiError as err:
            return SKIP(), status_html(err.message, "error")
        path = Path(tempfile.mkdtemp(prefix="sd2-export-")) / f"run-{int(run_id)}.{fmt}"
        path.write_bytes(data)
        exported = status_html(f"exported run #{int(run_id)} as {fmt.upper()}", "ok")
        return gr.update(value=str(path), visible=True), exported

    def delete(self, run_id: float | None, api_key: str) -> str:
        if not run_id:
            return status_html("pick a run first", "info")
        try:
            self.client.delete(int(run_id), api_key=api_key or None)
        except ApiError as err:
            return status_html(err.message, "error")
        return status_html(f"deleted run #{int(run_id)}", "ok")

    # --- Theory -----------------------------------------------------------------------------------
    def theory(self, k: float, cost: float, alpha: float) -> tuple:
        k = int(k)
        try:
            runs = self.client.runs(status="succeeded", limit=200)["items"]
        except ApiError:
            runs = []
        points = views.theory_points(runs, views.verifier_tps(self._stats()))
        bench = views.benchmark_points(self._recent_benchmarks())
        ks = sorted({1, 2, 4, 8, 16, k})
        costs = sorted({0.0, float(cost), 0.25, 0.5})
        readout = theory_readout(alpha, k, cost, len(points), len(bench))
        return (
            theory_plots.theory_tau(ks, points, bench),
            theory_plots.theory_speedup(k, costs, points, bench),
            readout,
        )

    def _recent_benchmarks(self, n: int = BENCHMARKS_PLOTTED) -> list[dict]:
        """The n newest stored benchmark results with their cells ([] when the server has none)."""
        try:
            items = self.client.benchmarks(limit=n)["items"]
            return [self.client.benchmark(b["id"]) for b in items]
        except ApiError:
            return []


def compare_note(results: list[dict], temperature: float) -> str:
    """What the columns mean: at T = 0 the text is identical and only acceptance differs."""
    texts = {r["text"] for r in results}
    if temperature == 0:
        same = "✓ identical here" if len(texts) == 1 else "⚠ yet the texts differ — please report this"
        return status_html(
            f"T = 0: every method outputs exactly the verifier's greedy text, token for token ({same}). "
            "Only acceptance differs — which drafts were accepted, τ, acceptance rate — and so speed.",
            "info",
        )
    return status_html(
        f"T = {temperature:g}: every method samples from the verifier's distribution (lossless), "
        "but the texts "
        "differ token by token because each drafter consumes the random numbers differently.",
        "info",
    )


def theory_readout(alpha: float, k: int, cost: float, n_points: int, n_bench: int = 0) -> str:
    tau, speed = theory_plots.expected_tau(alpha, k), theory_plots.speedup(alpha, k, cost)
    return status_html(
        f"At α = {alpha:.2f}, k = {k}, c = {cost:g}: E[τ] = {tau:.2f} tokens per verifier forward, "
        f"S = {speed:.2f}× (idealised: a (k+1)-token verify costs one step, true on a GPU, not on a CPU). "
        f"{n_points} measured runs (filled markers) and {n_bench} stored benchmark cells (open markers) "
        "plotted.",
        "info",
    )
