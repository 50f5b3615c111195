"""Markdown tables from a result's JSON (so they can be rebuilt from a stored file).

Table 1 follows the paper's layout: one row per method (speculative ones per k), τ per prompt set,
mean τ over the sets, and mean decode speed-up over `verifier` (else `hf-generate`) over the sets.
With `--counterfactual` a "Steering gain" table follows (sd2.bench.gain), one row per steered cell.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from sd2.bench.plan import SAMPLE_SEED_STRIDE


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def _label(cell: dict) -> str:
    return cell["method"] if cell["k"] is None else f"{cell['method']} (k={cell['k']})"


def _speedup(cell: dict) -> float | None:
    value = cell["speedup_vs_verifier"]
    return value if value is not None else cell["speedup_vs_hf_generate"]


def _rows(cells: Sequence[dict]) -> list[str]:
    """Row labels in first-seen order (the plan's method order)."""
    return list(dict.fromkeys(_label(c) for c in cells))


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def table1(cells: Sequence[dict], prompt_sets: Sequence[str], temperature: float) -> str:
    """τ per prompt set, mean τ, mean speed-up: one row per method (and k) at one temperature."""
    cells = [c for c in cells if c["temperature"] == temperature]
    rows = []
    for label in _rows(cells):
        mine = {c["prompt_set"]: c for c in cells if _label(c) == label}
        taus = [mine[s]["tau"] if s in mine else None for s in prompt_sets]
        speedups = [_speedup(c) for c in mine.values() if _speedup(c) is not None]
        known = [t for t in taus if t is not None]
        rows.append(
            [
                label,
                *(_fmt(t) for t in taus),
                _fmt(statistics.fmean(known) if known else None),
                _fmt(statistics.fmean(speedups) if speedups else None, suffix="×"),
            ]
        )
    return _markdown(["Method", *(f"τ {s}" for s in prompt_sets), "Mean τ", "Mean speed-up"], rows)


def details_table(cells: Sequence[dict], temperature: float) -> str:
    """Every number of every cell at one temperature (conventions in the JSON's `conventions`)."""
    header = [
        "Method",
        "Set",
        "tok/s",
        "range",
        "tok/s e2e",
        "× verifier",
        "× hf-generate",
        "acc. rate",
        "α̂",
        "c",
        "S(α̂,k,c)",
        "S_fwd",
        "efficiency",
        "in forwards",
        "greedy match",
    ]
    rows = []
    for c in (c for c in cells if c["temperature"] == temperature):
        tps = c["tokens_per_s"]
        rows.append(
            [
                _label(c),
                c["prompt_set"],
                _fmt(tps["median"], 1),
                f"{tps['low']:.1f}–{tps['high']:.1f}",
                _fmt(c["tokens_per_s_e2e"]["median"], 1),
                _fmt(c["speedup_vs_verifier"], suffix="×"),
                _fmt(c["speedup_vs_hf_generate"], suffix="×"),
                _fmt(c["acceptance_rate"]),
                _fmt(c["alpha_hat"]),
                _fmt(c["cost_ratio"], 3),
                _fmt(c["speedup_ceiling"]),
                _fmt(c["forward_ceiling"]),
                _fmt(c["efficiency"]),
                _fmt(c["forward_efficiency"]),
                _fmt(c["greedy_match"]),
            ]
        )
    return _markdown(header, rows)


def profile_table(cells: Sequence[dict]) -> str:
    """Where the decode time goes, ms per emitted token, for every cell of our own loop."""
    header = ["Method", "Set", "T", "drafter steps", "verifier forwards", "steering", "other", "total"]
    rows = []
    for c in cells:
        profile = c.get("time_profile")
        if profile:
            parts = [profile[name] for name in ("draft", "verify", "steer", "other")]
            shares = [f"{ms:.1f} ({ms / profile['total']:.0%})" for ms in parts]
            rows.append(
                [_label(c), c["prompt_set"], f"{c['temperature']:g}", *shares, f"{profile['total']:.1f}"]
            )
    return _markdown(header, rows)


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.3f}"


def _interval(gain: dict) -> str:
    """'+0.120 [+0.030, +0.210]', or the mean alone when one prompt gives no interval."""
    if gain["low"] is None:
        return _signed(gain["prompt_gain"])
    return f"{_signed(gain['prompt_gain'])} [{_signed(gain['low'])}, {_signed(gain['high'])}]"


def gain_table(cells: Sequence[dict]) -> str:
    """Steered against unsteered expected accepted drafts per block, one row per cell that has them."""
    header = ["Method", "Set", "T", "k", "prompts", "blocks", "steered", "unsteered", "gain (blocks)"]
    header += ["gain per prompt [95 % CI]", "won / tied / lost"]
    rows = []
    for c in cells:
        gain = c.get("steering_gain")  # absent before schema version 6
        if gain:
            rows.append(
                [
                    c["method"],
                    c["prompt_set"],
                    f"{c['temperature']:g}",
                    str(c["k"]),
                    str(gain["n_prompts"]),
                    str(gain["n_blocks"]),
                    f"{gain['steered']:.3f}",
                    f"{gain['unsteered']:.3f}",
                    _signed(gain["gain"]),
                    _interval(gain),
                    f"{gain['won']} / {gain['tied']} / {gain['lost']}",
                ]
            )
    return _markdown(header, rows)


GAIN_NOTE = (
    "Each steered block's own draft against the same drafter's draft with its steering off, from the same "
    "prefix and as long, judged by the verifier on the side (`--counterfactual`, sd2.counterfactual). "
    "steered / unsteered: mean expected accepted drafts per block, Σ_j Π_{i≤j} min(1, p_i/q_i) (exact "
    "counts at T = 0), pooled over the blocks of the first repetition; gain (blocks): their difference. "
    "Blocks of one prompt are correlated, so the 95 % interval is a Student-t interval over the prompts' "
    "mean gains per block (n = prompts), not over blocks. won / tied / lost: blocks where the steered "
    "draft expected more / the same (±1e-6) / fewer. Speeds: the counterfactuals' time "
    "(`metrics.counterfactual_ms`, the unsteered twin's prompt forward included) is subtracted from each "
    "generation's wall and prefill times, so the tokens/s above leave it out.\n"
)


def forward_table(forward_times: Sequence[dict]) -> str:
    rows = []
    for f in forward_times:
        verifier = ", ".join(f"T_v({n}) = {t:.1f}" for n, t in f["verifier_ms"].items())
        drafters = ", ".join(f"T_d[{name}] = {t:.1f}" for name, t in f["drafter_ms"].items()) or "–"
        rows.append([f["prompt_set"], verifier, drafters])
    return _markdown(["Set", "verifier forwards (ms)", "drafter steps (ms)"], rows)


def _samples_note(plan: dict) -> str:
    """', N samples of each prompt at T > 0 (seeds …)' when the run drew several; '' otherwise."""
    samples = plan.get("samples", 1)  # absent before schema version 3: one sample
    if samples == 1:
        return f", seed {plan['seed']}"
    seeds = f"seed {plan['seed']} + {SAMPLE_SEED_STRIDE}·sample + prompt index"
    return f", {samples} samples of each prompt at T > 0 ({seeds})"


def _threshold_note(plan: dict) -> str:
    """', draft threshold t' when the run's speculative cells had a confidence stop; '' otherwise."""
    threshold = plan.get("draft_threshold", 0.0)  # absent before 2026-12-07: no confidence stop
    return f", draft threshold {threshold}" if threshold else ""


def markdown_report(data: dict) -> str:
    """The full Markdown report: provenance, Table 1 per temperature, details, best k, forward times."""
    sets = [s["name"] for s in data["prompt_sets"]]
    plan, machine = data["plan"], data["machine"]
    cpu = f" ({machine['cpu_model']})" if machine.get("cpu_model") else ""  # results before schema 5 lack it
    parts = [
        "# sd2 benchmark\n",
        f"- date: {data['created_at']}  \n- command: `{data['command']}`",
        f"- machine: {machine['platform']}, {machine['cpu_count']} CPUs{cpu} "
        f"({machine['torch_threads']} torch threads), GPU: {machine['cuda'] or 'none'}; "
        f"torch {machine['torch']}, transformers {machine['transformers']}",
        f"- models: verifier {data['models']['verifier']} on {data['models']['device']}/"
        f"{data['models']['dtype']} ({_kernels(data['models'])}); "
        f"drafters: {data['models']['drafters'] or 'none'}",
        f"- plan: {plan['max_new_tokens']} new tokens, {plan['repeats']} repetitions "
        f"(+{plan['warmup']} warm-up), k ∈ {plan['ks']}, T ∈ {plan['temperatures']}"
        f"{_samples_note(plan)}{_threshold_note(plan)}"
        f"{', counterfactuals' if plan.get('counterfactual') else ''}"
        f"{', quick' if plan['quick'] else ''}",
    ]
    for s in data["prompt_sets"]:
        note = " — **demo prompts, not a benchmark set**" if s["demo"] else ""
        parts.append(
            f"- prompt set `{s['name']}`: {s['n_prompts']} of {s['n_available']} prompts from "
            f"{s['source']}{note}"
        )
    for temperature in plan["temperatures"]:
        parts.append(
            f"\n## T = {temperature:g}: τ per prompt set and mean decode speed-up (Table 1 layout)\n"
        )
        parts.append(table1(data["cells"], sets, temperature))
        parts.append(f"\n### T = {temperature:g}: details (median decode tokens/s, range over repetitions)\n")
        parts.append(details_table(data["cells"], temperature))
    if data["best_k"]:
        parts.append("\n## Best k on this machine\n")
        parts.append(
            _markdown(
                ["Method", "T", "best k", "mean speed-up"],
                [
                    [b["method"], f"{b['temperature']:g}", str(b["k"]), _fmt(b["speedup"], suffix="×")]
                    for b in data["best_k"]
                ],
            )
        )
    if any(c.get("steering_gain") for c in data["cells"]):
        parts.append("\n## Steering gain: steered vs unsteered drafts of the same blocks\n")
        parts.append(GAIN_NOTE)
        parts.append(gain_table(data["cells"]))
    if any(c.get("time_profile") for c in data["cells"]):
        parts.append("\n## Where the decode time goes (ms per emitted token, share of decode time)\n")
        parts.append(profile_table(data["cells"]))
    parts.append("\n## Isolated forward times\n")
    parts.append(forward_table(data["forward_times"]))
    if data.get("cost_profiles"):  # absent before schema version 7
        parts.append("\n## What k = auto weighed (measured once per process)\n")
        parts.append(cost_profile_table(data["cost_profiles"]))
    return "\n".join(parts)


def cost_profile_table(profiles: dict[str, dict]) -> str:
    """Each method's c and r(k) = T_v(k+1) / T_v(1), the costs k = auto chooses by (sd2.draft_length)."""
    shown = 8
    rows = [
        [method, f"{p['draft_cost']:.3f}", *(f"{r:.2f}" for r in p["verify_ratio"][1 : shown + 1])]
        for method, p in profiles.items()
    ]
    return _markdown(["Method", "c", *(f"r({k})" for k in range(1, shown + 1))], rows)


def _kernels(models: dict) -> str:
    """Which kernels our loops ran on (results before the key existed ran the stock ones)."""
    if models.get("batch_invariant", False):
        packed = ", packed weights" if models.get("packed_weights") else ""
        int8 = ", int8 drafter weights" if models.get("draft_weights") == "int8" else ""
        return f"our loops batch-invariant{packed}{int8}, hf-* on transformers' kernels"
    return "stock kernels everywhere"
