"""The direct draft step (sd2.direct_step) and its fused products (sd2.fused_linear): the eager step's
logits bit for bit — in fp32 and bf16, on the invariant and the stock kernels, steered or not, over a
reduced vocabulary or the full one, across rollbacks — so it drafts the same blocks and keeps decoding
exact; drafters it does not take run eagerly."""

import copy

import pytest
import torch
from torch import nn

from sd2.config import DecodeConfig
from sd2.decoding import SpeculativeDecoder, verifier_decode
from sd2.direct_step import DirectDraftStep, supports_direct_step
from sd2.draft_step import EagerDraftStep, resolve_draft_step
from sd2.draft_vocab import DraftVocab, reduced_head_for
from sd2.engine import Engine, GenerateRequest
from sd2.fused_linear import FusedLinears, fusable, fused
from sd2.invariant import make_batch_invariant, make_linear_invariant, packed_available
from sd2.proposer import Proposer
from tests.tiny import tiny_llama, tiny_mistral

PROMPT = [1, 40, 17, 99, 3, 250, 7, 8]
NO_STOP = frozenset()
PACKED_HERE = packed_available(torch.bfloat16, torch.device("cpu"))


def _drafter(dtype: torch.dtype, invariant: bool) -> nn.Module:
    model = tiny_llama(hidden=64, layers=2, ffn=128, seed=3, heads=4, kv_heads=2).to(dtype)
    return make_batch_invariant(model) if invariant else model


def _biases(model: nn.Module, scale: float) -> dict[int, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    width = model.config.intermediate_size
    return {
        layer: (scale * torch.randn(2, width, generator=generator)).to(model.dtype)
        for layer in range(model.config.num_hidden_layers)
    }


def _session(step, biases) -> list[torch.Tensor]:
    """A request's draft calls: a prompt, blocks of a 2-token first step then 1-token steps, some
    steered, each followed by a rollback."""
    out = []
    with torch.inference_mode():
        step.start(PROMPT, room=64)
        committed = len(PROMPT)
        for block in range(6):
            with step.steering(biases if block % 2 else {}):
                out.append(step.logits([11 + block, 12 + block]))
                for j in range(3):
                    out.append(step.logits([20 + 3 * block + j]))
            committed += 1 + block % 3
            step.crop_to(committed)
            out.append(step.logits([30 + block]))  # the block's bonus token, one alone
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("invariant", [True, False])
@pytest.mark.parametrize("reduced", [False, True])
def test_the_direct_step_computes_the_eager_logits_bit_for_bit(dtype, invariant, reduced):
    drafter = _drafter(dtype, invariant)
    head = reduced_head_for(drafter, DraftVocab(tuple(range(0, 320, 3)))) if reduced else None
    biases = _biases(drafter, 0.5)
    eager = _session(EagerDraftStep(drafter, head), biases)
    direct_step = DirectDraftStep(drafter, head)
    direct = _session(direct_step, biases)
    assert len(direct) == len(eager) == 6 * 5
    for i, (a, b) in enumerate(zip(direct, eager, strict=True)):
        assert torch.equal(a, b), f"call {i}: max |Δ| {(a.float() - b.float()).abs().max()}"
    unsteered = _session(EagerDraftStep(drafter, head), {})
    assert torch.equal(eager[1], unsteered[1]) and not torch.equal(eager[7], unsteered[7])  # block 1 steered
    if dtype == torch.bfloat16 and invariant and PACKED_HERE:  # the fused products ran
        assert isinstance(direct_step._qkv[0], FusedLinears) and isinstance(
            direct_step._gate_up[0], FusedLinears
        )
        assert DirectDraftStep(drafter, head)._qkv[0] is direct_step._qkv[0]  # packed once, not per request


def test_the_direct_step_drafts_the_eager_blocks_and_keeps_greedy_identity(verifier, drafters):
    drafter, head = drafters["steered"]
    config = DecodeConfig(k=4, max_new_tokens=40)
    expected = [t.token_id for b in verifier_decode(verifier, PROMPT, config, NO_STOP) for t in b.emitted]

    def blocks(direct: bool):
        proposer = Proposer(drafter, head, direct=direct)
        decoder = SpeculativeDecoder(verifier, proposer, config, NO_STOP)
        assert type(decoder.draft_step) is (DirectDraftStep if direct else EagerDraftStep)
        return [
            (
                [t.token_id for t in b.drafts],
                [t.draft_prob for t in b.drafts],
                [t.token_id for t in b.emitted],
            )
            for b in decoder.run(PROMPT)
        ]

    direct, eager = blocks(True), blocks(False)
    assert direct == eager  # the same drafts, probabilities and tokens, exactly
    assert [t for _, _, emitted in direct for t in emitted] == expected


@pytest.mark.skipif(not PACKED_HERE, reason="oneDNN's packed bf16 product is not available here")
def test_fused_linears_equal_their_parts_and_follow_weight_changes():
    torch.manual_seed(0)
    linears = _invariant(
        nn.Linear(64, 64, bias=False), nn.Linear(64, 32, bias=False), nn.Linear(64, 32, bias=False)
    )
    together = fused(linears)
    assert isinstance(together, FusedLinears)
    x = torch.randn(1, 1, 64).to(torch.bfloat16)
    with torch.inference_mode():
        for part, alone in zip(together(x), linears, strict=True):
            assert torch.equal(part, alone.forward(x)) and part.is_contiguous()
    with torch.no_grad():
        linears[1].weight.mul_(-2)  # written in place: the stacked copy is packed again
    with torch.inference_mode():
        assert torch.equal(together(x)[1], linears[1].forward(x))
    assert fusable((64, 32, 32), 64, torch.bfloat16, torch.device("cpu"))


def test_linears_that_cannot_fuse_stay_apart():
    plain = [nn.Linear(16, 16, bias=False), nn.Linear(16, 8, bias=False)]
    assert fused(plain) is None  # not invariant (stock kernels)
    fp32 = [make_linear_invariant(linear) for linear in copy.deepcopy(plain)]
    assert fused(fp32) is None  # fp32: no packed product
    assert fused(_invariant(nn.Linear(16, 16), nn.Linear(16, 8))) is None  # biases
    assert fused(_invariant(nn.Linear(16, 16, bias=False), nn.Linear(32, 8, bias=False))) is None  # widths


def _invariant(*linears: nn.Linear) -> list[nn.Linear]:
    """bf16 linears on the invariant kernels (packed where oneDNN has it)."""
    return [make_linear_invariant(linear.to(torch.bfloat16)) for linear in linears]


def test_a_drafter_of_another_shape_runs_eagerly_and_the_step_names_why(tiny_pair_dir):
    mistral = tiny_mistral(sliding_window=8)
    assert not supports_direct_step(mistral)
    assert supports_direct_step(tiny_llama(hidden=32, layers=1, ffn=64))
    with pytest.raises(ValueError, match=r"model type is 'mistral'.*--draft-step eager"):
        DirectDraftStep(mistral)
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = Engine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu", draft_step="direct")
    assert engine.draft_step_kind == "direct"
    assert type(engine.proposer("tiny").new_step()) is DirectDraftStep
    assert type(engine.proposer("self").new_step()) is EagerDraftStep  # the verifier drafting for itself
    engine.drafters["tiny"].model = mistral  # a drafter it does not take
    assert type(engine.proposer("tiny").new_step()) is EagerDraftStep


def test_direct_is_the_cpu_default_and_an_engine_decodes_exactly_with_it(tiny_pair_dir, monkeypatch):
    monkeypatch.delenv("SD2_DRAFT_STEP", raising=False)
    assert resolve_draft_step(None, torch.device("cpu")) == "direct"
    verifier_dir, drafter_dir = tiny_pair_dir
    engine = Engine.load(str(verifier_dir), {"tiny": str(drafter_dir)}, device="cpu")
    assert engine.draft_step_kind == "direct"
    for prompt in ("hello there", "a longer prompt than the first one"):
        for temperature in (0.0, 1.0):
            decode = DecodeConfig(k=3, max_new_tokens=16, temperature=temperature, seed=4)
            results = [
                engine.generate(GenerateRequest(prompt=prompt, method=method, decode=decode)).token_ids
                for method in ("tiny", "verifier")
            ]
            if temperature == 0:
                assert results[0] == results[1]
            batched = engine.generate_batch(
                [GenerateRequest(prompt=prompt, method="tiny", decode=decode)] * 2
            )  # a batch's rows draft on the same step kind, and equal their solo runs
            assert [r.token_ids for r in batched] == [results[0]] * 2


def test_a_drafter_with_forward_hooks_runs_eagerly_so_its_hooks_fire():
    drafter = _drafter(torch.float32, invariant=True)
    assert supports_direct_step(drafter)
    calls = []
    handle = drafter.model.layers[1].mlp.register_forward_hook(lambda *_: calls.append(1))
    try:
        assert not supports_direct_step(drafter)
        with pytest.raises(ValueError, match="forward hooks"):
            DirectDraftStep(drafter)
        decoder = SpeculativeDecoder(drafter, Proposer(drafter, direct=True), DecodeConfig(k=2), NO_STOP)
        assert type(decoder.draft_step) is EagerDraftStep  # the Proposer falls back
    finally:
        handle.remove()
    assert supports_direct_step(drafter)
