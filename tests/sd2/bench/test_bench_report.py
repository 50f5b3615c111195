"""The JSON schema (keys and types are a contract: bump SCHEMA_VERSION to change them) and the tables."""

import json
from pathlib import Path

import pytest

from sd2.bench.report import SCHEMA, SCHEMA_VERSION, RunInfo, to_json
from sd2.bench.table import markdown_report, table1

TOP_LEVEL = [
    "schema",
    "schema_version",
    "created_at",
    "command",
    "machine",
    "models",
    "plan",
    "prompt_sets",
    "conventions",
    "forward_times",
    "cells",
    "best_k",
    "cost_profiles",
    "generations",
]
CELL_KEYS = {
    "method": str,
    "runner": str,
    "drafter": (str, type(None)),
    "prompt_set": str,
    "temperature": float,
    "k": (int, str, type(None)),
    "n_prompts": int,
    "n_generations": int,
    "n_samples": int,
    "mean_new_tokens": float,
    "tau": (float, type(None)),
    "acceptance_rate": (float, type(None)),
    "alpha_hat": (float, type(None)),
    "histogram": list,
    "per_position_unconditional": list,
    "per_position_conditional": list,
    "tokens_per_s": dict,
    "tokens_per_s_e2e": dict,
    "prefill_ms": float,
    "speedup_vs_verifier": (float, type(None)),
    "speedup_vs_hf_generate": (float, type(None)),
    "speedup_e2e_vs_verifier": (float, type(None)),
    "speedup_e2e_vs_hf_generate": (float, type(None)),
    "cost_ratio": (float, type(None)),
    "cost_ratio_fwd": (float, type(None)),
    "speedup_ceiling": (float, type(None)),
    "forward_ceiling": (float, type(None)),
    "efficiency": (float, type(None)),
    "forward_efficiency": (float, type(None)),
    "greedy_match": (float, type(None)),
    "time_profile": (dict, type(None)),
    "mean_k": (float, type(None)),
    "steering_gain": (dict, type(None)),
}
SPREAD_KEYS = {"median", "low", "high", "n", "relative"}
PROMPT_SET_KEYS = {"name", "source", "demo", "n_prompts", "n_available", "n_too_long", "sha256"}
GENERATION_KEYS = {
    "method",
    "prompt_set",
    "prompt_id",
    "temperature",
    "k",
    "repeat",
    "sample",
    "n_tokens",
    "prefill_ms",
    "wall_ms",
    "judged_blocks",
    "judged_tokens",
    "counterfactual_ms",
    "counterfactual",
}
PLAN_KEYS = {
    "methods",
    "draft_threshold",
    "ks",
    "temperatures",
    "max_new_tokens",
    "repeats",
    "warmup",
    "max_prompts",
    "forward_prompts",
    "forward_repeats",
    "seed",
    "samples",
    "top_k",
    "top_p",
    "quick",
    "k_sweep",
    "counterfactual",
}

INFO = RunInfo(command="sd2 bench --quick", verifier="tiny", drafters={"d": "/tmp/d"})


def test_json_schema_is_stable(synthetic_result):
    data = json.loads(json.dumps(to_json(synthetic_result, INFO)))  # survives a JSON round trip
    assert list(data) == TOP_LEVEL
    assert (data["schema"], data["schema_version"]) == (SCHEMA, SCHEMA_VERSION) == ("sd2.bench", 8)
    assert set(data["plan"]) == PLAN_KEYS
    assert set(data["plan"]["methods"][0]) == {"name", "runner", "drafter"}
    models = {"verifier", "drafters", "device", "dtype", "batch_invariant", "packed_weights", "draft_weights"}
    assert set(data["models"]) == models
    assert {"platform", "cpu_count", "cpu_model", "torch", "transformers"} <= set(data["machine"])
    assert all(set(s) == PROMPT_SET_KEYS for s in data["prompt_sets"])
    assert all(set(g) == GENERATION_KEYS for g in data["generations"])
    assert data["forward_times"][0]["verifier_ms"] == {"1": 60.0, "5": 90.0}
    assert len(data["cells"]) == 6
    for cell in data["cells"]:
        assert set(cell) == set(CELL_KEYS)
        for key, kind in CELL_KEYS.items():
            assert isinstance(cell[key], kind), (key, cell[key])
        assert set(cell["tokens_per_s"]) == SPREAD_KEYS == set(cell["tokens_per_s_e2e"])
    assert set(data["best_k"][0]) == {"method", "temperature", "k", "speedup"}
    assert data["cost_profiles"] == {"self": {"draft_cost": 1.0, "verify_ratio": [1.0, 1.2, 1.5]}}


def test_table1_layout(synthetic_result):
    cells = to_json(synthetic_result, INFO)["cells"]
    lines = table1(cells, ["chat", "code", "math"], 0.0).splitlines()
    assert lines[0] == "| Method | τ chat | τ code | τ math | Mean τ | Mean speed-up |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert lines[2] == "| verifier | 1.00 | 1.00 | – | 1.00 | 1.00× |"
    assert lines[3].startswith("| hf-generate | 1.00 | 1.00 | – | 1.00 | 0.95× |")
    # self: 9 decode tokens in 250 ms (chat) and 400 ms (code) vs 900 ms → 3.60× and 2.25×, mean 2.92×
    assert lines[4] == "| self (k=4) | 5.00 | 5.00 | – | 5.00 | 2.92× |"
    assert len(lines) == 5


def test_markdown_report_sections(synthetic_result):
    text = markdown_report(to_json(synthetic_result, INFO))
    for needle in (
        "# sd2 benchmark",
        "command: `sd2 bench --quick`",
        "## T = 0: τ per prompt set",
        "### T = 0: details",
        "## Best k on this machine",
        "## Isolated forward times",
        "T_v(5) = 90.0",
        "## What k = auto weighed",
        "| self | 1.000 | 1.20 | 1.50 |",
    ):
        assert needle in text
    assert "demo prompts" not in text


def test_the_report_names_the_cpu_model_when_the_result_has_one(synthetic_result):
    """Results on one CPU type compare; the machine line says which it was (older results lack it)."""
    data = to_json(synthetic_result, INFO)
    machine = {**data["machine"], "cpu_count": 2, "torch_threads": 2, "cpu_model": "Example CPU 9000"}
    assert "2 CPUs (Example CPU 9000) (2 torch threads)" in markdown_report({**data, "machine": machine})
    del machine["cpu_model"]
    assert "2 CPUs (2 torch threads)" in markdown_report({**data, "machine": machine})


def test_the_plan_line_names_a_draft_threshold_only_when_there_was_one(synthetic_result):
    data = to_json(synthetic_result, INFO)
    assert "draft threshold" not in markdown_report(data)
    stopped = {**data, "plan": {**data["plan"], "draft_threshold": 0.3}}
    assert ", draft threshold 0.3" in markdown_report(stopped)
    older = {**data, "plan": {k: v for k, v in data["plan"].items() if k != "draft_threshold"}}
    assert "draft threshold" not in markdown_report(older)


def test_markdown_report_has_the_time_profile_of_our_cells(synthetic_result):
    data = to_json(synthetic_result, INFO)
    spec = next(c for c in data["cells"] if c["method"] == "self" and c["prompt_set"] == "chat")
    # chat: 9 decode tokens in 250 ms: 8 ms drafting, 20 ms verifying → per token 0.89 / 2.22 / 0 / 24.67
    assert spec["time_profile"]["total"] == pytest.approx(250.0 / 9)
    section = markdown_report(data).split("## Where the decode time goes")[1]
    assert "| self (k=4) | chat | 0 | 0.9 (3%) | 2.2 (8%) | 0.0 (0%) | 24.7 (89%) | 27.8 |" in section
    assert "hf-generate" not in section.split("## Isolated")[0]


def test_a_record_names_paths_inside_the_repository_relative_to_it(synthetic_result):
    root = Path(__file__).resolve().parents[3]
    drafter = root / "assets" / "drafters" / "sd2"
    info = RunInfo(
        command=f"sd2 -v bench --drafter sd2={drafter} --prompts-dir {root}/assets/prompts --out /tmp/b",
        verifier="tiny",
        drafters={"sd2": str(drafter), "hub": "org/a-drafter", "mine": "/tmp/d"},
    )
    data = to_json(synthetic_result, info)
    assert data["command"] == (
        "sd2 -v bench --drafter sd2=assets/drafters/sd2 --prompts-dir assets/prompts --out /tmp/b"
    )
    assert data["models"]["drafters"] == {
        "sd2": "assets/drafters/sd2",
        "hub": "org/a-drafter",
        "mine": "/tmp/d",
    }
    assert str(root) not in markdown_report(data)
    plain = "sd2 bench --prompt-sets 'chat code' --out /tmp/b"  # nothing inside: the line as given
    assert to_json(synthetic_result, RunInfo(command=plain, verifier="tiny"))["command"] == plain
