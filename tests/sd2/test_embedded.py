"""Integration on the real embedded verifier, SmolLM2-135M-Instruct (converted once into SD2_HOME)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sd2.config import DecodeConfig
from sd2.direct_step import DirectDraftStep
from sd2.draft_step import EagerDraftStep
from sd2.engine import Engine, GenerateRequest
from sd2.models import Drafter
from sd2.steering import new_head_for

pytestmark = pytest.mark.slow
PROMPT = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def engine():
    return Engine.load()  # the embedded default


def _random_steered_drafter(verifier) -> Drafter:
    """A 2-layer random drafter with the verifier's vocabulary and a non-zero SD² head."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=verifier.config.vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        )
    ).eval()
    head = new_head_for(verifier, model)
    with torch.no_grad():
        head.w_s.normal_(0, 0.01)
    return Drafter("random-sd2", model, head, path="<memory>")


def test_embedded_pair_loads_as_documented(engine):
    assert engine.verifier.config.num_hidden_layers == 30
    assert engine.verifier.config.hidden_size == 576
    assert engine.tokenizer.decode([2]) == "<|im_end|>" and 2 in engine.stop_ids


def test_speculative_greedy_equals_verifier_greedy_on_a_real_prompt(engine):
    engine.add_drafter(_random_steered_drafter(engine.verifier))
    decode = DecodeConfig(k=4, max_new_tokens=24)
    reference = engine.generate(GenerateRequest(prompt=PROMPT, decode=decode))
    assert "Paris" in reference.text
    for method in ("self", "random-sd2"):
        result = engine.generate(GenerateRequest(prompt=PROMPT, method=method, decode=decode))
        assert result.token_ids == reference.token_ids, method
    assert engine.generate(GenerateRequest(prompt=PROMPT, method="self", decode=decode)).metrics.tau == 5


def test_our_verifier_loop_matches_transformers_generate(engine):
    ids = engine.encode(GenerateRequest(prompt=PROMPT))
    ours = engine.generate(GenerateRequest(prompt=PROMPT, decode=DecodeConfig(max_new_tokens=16)))
    with torch.inference_mode():
        hf = engine.verifier.generate(
            torch.tensor([ids]),
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=sorted(engine.stop_ids),
            pad_token_id=2,
        )
    assert ours.token_ids == hf[0, len(ids) :].tolist()[: len(ours.token_ids)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_shipped_sd2_counterfactual_keeps_the_output_and_records_every_block(engine, temperature):
    """On the real pair (the shipped sd2 drafter, reduced draft vocabulary): the same tokens with and
    without the counterfactual, a record in every drafted block, texts filled in for the UI."""
    decode = DecodeConfig(k=4, temperature=temperature, seed=11, max_new_tokens=24)
    request = GenerateRequest(prompt=PROMPT, method="sd2", decode=decode)
    plain = engine.generate(request)
    probed = engine.generate(GenerateRequest(prompt=PROMPT, method="sd2", decode=decode, counterfactual=True))
    assert probed.token_ids == plain.token_ids
    drafted = [b for b in probed.blocks if b.k > 0]
    assert drafted and all(b.counterfactual is not None for b in drafted)
    assert all(t.text for b in drafted for t in b.counterfactual.drafts)
    assert all(c.text for b in drafted for t in b.drafts for c in t.target_top)
    gain = probed.metrics.steering_gain
    assert gain.n_blocks == len(drafted) and gain.won + gain.tied + gain.lost == gain.n_blocks
    assert plain.metrics.steering_gain is None and probed.metrics.counterfactual_ms > 0


def test_the_direct_step_of_every_shipped_drafter_computes_the_eager_logits(engine):
    """The CPU default step (sd2.direct_step) on the real drafters, steered by their own heads' shapes:
    each call's logits equal the eager step's bit for bit."""
    assert engine.draft_step_kind == "direct"
    prompt = engine.tokenizer("The quick brown fox jumps over the lazy dog.")["input_ids"]
    for drafter in engine.loaded_drafters():
        generator = torch.Generator().manual_seed(0)
        biases = {
            layer: torch.randn(2, mlp.up_proj.out_features, generator=generator).to(drafter.model.dtype)
            for layer, mlp in enumerate(layer.mlp for layer in drafter.model.get_decoder().layers)
        }
        steps = [
            EagerDraftStep(drafter.model, drafter.draft_head),
            DirectDraftStep(drafter.model, drafter.draft_head),
        ]
        calls = []
        with torch.inference_mode():
            for step in steps:
                step.start(prompt, room=32)
                logits = []
                for block in range(3):
                    with step.steering(biases if block else {}):
                        logits.append(step.logits(prompt[block : block + 2]))
                        logits += [step.logits([token]) for token in prompt[block + 2 : block + 5]]
                    step.crop_to(len(prompt) + block + 1)
                calls.append(logits)
        assert all(torch.equal(a, b) for a, b in zip(*calls, strict=True)), drafter.name
