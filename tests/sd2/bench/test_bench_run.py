"""The harness on the tiny random pair: identical greedy ids across runners, forward timing, a full
--quick run through `sd2 bench` writing JSON / Markdown / HTML. No assertion depends on speed."""

import json
from dataclasses import replace

import pytest

from sd2.bench.forward import measure_forward_times, time_forward
from sd2.bench.harness import make_runner, run_bench
from sd2.bench.plan import BenchPlan, Cell, resolve_methods
from sd2.bench.prompts import BenchPrompt, PromptSet
from sd2.cli import main
from sd2.config import DecodeConfig
from sd2.engine import Engine

PROMPTS = [
    BenchPrompt("a", prompt="Tell me a short story about a cat."),
    BenchPrompt("b", messages=({"role": "user", "content": "def add(a, b):"},)),
]


@pytest.fixture(scope="module")
def engine(tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    return Engine.load(str(verifier_dir), {"d": str(drafter_dir)}, device="cpu")


def run(engine, method, k, prompt, max_new_tokens=12, temperature=0.0):
    (spec,) = resolve_methods([method], list(engine.drafters))
    decode = DecodeConfig(k=k, temperature=temperature, max_new_tokens=max_new_tokens, seed=3)
    return make_runner(engine, Cell(spec, k if spec.speculative else None))(prompt, decode)


@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: p.id)
def test_greedy_ids_identical_across_runners(engine, prompt):
    ours = run(engine, "verifier", 3, prompt)
    assert ours.n_tokens == 12 or set(ours.token_ids[-1:]) <= engine.stop_ids
    for method in ("hf-generate", "hf-assisted:d", "hf-assisted:self", "self", "d"):
        assert run(engine, method, 3, prompt).token_ids == ours.token_ids, method


def test_hf_generate_stops_where_ours_stops(engine):
    """Make the verifier's first greedy token a stop id: both must emit exactly that one token."""
    prompt = PROMPTS[0]
    first = run(engine, "verifier", 3, prompt, max_new_tokens=1).token_ids[0]
    saved = engine.stop_ids
    engine.stop_ids = frozenset({first})
    try:
        assert run(engine, "verifier", 3, prompt).token_ids == (first,)
        assert run(engine, "hf-generate", 3, prompt).token_ids == (first,)
    finally:
        engine.stop_ids = saved


def test_stats_of_each_runner(engine):
    prompt = PROMPTS[0]
    spec = run(engine, "self", 3, prompt, max_new_tokens=13)  # prefill token + 3 full blocks of 4
    assert spec.judged_blocks == 3 and spec.judged_tokens == 12 and spec.histogram == (0, 0, 0, 3)
    assert spec.accepted == spec.drafted == 9 and spec.overlap_count == spec.overlap_sum == 9
    assert 0 < spec.prefill_ms < spec.wall_ms
    hf = run(engine, "hf-assisted:self", 3, prompt, max_new_tokens=13)  # HF: 4 + 4 + 4 + a cut block of 1
    assert hf.n_tokens == 13 and (hf.judged_blocks, hf.judged_tokens) == (3, 12)
    plain = run(engine, "hf-generate", 3, prompt, max_new_tokens=13)
    assert plain.n_tokens == 13 and plain.judged_blocks == plain.judged_tokens == 12


def test_hf_assisted_restores_the_assistant_settings(engine):
    config = engine.drafters["d"].model.generation_config
    before = (config.num_assistant_tokens, config.num_assistant_tokens_schedule)
    run(engine, "hf-assisted:d", 5, PROMPTS[0])
    assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule) == before


def test_sampling_runs_for_every_runner(engine):
    for method in ("verifier", "hf-generate", "hf-assisted:d", "d"):
        stats = run(engine, method, 2, PROMPTS[1], temperature=1.0)
        assert 1 <= stats.n_tokens <= 12


def test_forward_times(engine):
    ids = engine.encode(PROMPTS[0].request("verifier", DecodeConfig()))
    times = time_forward(engine.verifier, ids, 4, repeats=3)
    assert len(times) == 3 and all(t > 0 for t in times)
    forward = measure_forward_times(
        "s",
        engine.verifier,
        {"self": engine.verifier, "d": engine.drafters["d"].model},
        [ids],
        ks=[2, 3],
        repeats=2,
    )
    assert sorted(forward.verifier_ms) == [1, 3, 4]
    assert forward.drafter_ms["self"] == forward.verifier_ms[1] and forward.drafter_ms["d"] > 0


def write_prompt_set(tmp_path, name, prompts):
    """A prompts dir under tmp_path holding NAME.jsonl with one line per prompt (ids p0, p1, …)."""
    prompts_dir = tmp_path / "prompts"
    prompts_dir.mkdir()
    lines = (json.dumps({"id": f"p{i}", "prompt": prompt}) + "\n" for i, prompt in enumerate(prompts))
    (prompts_dir / f"{name}.jsonl").write_text("".join(lines))
    return prompts_dir


def test_quick_bench_end_to_end(tiny_pair_dir, tmp_path, capsys):
    verifier_dir, drafter_dir = tiny_pair_dir
    prompts_dir = write_prompt_set(tmp_path, "chat", [f"Hello! Tell me story {i}." for i in range(3)])
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "--verifier",
            str(verifier_dir),
            "--drafter",
            f"d={drafter_dir}",
            "--quick",
            "--methods",
            "verifier",
            "hf-generate",
            "self",
            "hf-assisted",
            "hf-assisted:self",
            "d",
            "--prompts-dir",
            str(prompts_dir),
            "--prompt-sets",
            "chat",
            "demo",
            "--k",
            "2",
            "--max-prompts",
            "1",
            "--max-new-tokens",
            "10",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    cells = {(c["method"], c["prompt_set"]): c for c in data["cells"]}
    assert {m for m, _ in cells} == {
        "verifier",
        "hf-generate",
        "self",
        "hf-assisted:d",
        "hf-assisted:self",
        "d",
    }
    assert [(s["name"], s["n_prompts"], s["demo"]) for s in data["prompt_sets"]] == [
        ("chat", 1, False),
        ("demo", 1, True),
    ]
    for prompt_set in ("chat", "demo"):
        for method in ("self", "hf-assisted:self"):  # the verifier as its own drafter: τ = k + 1
            assert cells[(method, prompt_set)]["tau"] == pytest.approx(3.0)
        assert cells[("self", prompt_set)]["forward_ceiling"] > 0
        for method in ("hf-generate", "self", "hf-assisted:d", "d"):
            assert cells[(method, prompt_set)]["greedy_match"] == 1.0
    timed = [g for g in data["generations"] if g["repeat"] >= 0]
    assert len(timed) == 6 * 2 * 2  # methods × sets × repetitions, one prompt each
    markdown = (out / "bench.md").read_text()
    assert "| Method | τ chat | τ demo | Mean τ | Mean speed-up |" in markdown
    assert "demo prompts, not a benchmark set" in markdown
    assert (out / "bench.html").read_text().count("plotly") > 0
    assert "| self (k=2) | 3.00 | 3.00 | 3.00 |" in capsys.readouterr().out


def sampled_ids(result, temperature):
    """(method, prompt id, repeat, sample) → emitted ids of the timed generations at one temperature."""
    return {
        (m.method, m.prompt_id, m.repeat, m.sample): m.stats.token_ids
        for m in result.measurements
        if m.repeat >= 0 and m.temperature == temperature
    }


def test_samples_are_new_draws_seeded_as_runs_with_later_seeds(engine):
    """--samples 3 at T = 1: three different draws per prompt, sample j identical to the one sample of a
    run with --seed seed + 1000·j; repetitions redraw the same sample; T = 0 runs one sample."""
    prompt_set = PromptSet("s", tuple(PROMPTS), source="test", demo=False, n_available=2)
    plan = BenchPlan(
        methods=resolve_methods(["verifier", "d"], ["d"]),
        ks=(2,),
        temperatures=(0.0, 1.0),
        max_new_tokens=10,
        repeats=2,
        warmup=0,
        samples=3,
        seed=5,
        forward_prompts=1,
        forward_repeats=1,
    )
    result = run_bench(engine, plan, [prompt_set])
    greedy, sampled = sampled_ids(result, 0.0), sampled_ids(result, 1.0)
    assert {key[3] for key in greedy} == {0} and len(greedy) == 2 * 2 * 2  # methods × prompts × repeats
    assert len(sampled) == 2 * 2 * 2 * 3
    for method in ("verifier", "d"):
        for prompt in PROMPTS:
            draws = [sampled[(method, prompt.id, 0, j)] for j in range(3)]
            assert [sampled[(method, prompt.id, 1, j)] for j in range(3)] == draws  # repeats: same draws
    assert any(
        len({sampled[(m, p.id, 0, j)] for j in range(3)}) > 1 for m in ("verifier", "d") for p in PROMPTS
    )
    cells = {(c.method, c.temperature): c for c in result.summaries}
    assert (cells[("d", 1.0)].n_samples, cells[("d", 1.0)].n_generations) == (3, 12)
    assert (cells[("d", 0.0)].n_samples, cells[("d", 0.0)].n_generations) == (1, 4)
    for j in range(3):
        single_run = run_bench(engine, replace(plan, samples=1, seed=5 + 1000 * j), [prompt_set])
        single = sampled_ids(single_run, 1.0)
        assert single == {(m, p, r, 0): sampled[(m, p, r, j)] for (m, p, r, _) in single}


def test_samples_refuse_a_set_whose_seeds_would_collide(tiny_pair_dir, tmp_path, capsys):
    verifier_dir, _ = tiny_pair_dir
    prompts_dir = write_prompt_set(tmp_path, "big", [f"Say {i}." for i in range(1001)])
    argv = ["bench", "--verifier", str(verifier_dir), "--methods", "verifier", "--prompts-dir"]
    argv += [str(prompts_dir), "--prompt-sets", "big", "--max-prompts", "0", "--samples", "2"]
    argv += ["--temperatures", "1", "--out", str(tmp_path / "out")]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "--samples 2 with more than 1000 prompts in big" in err and "--max-prompts" in err
    assert not (tmp_path / "out").exists()
