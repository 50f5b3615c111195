"""benchmarks/paired_tau.py: the paired bootstrap comparison behind the README's τ intervals.

data/speed_auto_bf16_chat_k3.json is a real `sd2 bench` result (schema version 4), trimmed from
assets/benchmarks/speed_auto_bf16.json: that run decoded 6 chat prompts with --repeats 2 (one warm-up
generation per cell, repeat −1, on the first prompt) at T = 0 and 1. Kept: the generations and `cells`
of set chat, k = 3, T = 0 and T = 1 for the methods pretrained, sd2 and hf-assisted:pretrained (k = auto,
the baselines and the code and summarize sets dropped); `prompt_sets` and `forward_times` cut to chat,
`drafter_ms` and `best_k` to those methods; everything else (command, plan, conventions, …) as written.
All 6 prompts are kept, so the kept `cells` (τ as `sd2 bench` computed it) still describe the kept
generations. Written as JSON with one line per top-level key and per element of a top-level list.

The expected numbers below were read off that file by hand (repeat 0 of each prompt), not computed by
the code under test.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.paired_tau import compare, per_prompt, pool_results, pooled_tau

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "paired_tau.py"
DATA = Path(__file__).parent / "data" / "speed_auto_bf16_chat_k3.json"
DRAWS = 200

PROMPTS = ("XkbRlLc_0", "U9p2NFJ_0", "SZY3v6n_0", "pMczn7z_14", "7K29bZg_0", "u4W3XCs_0")
# (judged tokens, judged blocks) of repeat 0, in PROMPTS order.
T0 = {
    "hf-assisted:pretrained": [(127, 81), (124, 82), (125, 75), (127, 106), (126, 93), (127, 90)],
    "pretrained": [(124, 92), (124, 67), (124, 81), (124, 105), (125, 96), (126, 87)],
    "sd2": [(124, 93), (127, 53), (126, 74), (124, 103), (124, 74), (125, 81)],
}
T1 = {
    "hf-assisted:pretrained": [(126, 82), (125, 72), (127, 73), (126, 77), (21, 15), (126, 83)],
    "pretrained": [(123, 85), (126, 71), (126, 84), (124, 68), (15, 10), (125, 86)],
    "sd2": [(125, 75), (124, 75), (124, 94), (126, 80), (6, 5), (124, 85)],
}
# Σ tokens / Σ blocks of those rows, summed by hand.
TAU_T0 = {"hf-assisted:pretrained": 756 / 527, "pretrained": 747 / 528, "sd2": 750 / 478}
TAU_T1 = {"hf-assisted:pretrained": 651 / 402, "pretrained": 639 / 404, "sd2": 629 / 414}


def as_table(rows: dict[str, list[tuple]]) -> dict[str, dict[str, tuple]]:
    return {method: dict(zip(PROMPTS, cells, strict=True)) for method, cells in rows.items()}


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(DATA.read_text())


@pytest.fixture
def result(raw) -> dict:
    return copy.deepcopy(raw)


def with_seed(result: dict, seed: int, samples: int | None = 1) -> dict:
    other = copy.deepcopy(result)
    other["plan"]["seed"] = seed
    if samples is None:
        del other["plan"]["samples"]  # as results before schema version 3 have it
    else:
        other["plan"]["samples"] = samples
    return other


# --- the committed file is what the docstring says -----------------------------------------------


def test_data_file_is_small_and_holds_the_cells_described(raw):
    assert DATA.stat().st_size < 40_000
    assert raw["schema"] == "sd2.bench"
    cells = {(g["prompt_set"], g["k"], g["temperature"]) for g in raw["generations"]}
    assert cells == {("chat", 3, 0.0), ("chat", 3, 1.0)}
    assert {g["repeat"] for g in raw["generations"]} == {-1, 0, 1}
    assert raw["plan"]["repeats"] == 2


# --- per_prompt ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("temperature", "rows"), [(0, T0), (1.0, T1)])
def test_per_prompt_sums_repeat_zero_per_method_and_prompt(result, temperature, rows):
    # The warm-up (repeat −1, same greedy output at T = 0) and repeat 1 (same draws) hold the same
    # numbers as repeat 0: reading either would double a prompt's sums.
    assert per_prompt(result, "chat", 3, temperature) == as_table(rows)


def test_per_prompt_ignores_warmup_and_later_repeats_whatever_they_hold(result):
    for gen in result["generations"]:
        if gen["repeat"] != 0:
            gen["judged_tokens"], gen["judged_blocks"] = 10**6, 1
    assert per_prompt(result, "chat", 3, 0.0) == as_table(T0)
    assert per_prompt(result, "chat", 3, 1.0) == as_table(T1)


def test_per_prompt_sums_the_samples_of_a_prompt(result):
    # A run with --samples 2 holds two repeat-0 generations per prompt: their sums are pooled.
    extra = [
        dict(g, sample=1, judged_tokens=10, judged_blocks=4)
        for g in result["generations"]
        if g["temperature"] == 1.0 and g["repeat"] == 0 and g["method"] == "sd2"
    ]
    result["generations"] += extra
    table = per_prompt(result, "chat", 3, 1.0)
    assert table["sd2"] == {p: (t + 10, b + 4) for p, (t, b) in zip(PROMPTS, T1["sd2"], strict=True)}
    assert table["pretrained"] == as_table(T1)["pretrained"]


def test_per_prompt_filters_by_set_k_and_temperature(result):
    for gen in result["generations"]:
        if gen["method"] == "sd2" and gen["temperature"] == 0.0:
            gen["k"] = 8
        if gen["method"] == "pretrained" and gen["temperature"] == 0.0:
            gen["prompt_set"] = "code"
    assert per_prompt(result, "chat", 3, 0.0) == {
        "hf-assisted:pretrained": as_table(T0)["hf-assisted:pretrained"]
    }
    assert per_prompt(result, "chat", 8, 0.0) == {"sd2": as_table(T0)["sd2"]}
    assert per_prompt(result, "code", 3, 0.0) == {"pretrained": as_table(T0)["pretrained"]}
    assert per_prompt(result, "chat", 3, 1.0) == as_table(T1)
    assert per_prompt(result, "chat", 4, 0.0) == {}
    assert per_prompt(result, "summarize", 3, 0.0) == {}
    assert per_prompt(result, "chat", 3, 0.5) == {}


# --- pooled_tau ------------------------------------------------------------------------------------


def test_pooled_tau_is_total_tokens_over_total_blocks():
    assert pooled_tau([(3, 1), (6, 5)]) == 1.5  # the mean of per-prompt τ would be 2.1
    assert pooled_tau([]) == 0.0
    assert pooled_tau([(0, 0)]) == 0.0


@pytest.mark.parametrize(("temperature", "rows", "taus"), [(0.0, T0, TAU_T0), (1.0, T1, TAU_T1)])
def test_pooled_tau_matches_the_hand_sums_and_sd2_bench_own_cells(raw, temperature, rows, taus):
    table = per_prompt(raw, "chat", 3, temperature)
    bench_tau = {c["method"]: c["tau"] for c in raw["cells"] if c["temperature"] == temperature}
    for method, tau in taus.items():
        assert pooled_tau(list(table[method].values())) == pytest.approx(tau, abs=1e-12)
        assert bench_tau[method] == pytest.approx(tau, abs=1e-12)


# --- compare ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def t0(raw):
    return per_prompt(raw, "chat", 3, 0.0)


def test_compare_observed_difference_and_wins(t0):
    r = compare(t0["pretrained"], t0["sd2"], DRAWS, seed=0)
    assert r["prompts"] == 6
    assert r["diff"] == pytest.approx(747 / 528 - 750 / 478, abs=1e-12)
    # Per-prompt τ: pretrained 124/92 > sd2 124/93 on XkbRlLc_0 only; sd2 is higher on the other five.
    assert (r["a_wins"], r["b_wins"]) == (1, 5)
    assert r["low"] <= r["diff"] <= r["high"]
    assert r["low"] < r["high"]  # six different prompts: resampling them moves the difference

    r = compare(t0["hf-assisted:pretrained"], t0["pretrained"], DRAWS, seed=0)
    assert r["diff"] == pytest.approx(756 / 527 - 747 / 528, abs=1e-12)
    # hf-assisted higher on XkbRlLc_0, SZY3v6n_0, pMczn7z_14, 7K29bZg_0; pretrained on the other two.
    assert (r["a_wins"], r["b_wins"]) == (4, 2)
    assert r["low"] <= r["diff"] <= r["high"]


def test_compare_is_seeded(t0):
    first = compare(t0["pretrained"], t0["sd2"], DRAWS, seed=7)
    assert compare(t0["pretrained"], t0["sd2"], DRAWS, seed=7) == first
    others = [compare(t0["pretrained"], t0["sd2"], DRAWS, seed=s) for s in (1, 2, 3)]
    assert any((o["low"], o["high"]) != (first["low"], first["high"]) for o in others)
    assert all(o["diff"] == first["diff"] for o in others)  # the observed difference draws nothing


def test_compare_swapped_sides_negates_everything(t0):
    ab = compare(t0["pretrained"], t0["sd2"], DRAWS, seed=3)
    ba = compare(t0["sd2"], t0["pretrained"], DRAWS, seed=3)
    assert ba["diff"] == -ab["diff"]
    assert (ba["low"], ba["high"]) == (-ab["high"], -ab["low"])  # same resamples, mirrored percentiles
    assert (ba["a_wins"], ba["b_wins"]) == (ab["b_wins"], ab["a_wins"])


def test_compare_with_itself_is_zero_with_a_zero_width_interval(t0):
    r = compare(t0["sd2"], t0["sd2"], DRAWS, seed=0)
    assert r == {"prompts": 6, "diff": 0.0, "low": 0.0, "high": 0.0, "a_wins": 0, "b_wins": 0}


def test_compare_a_constant_shift_is_the_whole_interval(t0):
    # One more accepted token per block on every prompt raises τ by exactly 1 on any resample.
    shifted = {p: (t + b, b) for p, (t, b) in t0["pretrained"].items()}
    r = compare(shifted, t0["pretrained"], DRAWS, seed=0)
    assert r["diff"] == pytest.approx(1.0, abs=1e-12)
    assert r["low"] == pytest.approx(1.0, abs=1e-12)
    assert r["high"] == pytest.approx(1.0, abs=1e-12)
    assert (r["a_wins"], r["b_wins"]) == (6, 0)


def test_compare_pairs_only_shared_prompts(t0):
    a = {p: c for p, c in t0["pretrained"].items() if p != "U9p2NFJ_0"}
    r = compare(a, t0["sd2"], DRAWS, seed=0)
    assert r["prompts"] == 5
    assert r["diff"] == pytest.approx((747 - 124) / (528 - 67) - (750 - 127) / (478 - 53), abs=1e-12)
    assert (r["a_wins"], r["b_wins"]) == (1, 4)
    with pytest.raises(ValueError, match="share no prompts"):
        compare({"x": (1, 1)}, {"y": (1, 1)}, DRAWS, seed=0)


# --- pool_results ----------------------------------------------------------------------------------


def test_pool_results_of_one_result_is_its_per_prompt(result):
    assert pool_results([(DATA, result)], "chat", 3, 0.0) == as_table(T0)


def test_pool_results_refuses_several_results_at_t0(result):
    other = with_seed(result, 1000)
    with pytest.raises(SystemExit, match="T = 0 every run decodes the same greedy output"):
        pool_results([(DATA, result), (Path("other.json"), other)], "chat", 3, 0.0)


def test_pool_results_sums_runs_with_other_seeds(result):
    # Runs seeded 1000 apart hold other draws; here they carry the same numbers, so every sum doubles.
    runs = [(DATA, result), (Path("s1000.json"), with_seed(result, 1000, samples=None))]
    pooled = pool_results(runs, "chat", 3, 1.0)
    assert pooled == {
        method: {p: (2 * t, 2 * b) for p, (t, b) in zip(PROMPTS, rows, strict=True)}
        for method, rows in T1.items()
    }


@pytest.mark.parametrize(
    ("seed", "samples", "clash"),
    [(0, 1, 0), (1000, 3, 1000), (2000, 1, 2000)],  # the first run is seed 0 with --samples 3
)
def test_pool_results_refuses_overlapping_seeds(result, seed, samples, clash):
    first = with_seed(result, 0, samples=3)  # samples seeded from 0, 1000 and 2000
    runs = [(Path("a.json"), first), (Path("b.json"), with_seed(result, seed, samples))]
    with pytest.raises(SystemExit, match=rf"a\.json and b\.json both hold the samples seeded from {clash}:"):
        pool_results(runs, "chat", 3, 1.0)


def test_pool_results_accepts_seeds_past_the_other_runs_samples(result):
    runs = [(Path("a.json"), with_seed(result, 0, samples=3)), (Path("b.json"), with_seed(result, 3000))]
    assert set(pool_results(runs, "chat", 3, 1.0)) == set(T1)


@pytest.mark.parametrize(
    ("prompt_set", "k", "temperature", "asked"),
    [
        ("code", 3, 0.0, "set 'code', k=3, T=0"),
        ("chat", 4, 0.0, "set 'chat', k=4, T=0"),
        ("chat", 3, 0.5, "set 'chat', k=3, T=0.5"),
    ],
)
def test_pool_results_names_a_missing_cell_and_the_cells_held(result, prompt_set, k, temperature, asked):
    with pytest.raises(SystemExit) as info:
        pool_results([(DATA, result)], prompt_set, k, temperature)
    assert str(info.value) == f"no generations for {asked} in {DATA}; it holds: chat k=3 T=0, chat k=3 T=1"


# --- main, end to end ------------------------------------------------------------------------------


def run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def rows(markdown: str) -> list[list[str]]:
    """The cells of every table row but the header separators."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in markdown.splitlines()
        if line.startswith("|") and not line.startswith("|---")
    ]


def test_main_prints_the_taus_and_every_pair(raw):
    out = run(DATA, "--set", "chat", "--k", "3", "--temperature", "0", "--draws", DRAWS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"# Paired τ comparison — {DATA}, set chat, k = 3, T = 0\n")
    assert "samples of each prompt pooled" not in out.stdout
    table = rows(out.stdout)
    methods = ["hf-assisted:pretrained", "pretrained", "sd2"]  # in the file's order
    assert table[0] == ["method", "prompts", "τ"]
    assert table[1:4] == [[m, "6", f"{TAU_T0[m]:.3f}"] for m in methods]
    assert [r[2] for r in table[1:4]] == ["1.435", "1.415", "1.569"]
    assert table[4][2] == f"95 % bootstrap interval ({DRAWS} draws)"
    cells = per_prompt(raw, "chat", 3, 0.0)
    pairs = [
        ("hf-assisted:pretrained", "pretrained"),
        ("hf-assisted:pretrained", "sd2"),
        ("pretrained", "sd2"),
    ]
    assert len(table) == 5 + len(pairs)
    for (a, b), row in zip(pairs, table[5:], strict=True):
        r = compare(cells[a], cells[b], DRAWS, seed=0)
        assert row == [
            f"{a} − {b}",
            f"{TAU_T0[a] - TAU_T0[b]:+.3f}",
            f"[{r['low']:+.3f}, {r['high']:+.3f}]",
            f"{r['a_wins']} / {r['b_wins']} of 6",
        ]
    assert table[7][1] == "-0.154" and table[7][3] == "1 / 5 of 6"


def test_main_pools_runs_with_other_seeds_at_t1(raw, tmp_path):
    other = tmp_path / "s1000.json"
    other.write_text(json.dumps(with_seed(raw, 1000)))
    out = run(DATA, other, "--set", "chat", "--k", "3", "--temperature", "1", "--draws", DRAWS)
    assert out.returncode == 0, out.stderr
    assert "2 samples of each prompt pooled (2 result(s))." in out.stdout
    table = rows(out.stdout)
    # Both runs carry the same numbers, so the pooled τ are the single run's.
    assert table[1:4] == [
        [m, "6", f"{TAU_T1[m]:.3f}"] for m in ["hf-assisted:pretrained", "pretrained", "sd2"]
    ]

    out = run(DATA, DATA, "--k", "3", "--temperature", "1", "--draws", DRAWS)
    assert out.returncode == 1
    assert "both hold the samples seeded from 0" in out.stderr


def test_main_earlier_result_joins_as_labelled_methods(raw, tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(raw))
    out = run(DATA, "--k", "3", "--earlier", earlier, "--earlier-label", "gen0", "--draws", DRAWS)
    assert out.returncode == 0, out.stderr
    table = {row[0]: row[1:] for row in rows(out.stdout)}
    assert table["sd2@gen0"] == ["6", f"{TAU_T0['sd2']:.3f}"]
    # The same generations on both sides: no difference on any resample, no prompt either way.
    assert table["sd2 − sd2@gen0"] == ["+0.000", "[+0.000, +0.000]", "0 / 0 of 6"]
    assert len([name for name in table if " − " in name and name != "A − B"]) == 15  # 6 methods, every pair


def test_main_missing_cell_exits_with_a_message_naming_it():
    out = run(DATA, "--set", "code", "--k", "3", "--temperature", "0", "--draws", DRAWS)
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.strip() == (
        f"no generations for set 'code', k=3, T=0 in {DATA}; it holds: chat k=3 T=0, chat k=3 T=1"
    )

    out = run(DATA, "--k", "4", "--draws", DRAWS)  # the defaults: set chat, T = 0
    assert out.returncode == 1
    assert "no generations for set 'chat', k=4, T=0 in" in out.stderr


def test_main_missing_cell_in_earlier_result_names_it(raw, tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(
        json.dumps({**raw, "generations": [g for g in raw["generations"] if g["temperature"]]})
    )
    out = run(DATA, "--k", "3", "--earlier", earlier, "--draws", DRAWS)
    assert out.returncode == 1
    assert (
        out.stderr.strip() == f"no generations for set 'chat', k=3, T=0 in {earlier}; it holds: chat k=3 T=1"
    )
