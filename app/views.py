"""Pure helpers between the API's JSON and the widgets: request bodies, choices, tables, throttling."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.client import ApiClient

AUTO_K = "auto"  # the API's k = auto: the server picks each block's k (POST /generate's schema)
UI_MAX_K = 16  # the longest fixed draft the k menu offers (the API allows up to 64)

DEMO_PROMPT = "Explain in three sentences why the sky is blue."
RECIPE_LABELS = {"sd2": "SD² (steered)", "distill": "distilled", "pretrain": "pretrained"}
BENCH_COLUMNS = ["id", "measured", "label", "methods", "prompt sets", "cells", "machine", "command"]
RUN_COLUMNS = ["id", "created", "method", "status", "tokens", "τ", "acceptance", "α̂", "tok/s", "prompt"]


def drafting_label(summary: dict) -> str:
    """How a finished run drafted, for the status line: "k = 4", or "k = auto (2.3 drafts per block)"."""
    k = summary.get("config", {}).get("k")
    metrics = summary.get("metrics", {})
    if k != AUTO_K:
        return f"k = {k}"
    blocks = sum(metrics.get("histogram") or [])
    mean = (
        f" ({metrics['drafted'] / blocks:.1f} drafts per block)" if blocks and metrics.get("drafted") else ""
    )
    return f"k = auto{mean}"


# The decode controls each of Generate and Compare has, in the order `decode_control_values` fills them.
DECODE_CONTROLS = ("k", "threshold", "temperature", "top_p", "max_new", "seed")


def decode_control_values(defaults: dict) -> dict[str, dict]:
    """GET /defaults → {control: its settings}: the API's own default for each decode control (the UI
    keeps no copy of them), and the max-new-tokens slider capped at the server's limit."""
    decode = defaults["decode"]
    return {
        "k": {"value": str(decode["k"])},  # the k menu's entries are strings: "auto", "1", …
        "threshold": {"value": decode["draft_threshold"]},
        "temperature": {"value": decode["temperature"]},
        "top_p": {"value": decode["top_p"]},
        "max_new": {
            "value": min(decode["max_new_tokens"], defaults["max_new_tokens_limit"]),
            "maximum": defaults["max_new_tokens_limit"],
        },
        "seed": {"value": decode["seed"]},
    }


def decode_body(
    prompt: str,
    k: float | str | None,
    draft_threshold: float | None,
    temperature: float | None,
    top_p: float | None,
    max_new_tokens: float | None,
    seed: float | None,
    steering: bool,
    history: Sequence[dict] | None = None,
    counterfactual: bool = False,
) -> dict:
    """The shared /generate and /compare body; with a chat history, `messages` replaces `prompt`.
    k: "auto" or a number of drafts per block. A control still empty (page load fills them from
    GET /defaults) is left out, so the API's default applies; an empty seed is null (a fresh seed).
    `counterfactual` is sent only when asked for with steering on (unsteered, there is nothing to
    compare), so a request without it stays what an older server accepts."""
    chosen = {
        "k": None if k is None else (k if k == AUTO_K else int(k)),
        "draft_threshold": None if draft_threshold is None else float(draft_threshold),
        "temperature": None if temperature is None else float(temperature),
        "top_p": None if top_p is None else float(top_p),
        "max_new_tokens": None if max_new_tokens is None else int(max_new_tokens),
    }
    body: dict[str, Any] = {name: value for name, value in chosen.items() if value is not None}
    body["seed"] = None if seed is None else int(seed)
    body["steering"] = bool(steering)
    if counterfactual and steering:
        body["counterfactual"] = True
    if history:
        body["messages"] = [*_plain(history), {"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def _plain(history: Sequence[dict]) -> list[dict]:
    """Chatbot messages → API messages (role and text content only)."""
    return [{"role": m["role"], "content": str(m["content"])} for m in history if m.get("content")]


def drafter_label(drafter: dict) -> str:
    recipe = RECIPE_LABELS.get(drafter.get("recipe") or "", drafter.get("recipe") or "drafter")
    steer = ", steered" if drafter.get("steering") and drafter.get("recipe") != "sd2" else ""
    return f"{drafter['name']} — {recipe}{steer}, {drafter.get('n_params', 0) / 1e6:.1f} M"


def method_choices(methods: Sequence[str], drafters: Sequence[dict]) -> list[tuple[str, str]]:
    """(label, value) pairs: drafters first (with recipe and size), then self and the verifier alone."""
    described = {d["name"]: drafter_label(d) for d in drafters}
    special = {
        "verifier": "verifier — no drafter (baseline)",
        "self": "self — the verifier drafts for itself",
    }
    ordered = [m for m in methods if m in described] + [m for m in methods if m not in described]
    return [(described.get(m) or special.get(m, m), m) for m in ordered]


def default_method(methods: Sequence[str], drafters: Sequence[dict]) -> str:
    """The SD² drafter when one is loaded, else the first drafter, else the verifier."""
    names = [d["name"] for d in drafters if d["name"] in methods]
    steered = [
        d["name"] for d in drafters if d["name"] in names and (d.get("recipe") == "sd2" or d.get("steering"))
    ]
    return (steered or names or ["verifier"])[0]


def counterfactual_default(methods: str | Sequence[str] | None, drafters: Sequence[dict]) -> bool:
    """The Counterfactual switch's default: on when a chosen method is a drafter with steering
    (GET /drafters' `steering`), the only runs that have an unsteered twin to compare with."""
    chosen = {methods} if isinstance(methods, str) else set(methods or [])
    return any(d.get("steering") for d in drafters if d["name"] in chosen)


def default_compare(methods: Sequence[str], drafters: Sequence[dict]) -> list[str]:
    """Up to three methods: one per recipe (pretrained, distilled, SD²) if loaded, filled up with others."""
    by_recipe: dict[str | None, str] = {}
    for d in drafters:  # the first drafter of each recipe (config-loaded ones come first)
        if d["name"] in methods:
            by_recipe.setdefault(d.get("recipe"), d["name"])
    picked = [by_recipe[r] for r in ("pretrain", "distill", "sd2") if r in by_recipe]
    rest = [d["name"] for d in drafters if d["name"] in methods] + ["verifier", "self"]
    for name in rest:
        if len(picked) < 3 and name not in picked and name in methods:
            picked.append(name)
    return picked


def verifier_tps(stats: Sequence[dict]) -> float | None:
    """Mean decode tokens/s of stored verifier-only runs, weighted by run count (None if none)."""
    rows = [r for r in stats if r.get("method") == "verifier" and r.get("tokens_per_s")]
    runs = sum(r["n_runs"] for r in rows)
    return sum(r["tokens_per_s"] * r["n_runs"] for r in rows) / runs if runs else None


def runs_rows(page: dict) -> list[list[Any]]:
    """GET /runs items as table rows in RUN_COLUMNS order."""
    return [
        [
            r["id"],
            str(r["created_at"])[:19].replace("T", " "),
            r["method"],
            r["status"],
            r.get("n_tokens"),
            _round(r.get("tau"), 2),
            _round(None if r.get("acceptance_rate") is None else 100 * r["acceptance_rate"], 0),
            _round(r.get("alpha_hat"), 2),
            _round(r.get("tokens_per_s"), 1),
            _prompt_of(r)[:80],
        ]
        for r in page.get("items", [])
    ]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _prompt_of(run: dict) -> str:
    if run.get("prompt"):
        return run["prompt"]
    messages = run.get("messages") or []
    return messages[-1]["content"] if messages else ""


def theory_points(runs: Sequence[dict], baseline_tps: float | None) -> list[dict]:
    """Measured runs for the theory plots: α̂, τ, k and speed-up over the verifier's mean tokens/s."""
    points = []
    for r in runs:
        if r.get("alpha_hat") is None or r.get("method") == "verifier":
            continue
        tps = r.get("tokens_per_s")
        speed = tps / baseline_tps if tps and baseline_tps else None
        points.append(
            {
                "id": r["id"],
                "method": r["method"],
                "k": r["config"]["k"],
                "alpha_hat": r["alpha_hat"],
                "tau": r.get("tau"),
                "speedup": speed,
            }
        )
    return points


def benchmark_rows(page: dict) -> list[list[Any]]:
    """GET /benchmarks items as table rows in BENCH_COLUMNS order."""
    return [
        [
            b["id"],
            str(b["measured_at"])[:19].replace("T", " "),
            b.get("label") or "",
            ", ".join(b["methods"]),
            ", ".join(b["prompt_sets"]),
            b["n_cells"],
            f"{b['machine'].get('cpu_count', '?')} CPUs, GPU: {b['machine'].get('cuda') or 'none'}",
            b["command"][:120],
        ]
        for b in page.get("items", [])
    ]


def benchmark_points(benchmarks: Sequence[dict]) -> list[dict]:
    """Speculative cells of stored benchmark results for the theory plots: α̂, τ, k and the measured
    speed-up over the bench's own `verifier` (else `hf-generate`) baseline."""
    points = []
    for bench in benchmarks:
        for cell in bench.get("cells", []):
            if cell.get("alpha_hat") is None or cell.get("k") is None:
                continue
            points.append(
                {
                    "id": f"bench {bench['id']}, {cell['prompt_set']}, T={cell['temperature']:g}",
                    "method": cell["method"],
                    "k": cell["k"],
                    "alpha_hat": cell["alpha_hat"],
                    "tau": cell.get("tau"),
                    "speedup": cell.get("speedup_vs_verifier") or cell.get("speedup_vs_hf_generate"),
                }
            )
    return points


@dataclass
class Throttle:
    """True at most once per `interval_s`: each streamed update ships whole figures to the browser."""

    interval_s: float
    _last: float = field(default=0.0)

    def ready(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            return True
        return False


def stream_blocks(
    client: ApiClient, body: dict, interval_s: float
) -> Iterator[tuple[list[dict], dict | None]]:
    """(blocks so far, None) at most every interval_s while decoding, then (all blocks, summary)."""
    blocks: list[dict] = []
    throttle = Throttle(interval_s)
    for event in client.generate_stream(body):
        if event.get("event") == "block":
            blocks.append(event["block"])
            if throttle.ready():
                yield blocks, None
        elif event.get("event") == "summary":
            yield blocks, event
            return


def stream_comparison(
    client: ApiClient, body: dict, interval_s: float
) -> Iterator[tuple[list[dict], dict | None]]:
    """(columns so far, None) while the comparison streams — each method's column waiting, decoding
    (its blocks so far) or done (its result and blocks) — at most every interval_s and whenever a
    method starts or ends; then (the final columns, the summary with the comparison's run ids)."""
    columns = [{"method": m, "state": "waiting", "blocks": []} for m in body["methods"]]
    throttle = Throttle(interval_s)
    for event in client.compare_stream(body):
        kind = event.get("event")
        if kind == "summary":
            yield columns, event
            return
        column = columns[event["index"]]
        if kind == "block":
            column["blocks"].append(event["block"])
            if not throttle.ready():
                continue
        elif kind == "method":
            column["state"] = "decoding"
        elif kind == "result":
            state = "done" if event.get("status") == "succeeded" else event.get("status", "failed")
            columns[event["index"]] = {**event, "blocks": column["blocks"], "state": state}
        yield columns, None


def job_points(job: dict, points: list[dict]) -> list[dict]:
    """Accumulate the new metric points of one /train stream line."""
    return [*points, *job.get("points", [])]
