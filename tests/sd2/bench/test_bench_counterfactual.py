"""`sd2 bench --counterfactual` on the tiny random pair with a steered drafter: gain rows for steered
methods only, the emitted tokens unchanged, the counterfactuals' time out of the speed figures, and
the gains rebuildable from the JSON's generation rows."""

import json
import shutil
import sys
from dataclasses import asdict, replace

import pytest
import torch
from transformers import LlamaForCausalLM

from sd2.bench.gain import cell_gain
from sd2.bench.harness import make_runner
from sd2.bench.measure import CounterfactualSums, GenerationStats, Measurement, stats_from_result
from sd2.bench.plan import Cell, resolve_methods
from sd2.bench.prompts import BenchPrompt
from sd2.cli import main
from sd2.config import DecodeConfig
from sd2.engine import Engine
from sd2.steering import new_head_for

PROMPT = BenchPrompt("a", prompt="Tell me a short story about a cat.")


@pytest.fixture(scope="module")
def steered_dir(tiny_pair_dir, tmp_path_factory):
    """The tiny drafter with a random SD² steering head (non-zero W_s, so steering changes drafts)."""
    verifier_dir, drafter_dir = tiny_pair_dir
    folder = tmp_path_factory.mktemp("steered") / "s"
    shutil.copytree(drafter_dir, folder)
    verifier = LlamaForCausalLM.from_pretrained(verifier_dir)
    head = new_head_for(verifier, LlamaForCausalLM.from_pretrained(drafter_dir))
    with torch.no_grad():
        head.w_s.normal_(0, 0.3, generator=torch.Generator().manual_seed(7))
    head.save(folder)
    return folder


@pytest.fixture(scope="module")
def engine(tiny_pair_dir, steered_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    return Engine.load(str(verifier_dir), {"d": str(drafter_dir), "s": str(steered_dir)}, device="cpu")


def run(engine, method, counterfactual, temperature=0.0) -> GenerationStats:
    (spec,) = resolve_methods([method], list(engine.drafters))
    decode = DecodeConfig(k=3, temperature=temperature, max_new_tokens=24, seed=3)
    runner = make_runner(engine, Cell(spec, 3 if spec.speculative else None), counterfactual)
    return runner(PROMPT, decode)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_counterfactuals_only_on_steered_runs_and_the_same_tokens(engine, temperature):
    steered = run(engine, "s", True, temperature)
    assert steered.counterfactual is not None and steered.counterfactual.n_blocks > 0
    assert steered.counterfactual_ms > 0
    assert steered.token_ids == run(engine, "s", False, temperature).token_ids
    for method in ("verifier", "d", "self", "hf-assisted:s"):
        stats = run(engine, method, True, temperature)
        assert stats.counterfactual is None, method  # (its counterfactual_ms: two timer reads a block)


def test_the_counterfactuals_time_is_taken_out_of_the_wall_time(engine):
    request = PROMPT.request("s", DecodeConfig(k=3, max_new_tokens=24))
    result = engine.generate(replace(request, counterfactual=True))
    cf_ms = result.metrics.counterfactual_ms
    assert cf_ms > 0
    twin_prompt_ms = result.blocks[0].timings.counterfactual_ms  # the unsteered twin's prompt forward
    assert twin_prompt_ms > 0
    stats = stats_from_result(result, wall_ms=cf_ms + 1000.0, prefill_ms=twin_prompt_ms + 10.0)
    assert stats.wall_ms == pytest.approx(1000.0) and stats.prefill_ms == pytest.approx(10.0)
    assert stats.decode_ms == pytest.approx(990.0)
    assert stats.counterfactual_ms == cf_ms
    assert stats.counterfactual == CounterfactualSums.of(result.blocks)
    gain = result.metrics.steering_gain  # the engine's own per-run figure agrees with the sums
    assert stats.counterfactual.n_blocks == gain.n_blocks
    assert stats.counterfactual.gain / gain.n_blocks == pytest.approx(gain.gain)


def test_bench_counterfactual_end_to_end(
    tiny_pair_dir, steered_dir, chat_prompts_dir, tmp_path, capsys, monkeypatch
):
    verifier_dir, drafter_dir = tiny_pair_dir
    prompts_dir = chat_prompts_dir
    out = tmp_path / "out"
    argv = ["bench", "--verifier", str(verifier_dir), "--drafter", f"d={drafter_dir}"]
    argv += ["--drafter", f"s={steered_dir}", "--methods", "verifier", "d", "s", "self", "hf-assisted:s"]
    argv += ["--prompts-dir", str(prompts_dir), "--prompt-sets", "chat", "--max-prompts", "3", "--k", "3"]
    argv += ["--max-new-tokens", "16", "--repeats", "2", "--counterfactual", "--quick", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/sd2", *argv])  # the record names the command
    assert main(argv) == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["command"] == "sd2 " + " ".join(argv)
    assert data["plan"]["counterfactual"] is True
    cells = {c["method"]: c for c in data["cells"]}
    assert {m for m, c in cells.items() if c["steering_gain"]} == {"s"}
    assert cells["s"]["greedy_match"] == 1.0  # the counterfactual never changes the emitted tokens
    gain = cells["s"]["steering_gain"]
    assert gain["n_prompts"] == 3 and gain["won"] + gain["tied"] + gain["lost"] == gain["n_blocks"] > 0
    assert gain["steered"] - gain["unsteered"] == pytest.approx(gain["gain"])
    assert gain["low"] <= gain["prompt_gain"] <= gain["high"]
    rows = [g for g in data["generations"] if g["method"] == "s" and g["repeat"] >= 0]
    assert len(rows) == 3 * 2 and all(g["counterfactual"]["n_blocks"] > 0 for g in rows)
    assert all(g["counterfactual"] is None for g in data["generations"] if g["method"] != "s")
    rebuilt = [
        Measurement("s", "chat", g["prompt_id"], 0.0, 3, g["repeat"], _stats(g["counterfactual"]))
        for g in rows
    ]
    assert asdict(cell_gain(rebuilt)) == pytest.approx(gain)
    markdown = (out / "bench.md").read_text()
    section = markdown.split("## Steering gain")[1].split("\n## ")[0]
    table = [line for line in section.splitlines() if line.startswith("| ")]
    assert len(table) == 2 and table[1].startswith("| s | chat | 0 | 3 | 3 | ")
    assert ", counterfactuals" in markdown and "Steering gain" in capsys.readouterr().out


def _stats(sums: dict) -> GenerationStats:
    return GenerationStats((), 0.0, 0.0, 0, 0, counterfactual=CounterfactualSums(**sums))
