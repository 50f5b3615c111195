"""The versioned JSON schema of a benchmark result, and writing JSON / Markdown / HTML files.

Schema `sd2.bench` version 6 (bump SCHEMA_VERSION on any change of keys or meaning):
    schema, schema_version, created_at (ISO 8601 UTC), command, machine{…}, models{…}, plan{…},
    prompt_sets[{name, source, demo, n_prompts, n_available, n_too_long, sha256}], conventions{…},
    forward_times[{prompt_set, verifier_ms{"tokens": ms}, drafter_ms{name: ms}}],
    cells[CellSummary fields; tokens_per_s* as {median, low, high, n, relative}; steering_gain as
    CellGain fields or null], best_k[…], cost_profiles{method: {draft_cost, verify_ratio[…]}} (what
    k = auto weighed: sd2.draft_length.CostProfile),
    generations[one row per timed or warm-up generation, with its repeat and sample, its
    counterfactual_ms and counterfactual sums (CounterfactualSums fields or null)].
Paths (prompt set sources, drafters, the command's arguments) are relative to the repository root when
they lie inside it ("assets/prompts/chat.jsonl"), absolute otherwise (sd2.paths.repo_relative).
Readers of older results: plan.counterfactual, cells' steering_gain and the generations' counterfactual
keys are absent before version 6 (no counterfactuals were run); cost_profiles before version 7.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sd2.bench.aggregate import CellSummary, Spread
from sd2.bench.harness import BenchResult
from sd2.paths import inside_repo, repo_relative

SCHEMA = "sd2.bench"
SCHEMA_VERSION = 8  # 2: cells gained time_profile; 3: plan.samples, cells' n_samples, generations' sample;
# 4: k may be "auto", cells' mean_k; 5: machine.cpu_model; 6: plan.counterfactual, cells' steering_gain,
# generations' counterfactual_ms and counterfactual (wall_ms now excludes counterfactual_ms);
# 7: cost_profiles; 8: plan.draft_threshold
CONVENTIONS = {
    "tokens_per_s": "decode: tokens after the first / (wall − time to first token); median over repetitions "
    "of Σ tokens / Σ time over the prompt set",
    "tokens_per_s_e2e": "all tokens / wall time of the generate call (prefill included)",
    "speedup": "median tokens/s of the method / median tokens/s of the baseline, same set, T and run",
    "tau": "tokens per verifier forward; ours: complete blocks only (sd2.metrics); hf-assisted: all forwards "
    "but the last",
    "acceptance_rate": "accepted drafts / drafted tokens over complete blocks",
    "alpha_hat": "mean over judged positions of Σ min(p, q); argmax match at T = 0",
    "cost_ratio": "drafter step / verifier forward, measured in the run; cost_ratio_fwd = T_d(1) / T_v(1)",
    "speedup_ceiling": "Leviathan S(α̂, k, c) = (1 − α̂^(k+1)) / ((1 − α̂)(1 + c·k))",
    "forward_ceiling": "S_fwd = τ · T_v(1) / (k · T_d(1) + T_v(k+1)), isolated cached forwards",
    "efficiency": "decode speed-up over verifier (else hf-generate) / S_fwd",
    "forward_efficiency": "share of decode time in model forwards: isolated forward ms per token × tokens/s",
    "time_profile": "ours: ms per decode token in drafter steps, verifier forwards, steering vectors and "
    "other (sampling, acceptance, cache crops, bookkeeping, Python); sums to decode time per token",
    "samples": "sample j of prompt i is decoded with seed + 1000·j + i, at T > 0 only; τ, acceptance and α̂ "
    "pool every sample; repetitions redraw the same samples (they are for timing)",
    "greedy_match": "T = 0: fraction of prompts with token ids identical to verifier (else hf-generate)",
    "steering_gain": "--counterfactual, steered methods: each block's steered draft against the same "
    "drafter's unsteered draft from the same prefix, judged by the verifier on the side; steered / "
    "unsteered = mean expected accepted drafts per block (Σ_j Π_{i≤j} min(1, p_i/q_i)), gain = their "
    "difference, pooled over the blocks of the first repetition; low / high = 95 % Student-t interval of "
    "prompt_gain, the mean over prompts of each prompt's mean gain per block (blocks of one prompt are "
    "correlated); won / tied / lost = blocks by the sign of the gain (|gain| ≤ 1e-6 ties)",
    "counterfactual_ms": "time spent on counterfactuals (the unsteered twin's prompt forward included), "
    "taken out of each generation's wall_ms and prefill_ms, so no speed figure includes it",
}


@dataclass(frozen=True)
class RunInfo:
    """What was run, where: recorded next to every result."""

    command: str
    verifier: str
    drafters: dict[str, str] = field(default_factory=dict)  # name → path
    device: str = "cpu"
    dtype: str = "fp32"
    batch_invariant: bool = True  # our loops on sd2.invariant's kernels (the HF peers on the stock ones)
    packed_weights: bool = False  # those kernels with packed copies of the weights (--no-packed-weights)
    draft_weights: str = "full"  # the drafters' products: "int8" copies of their weights or "full" ones


def machine_info() -> dict:
    import torch
    import transformers

    from sd2.devices import cpu_model

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _cell_dict(cell: CellSummary) -> dict:
    data = asdict(cell)
    for key in ("tokens_per_s", "tokens_per_s_e2e"):
        spread: Spread = getattr(cell, key)
        data[key] = {**asdict(spread), "relative": spread.relative}
    return data


def recorded_command(command: str) -> str:
    """The command line as a record names it: each absolute path argument inside the repository made
    repo-relative (`--drafter sd2=/repo/assets/drafters/sd2` → `--drafter sd2=assets/drafters/sd2`);
    everything else, paths outside the repository included, as given."""
    try:
        words = shlex.split(command)
    except ValueError:  # not a shell-quoted line: keep it
        return command
    changed = [_relative_word(word) for word in words]
    return command if changed == words else shlex.join(changed)


def _relative_word(word: str) -> str:
    """One argument with its absolute path (the whole word, or after `NAME=`) repo-relative if inside."""
    if word.startswith("/"):
        prefix, path = "", word
    elif "=/" in word:
        name, _, rest = word.partition("=/")
        prefix, path = f"{name}=", f"/{rest}"
    else:
        return word
    relative = inside_repo(Path(path))
    return word if relative is None else prefix + relative


def to_json(result: BenchResult, info: RunInfo, created_at: datetime | None = None) -> dict:
    """The whole result as plain JSON types, in the key order of the module docstring."""
    plan = result.plan
    plan_dict = asdict(plan)
    plan_dict["methods"] = [asdict(m) for m in plan.methods]
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created_at": (created_at or datetime.now(UTC)).isoformat(timespec="seconds"),
        "command": recorded_command(info.command),
        "machine": machine_info(),
        "models": {
            "verifier": info.verifier,
            "drafters": {name: repo_relative(path) for name, path in info.drafters.items()},
            "device": info.device,
            "dtype": info.dtype,
            "batch_invariant": info.batch_invariant,
            "packed_weights": info.packed_weights,
            "draft_weights": info.draft_weights,
        },
        "plan": plan_dict,
        "prompt_sets": [
            {
                "name": s.name,
                "source": s.source,
                "demo": s.demo,
                "n_prompts": len(s.prompts),
                "n_available": s.n_available,
                "n_too_long": s.n_too_long,
                "sha256": s.sha256,
            }
            for s in result.prompt_sets
        ],
        "conventions": dict(CONVENTIONS),
        "forward_times": [
            {
                "prompt_set": f.prompt_set,
                "verifier_ms": {str(n): t for n, t in sorted(f.verifier_ms.items())},
                "drafter_ms": dict(f.drafter_ms),
            }
            for f in result.forward_times.values()
        ],
        "cells": [_cell_dict(c) for c in result.summaries],
        "best_k": list(result.best_k),
        "cost_profiles": dict(result.cost_profiles),
        "generations": [
            {
                "method": m.method,
                "prompt_set": m.prompt_set,
                "prompt_id": m.prompt_id,
                "temperature": m.temperature,
                "k": m.k,
                "repeat": m.repeat,
                "sample": m.sample,
                "n_tokens": m.stats.n_tokens,
                "prefill_ms": m.stats.prefill_ms,
                "wall_ms": m.stats.wall_ms,
                "judged_blocks": m.stats.judged_blocks,
                "judged_tokens": m.stats.judged_tokens,
                "counterfactual_ms": m.stats.counterfactual_ms,
                "counterfactual": None if m.stats.counterfactual is None else asdict(m.stats.counterfactual),
            }
            for m in result.measurements
        ],
    }


def write_outputs(result: BenchResult, info: RunInfo, out_dir: Path) -> dict[str, Path]:
    """Write bench.json, bench.md and (when plotly is installed) bench.html into out_dir."""
    from sd2.bench.figure import write_figure
    from sd2.bench.table import markdown_report

    out_dir.mkdir(parents=True, exist_ok=True)
    data = to_json(result, info)
    paths = {"json": out_dir / "bench.json", "markdown": out_dir / "bench.md"}
    paths["json"].write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    paths["markdown"].write_text(markdown_report(data))
    html = write_figure(data, out_dir / "bench.html")
    if html is not None:
        paths["html"] = html
    return paths
