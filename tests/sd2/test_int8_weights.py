"""Int8 drafter weights (sd2.int8_weights): a rounding of each weight row within half a step; rows of a
product independent of the call's row count (so batched drafts equal solo ones); parameters, state
dicts and training copies untouched; the direct step still the eager step bit for bit; and the output
still exactly the verifier's — greedy identical, sampled by the verifier's law."""

import copy
from collections import Counter
from dataclasses import replace

import pytest
import torch
from torch import nn

from sd2.cli import main
from sd2.config import DecodeConfig
from sd2.decoding import SpeculativeDecoder, verifier_decode
from sd2.direct_step import DirectDraftStep
from sd2.draft_step import EagerDraftStep
from sd2.draft_vocab import DraftVocab, reduced_head_for
from sd2.engine import Engine, GenerateRequest
from sd2.int8_weights import (
    Int8Fused,
    Int8Linear,
    int8_available,
    int8_fusable,
    int8_invariant,
    quantize,
    resolve_draft_weights,
    use_int8_weights,
    uses_int8_weights,
)
from sd2.invariant import make_batch_invariant, make_stock
from sd2.proposer import Proposer
from tests.sd2.test_decoding import SMALL_PROMPT, _bound, _exact_law, _ids, _tv
from tests.tiny import peaky_llama, tiny_llama

CPU = torch.device("cpu")
HERE = int8_available(torch.bfloat16, CPU)
# the tiny drafter's weights [out, in] (q, k and v, o, gate and up, down, the reduced head) and fused sets
TINY_SHAPES = ((64, 64), (32, 64), (128, 64), (64, 128), (107, 64))
PROBED = (
    HERE
    and all(int8_invariant(shape, torch.bfloat16, CPU) for shape in TINY_SHAPES)
    and all(int8_fusable(sizes, 64, torch.bfloat16, CPU) for sizes in ((64, 32, 32), (128, 128)))
)
# where the probe rejects a shape the engine keeps full weights for it (tested by the probe's own use)
needs_int8 = pytest.mark.skipif(
    not PROBED, reason="torch._weight_int8pack_mm is missing here, or its rows depend on the row count"
)
PROMPT = [1, 40, 17, 99, 3, 250, 7, 8]
NO_STOP = frozenset()


def _drafter(seed: int = 3) -> nn.Module:
    return make_batch_invariant(
        tiny_llama(hidden=64, layers=2, ffn=128, seed=seed, heads=4, kv_heads=2).bfloat16()
    )


def test_quantize_rounds_each_row_within_half_a_step_and_negation_to_negation():
    weight = torch.randn(24, 40, generator=torch.Generator().manual_seed(0)).bfloat16()
    weight[5] = 0  # a zero row keeps scale 1, q 0
    q, scales = quantize(weight)
    assert q.dtype == torch.int8 and scales.dtype == torch.bfloat16 and scales.shape == (24,)
    assert int(q.abs().max()) == 127 and int(q[5].abs().max()) == 0 and float(scales[5]) == 1.0
    error = (weight.float() - q.float() * scales.float()[:, None]).abs()
    assert bool((error <= scales.float()[:, None] * 0.5 * (1 + 1e-2)).all())
    negated, negated_scales = quantize(-weight)
    assert torch.equal(negated, -q) and torch.equal(negated_scales, scales)


@needs_int8
def test_a_product_row_does_not_depend_on_how_many_rows_the_call_holds():
    drafter = _drafter()
    head = reduced_head_for(drafter, DraftVocab(tuple(range(0, 320, 3))))
    switched = use_int8_weights(drafter, head)
    linears = [m for m in drafter.modules() if type(m) is Int8Linear]
    assert switched == len(linears) + 1 and len(linears) == 2 * 7  # q k v o gate up down per layer, + head
    assert type(drafter.lm_head) is not Int8Linear  # the reduced head serves instead
    rows = torch.randn(9, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    with torch.inference_mode():
        for module in (linears[0], head):
            together = module(rows)
            for i in range(9):
                assert torch.equal(module(rows[i : i + 1]), together[i : i + 1])
            assert int8_invariant((module.weight.shape[0], 64), torch.bfloat16, CPU)


@needs_int8
def test_int8_copies_leave_parameters_and_training_copies_as_they_are():
    drafter = _drafter()
    reference = copy.deepcopy(drafter)
    state = {k: v.clone() for k, v in drafter.state_dict().items()}
    use_int8_weights(drafter)
    assert uses_int8_weights(drafter) and not uses_int8_weights(reference)
    assert all(torch.equal(v, state[k]) for k, v in drafter.state_dict().items())
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        full, int8 = reference(ids).logits.float(), drafter(ids).logits.float()
    assert not torch.equal(full, int8)  # the int8 copies ran
    assert float((full - int8).abs().max()) < 0.1 * float(full.abs().max())  # close: a rounding, no more
    trained = make_stock(copy.deepcopy(drafter))  # as sd2.train.fine_tune copies an engine's drafter
    assert not uses_int8_weights(trained)
    with torch.inference_mode():
        assert torch.equal(trained(ids).logits, make_stock(reference)(ids).logits)
    linear = next(m for m in drafter.modules() if type(m) is Int8Linear)
    x = torch.randn(1, linear.in_features).bfloat16()
    with torch.inference_mode():
        before = linear(x)
    with torch.no_grad():
        linear.weight.mul_(-1)  # written in place: quantised again
    with torch.inference_mode():
        assert torch.equal(linear(x), -before)


@needs_int8
def test_the_direct_step_with_int8_weights_computes_the_eager_logits_bit_for_bit():
    drafter = _drafter()
    head = reduced_head_for(drafter, DraftVocab(tuple(range(0, 320, 3))))
    use_int8_weights(drafter, head)
    generator = torch.Generator().manual_seed(5)
    biases = {layer: (0.5 * torch.randn(2, 128, generator=generator)).bfloat16() for layer in range(2)}
    direct_step = DirectDraftStep(drafter, head)
    assert isinstance(direct_step._qkv[0], Int8Fused) and isinstance(direct_step._gate_up[0], Int8Fused)
    assert int8_fusable((64, 32, 32), 64, torch.bfloat16, CPU)
    for step_biases in ({}, biases):
        eager_step = EagerDraftStep(drafter, head)
        with torch.inference_mode():
            for step in (eager_step, direct_step):
                step.start(PROMPT, room=16)
            for token in (11, 12, 13, 14):
                with eager_step.steering(step_biases), direct_step.steering(step_biases):
                    assert torch.equal(direct_step.logits([token]), eager_step.logits([token]))


@needs_int8
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_with_int8_drafter_weights_is_the_verifiers(k):
    verifier = make_batch_invariant(tiny_llama(hidden=64, layers=4, ffn=128, seed=0).bfloat16())
    drafter = copy.deepcopy(verifier)  # the verifier's own weights in int8: most drafts accepted, not all
    use_int8_weights(drafter)
    config = DecodeConfig(k=k, max_new_tokens=40)
    expected = [t.token_id for b in verifier_decode(verifier, PROMPT, config, NO_STOP) for t in b.emitted]
    decoder = SpeculativeDecoder(verifier, Proposer(drafter, None, direct=True), config, NO_STOP)
    blocks = list(decoder.run(PROMPT))
    assert [t.token_id for b in blocks for t in b.emitted] == expected
    assert sum(b.n_accepted for b in blocks) > 0  # the int8 drafter's drafts were judged and kept


@needs_int8
@pytest.mark.slow
@pytest.mark.statistical
def test_sampled_output_with_int8_drafter_weights_follows_the_verifier_law():
    verifier = peaky_llama(8, 0, hidden=16, layers=2).bfloat16()
    drafter = peaky_llama(8, 1, hidden=16, layers=1).bfloat16()
    assert use_int8_weights(drafter) > 0
    exact, n = _exact_law(verifier).float(), 5_000
    counts, accepted = torch.zeros(8, 8), Counter()
    for seed in range(n):
        config = DecodeConfig(k=2, max_new_tokens=3, temperature=1.0, seed=seed)
        blocks = list(
            SpeculativeDecoder(verifier, Proposer(drafter, None), config, NO_STOP).run(SMALL_PROMPT)
        )
        ids = _ids(blocks)
        counts[ids[1], ids[2]] += 1
        accepted.update(b.n_accepted for b in blocks if b.k > 0)
    assert _tv(counts / n, exact) < _bound(exact, n)
    assert len(accepted) > 1  # blocks accepted different numbers of drafts: the rule did the work


def test_resolve_draft_weights_picks_int8_only_where_it_runs_and_names_bad_values():
    env: dict[str, str] = {}
    auto = resolve_draft_weights(None, torch.bfloat16, CPU, "direct", env)
    assert auto == ("int8" if HERE else "full")
    assert resolve_draft_weights(None, torch.float32, CPU, "direct", env) == "full"
    assert resolve_draft_weights(None, torch.bfloat16, CPU, "compiled", env) == "full"
    assert resolve_draft_weights(None, torch.bfloat16, CPU, "direct", {"SD2_DRAFT_WEIGHTS": "FULL"}) == "full"
    assert (
        resolve_draft_weights("full", torch.bfloat16, CPU, "direct", {"SD2_DRAFT_WEIGHTS": "int8"}) == "full"
    )
    with pytest.raises(ValueError, match="--draft-weights must be one of auto, int8, full"):
        resolve_draft_weights(None, torch.bfloat16, CPU, "direct", {"SD2_DRAFT_WEIGHTS": "int4"})
    with pytest.raises(ValueError, match=r"need a bf16 model on a CPU.*cpu/float32"):
        resolve_draft_weights("int8", torch.float32, CPU, "direct", env)
    with pytest.raises(ValueError, match="compiled draft step"):
        resolve_draft_weights("int8", torch.bfloat16, CPU, "compiled", env)
    with pytest.raises(ValueError, match="bf16 drafter on a CPU"):
        use_int8_weights(tiny_llama(hidden=32, layers=1, ffn=64, seed=0))  # fp32


@needs_int8
def test_an_engine_drafts_on_int8_weights_and_stays_exact_alone_and_batched(tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    engines = {
        weights: Engine.load(
            str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu", dtype="bf16", draft_weights=weights
        )
        for weights in ("int8", "full")
    }
    assert {w: e.draft_weights for w, e in engines.items()} == {"int8": "int8", "full": "full"}
    assert uses_int8_weights(engines["int8"].drafters["tiny"].model)
    assert not uses_int8_weights(engines["full"].drafters["tiny"].model)
    engine = engines["int8"]
    for temperature in (0.0, 1.0):
        decode = DecodeConfig(k=3, max_new_tokens=16, temperature=temperature, seed=4)
        solo = {
            method: engine.generate(GenerateRequest(prompt="hello there", method=method, decode=decode))
            for method in ("tiny", "verifier")
        }
        if temperature == 0:
            assert solo["tiny"].token_ids == solo["verifier"].token_ids
        batched = engine.generate_batch(
            [GenerateRequest(prompt="hello there", method="tiny", decode=decode)] * 2
        )
        assert [r.token_ids for r in batched] == [solo["tiny"].token_ids] * 2  # rows draft as solo ones do
    fp32_model = copy.deepcopy(engines["full"].drafters["tiny"].model).float()
    fp32 = replace(engine.drafters["tiny"], name="tiny-fp32", model=fp32_model, draft_head=None)
    engine.add_drafter(fp32)  # a drafter in another precision keeps its own weights, and decodes exactly
    assert not uses_int8_weights(engine.drafters["tiny-fp32"].model)
    decode = DecodeConfig(k=3, max_new_tokens=16)
    assert engine.generate(
        GenerateRequest(prompt="hello there", method="tiny-fp32", decode=decode)
    ).token_ids == (
        engine.generate(GenerateRequest(prompt="hello there", method="verifier", decode=decode)).token_ids
    )


def test_the_cli_names_a_draft_weights_choice_that_cannot_run(tiny_pair_dir, capsys):
    verifier_dir, _ = tiny_pair_dir
    argv = ["generate", "--verifier", str(verifier_dir), "--dtype", "fp32", "--draft-weights", "int8"]
    assert main([*argv, "--prompt", "hi", "--max-new-tokens", "1"]) == 2
    assert "int8 drafter weights need a bf16 model on a CPU" in capsys.readouterr().err
