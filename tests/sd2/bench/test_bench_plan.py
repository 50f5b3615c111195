"""The run plan: method resolution, cells, --quick / --k-sweep and explicit options."""

import argparse

import pytest

from sd2.bench.command import add_arguments, build_plan
from sd2.bench.harness import decode_config
from sd2.bench.plan import K_SWEEP, K_SWEEP_QUICK, BenchPlan, resolve_methods
from sd2.config import DECODE_DEFAULTS


def names(methods):
    return [(m.name, m.runner, m.drafter) for m in methods]


def test_default_methods_without_and_with_drafters():
    assert names(resolve_methods(None, [])) == [
        ("verifier", "ours", None),
        ("hf-generate", "hf-generate", None),
        ("self", "ours", "self"),
    ]
    with_drafters = names(resolve_methods(None, ["sd2", "pretrained"]))
    assert ("hf-assisted:pretrained", "hf-assisted", "pretrained") in with_drafters  # prefers "pretrained"
    assert ("sd2", "ours", "sd2") in with_drafters and ("pretrained", "ours", "pretrained") in with_drafters


def test_hf_assisted_variants_and_errors():
    assert names(resolve_methods(["hf-assisted"], ["a", "b"])) == [("hf-assisted:a", "hf-assisted", "a")]
    assert names(resolve_methods(["hf-assisted:self"], [])) == [("hf-assisted:self", "hf-assisted", "self")]
    with pytest.raises(ValueError, match="hf-assisted needs a drafter"):
        resolve_methods(["hf-assisted"], [])
    with pytest.raises(ValueError, match="no drafter named 'x'"):
        resolve_methods(["hf-assisted:x"], ["a"])
    with pytest.raises(ValueError, match="unknown method 'medusa'"):
        resolve_methods(["medusa"], ["a"])


def test_cells_run_baselines_once_and_speculative_methods_at_every_k():
    plan = BenchPlan(methods=resolve_methods(["verifier", "self", "hf-generate"], []), ks=(2, 4))
    assert [c.label for c in plan.cells()] == ["verifier", "self (k=2)", "self (k=4)", "hf-generate"]
    assert plan.context_k == 4


@pytest.mark.parametrize(
    "field, value",
    [
        ("repeats", 0),
        ("samples", 0),
        ("ks", ()),
        ("ks", (0,)),
        ("ks", ("eight",)),
        ("temperatures", (-1.0,)),
        ("draft_threshold", -0.1),
        ("draft_threshold", 1.5),
    ],
)
def test_plan_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field.rstrip("s") if field != "ks" else "k must"):
        BenchPlan(methods=resolve_methods(None, []), **{field: value})


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_quick_and_explicit_options():
    quick = build_plan(parse("--quick"), [])
    assert (quick.max_new_tokens, quick.repeats, quick.max_prompts, quick.quick) == (32, 2, 2, True)
    explicit = build_plan(
        parse("--quick", "--max-new-tokens", "16", "--repeats", "5", "--max-prompts", "0"), []
    )
    assert (explicit.max_new_tokens, explicit.repeats, explicit.max_prompts) == (16, 5, None)
    full = build_plan(
        parse("--methods", "verifier,self", "hf-generate", "--k", "3", "5", "--temperatures", "0", "1"), []
    )
    assert [m.name for m in full.methods] == ["verifier", "self", "hf-generate"]
    assert (full.ks, full.temperatures, full.max_new_tokens, full.repeats) == ((3, 5), (0.0, 1.0), 128, 3)


def test_plan_decode_settings_default_to_decode_defaults():
    """One source: a plan's k, temperature, length, seed and filters are DecodeConfig's defaults."""
    plan = build_plan(parse(), [])
    assert plan.ks == (DECODE_DEFAULTS.k,) and plan.temperatures == (DECODE_DEFAULTS.temperature,)
    assert (plan.max_new_tokens, plan.seed, plan.top_k, plan.top_p, plan.draft_threshold) == (
        DECODE_DEFAULTS.max_new_tokens,
        DECODE_DEFAULTS.seed,
        DECODE_DEFAULTS.top_k,
        DECODE_DEFAULTS.top_p,
        DECODE_DEFAULTS.draft_threshold,
    )


def test_a_draft_threshold_reaches_every_generation_of_the_plan():
    plan = build_plan(parse("--draft-threshold", "0.3", "--temperatures", "0", "1"), [])
    assert plan.draft_threshold == 0.3
    cell = plan.cells()[0]
    assert all(decode_config(plan, cell, t, 0, 0).draft_threshold == 0.3 for t in plan.temperatures)


def test_k_auto_is_the_default_and_mixes_with_fixed_k():
    plan = build_plan(parse(), [])
    assert plan.ks == ("auto",) and plan.context_k == "auto" and plan.forward_ks == tuple(range(1, 9))
    mixed = build_plan(parse("--k", "auto", "12"), [])
    assert mixed.ks == ("auto", 12) and mixed.context_k == "auto"  # auto drafts up to 16
    assert mixed.forward_ks == (*range(1, 9), 12)
    assert build_plan(parse("--k", "3", "5"), []).forward_ks == (3, 5)
    with pytest.raises(SystemExit):
        parse("--k", "eight")


def test_k_sweep():
    assert build_plan(parse("--k-sweep"), []).ks == K_SWEEP
    assert build_plan(parse("--k-sweep", "--quick"), []).ks == K_SWEEP_QUICK
    assert build_plan(parse("--k-sweep", "--k", "2"), []).ks == (2,)


def test_samples_seeds_and_the_greedy_single_sample():
    plan = build_plan(parse("--samples", "3", "--seed", "7", "--temperatures", "0", "1"), [])
    assert (plan.samples, plan.samples_at(0.0), plan.samples_at(1.0)) == (3, 1, 3)
    # sample j of prompt i: the seed sample 0 of prompt i has in a run with --seed 7 + 1000·j
    assert [plan.generation_seed(4, j) for j in range(3)] == [11, 1011, 2011]
    assert build_plan(parse(), []).samples == 1
