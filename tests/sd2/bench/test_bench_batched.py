"""`sd2 bench --batch`: B requests of each method of our loop decoded together and one after another on the
tiny random pair, every batched request's tokens checked against its solo run, the record's rows
complete and its numbers consistent."""

import json
import sys

import pytest

from sd2.bench.batched import WAYS, BatchedRow, Throughput, batch_requests, markdown_table
from sd2.bench.prompts import BenchPrompt, PromptSet
from sd2.cli import main
from sd2.config import DecodeConfig


def test_bench_batch_end_to_end(tiny_pair_dir, chat_prompts_dir, tmp_path, monkeypatch):
    verifier_dir, drafter_dir = tiny_pair_dir
    prompts_dir = chat_prompts_dir
    out = tmp_path / "out"
    argv = ["bench", "--verifier", str(verifier_dir), "--drafter", f"d={drafter_dir}"]
    argv += ["--methods", "verifier", "d", "hf-generate", "--prompts-dir", str(prompts_dir)]
    argv += ["--prompt-sets", "chat", "--k", "auto", "2", "--temperatures", "0", "1"]
    argv += ["--max-new-tokens", "12", "--repeats", "1", "--batch", "1", "3", "--out", str(out)]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/sd2", *argv])
    assert main(argv) == 0
    record = json.loads((out / "batched.json").read_text())
    assert record["command"] == "sd2 " + " ".join(argv)
    rows = record["rows"]
    # hf-generate is left out; verifier: 2 temperatures × 2 sizes; d: 2 temperatures × 2 k × 2 sizes
    assert sorted({r["method"] for r in rows}) == ["d", "verifier"]
    assert len([r for r in rows if r["method"] == "verifier"]) == 4
    assert len([r for r in rows if r["method"] == "d"]) == 8
    assert all(r["k"] is None for r in rows if r["method"] == "verifier")
    for row in rows:
        assert row["identical"] == row["batch"]
        for way in WAYS:
            t = row[way]
            assert t["tokens"] > 0 and t["aggregate_tokens_per_s"] == pytest.approx(t["tokens"] / t["wall_s"])
            assert t["p50_latency_s"] <= t["p95_latency_s"]
        assert row["serial"]["tokens"] == row["batched"]["tokens"]
    markdown = (out / "batched.md").read_text()
    assert markdown.count("\n| d |") == 8 and "identical to solo" in markdown


def test_requests_cycle_the_set_and_seed_each_request():
    prompts = tuple(BenchPrompt(f"p{i}", prompt=f"prompt {i}") for i in range(2))
    prompt_set = PromptSet("s", prompts, "s.jsonl", False, 2)
    requests = batch_requests(prompt_set, "d", 5, DecodeConfig(k=3, temperature=1.0, seed=99))
    assert [r.prompt for r in requests] == ["prompt 0", "prompt 1"] * 2 + ["prompt 0"]
    assert [r.decode.seed for r in requests] == [0, 1, 2, 3, 4]
    assert all(r.decode.k == 3 and r.decode.temperature == 1.0 and r.method == "d" for r in requests)


def test_a_row_reports_ratios_to_the_serial_way():
    def way(rate):
        return Throughput(10 / rate, 10, rate, rate, 1.0, 2.0)

    row = BatchedRow("sd2", "chat", 0.0, "auto", 8, way(20.0), way(70.0), identical=8)
    assert row.ratio == pytest.approx(3.5)
    assert "| 20.0 | 70.0 | **3.50×** |" in markdown_table([row])
