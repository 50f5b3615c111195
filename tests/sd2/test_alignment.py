"""Pins the steering alignment training relies on: draft step j of a block is steered by the
verifier state j positions back (the block's anchor), and the anchor of the next block is the
last accepted position. Checked by recomputing every judged draft probability teacher-forced."""

import pytest
import torch

from sd2.config import DecodeConfig
from sd2.decoding import SpeculativeDecoder
from sd2.proposer import Proposer
from sd2.steering import anchored_biases, captured_states, new_head_for, stack_features, steered
from tests.tiny import tiny_llama

PROMPT = [1, 40, 17, 99, 3, 250, 7]


def _anchors_from_trace(blocks, prompt_len: int, n_tokens: int, shift: int = 0) -> torch.Tensor:
    """The anchor the engine should use at each input position (−1: unsteered prompt).

    Block b with anchor a feeds positions a+1 .. a+k (offsets 1..k); if it accepts all k drafts,
    d_k at a+k+1 is fed in the next block but keeps anchor a. The next anchor is a + n + 1.
    `shift` moves every anchor, to show the check tells a wrong alignment apart.
    """
    anchors = torch.full((n_tokens,), -1)
    anchor = prompt_len - 1  # the prefill's last prompt position produced the first token
    for block in blocks[1:]:
        n = block.n_accepted
        last_fed = anchor + (block.k + 1 if n == block.k else min(n + 1, block.k))
        for position in range(anchor + 1, min(last_fed, n_tokens - 1) + 1):
            anchors[position] = max(anchor + shift, 0)
        anchor += n + 1
    return anchors


@torch.inference_mode()
def _teacher_forced_probs(verifier, drafter, head, tokens, anchors) -> torch.Tensor:
    """Drafter probabilities over the whole committed sequence in one forward, steered per position."""
    ids = torch.tensor([tokens])
    with captured_states(verifier, head.config.verifier_layers) as states:
        verifier(ids)
    features = stack_features(states, head.config.verifier_layers)  # [1, T, n·D_v]
    with steered(drafter, anchored_biases(head, features, anchors[None])):
        return torch.softmax(drafter(ids).logits[0].float(), dim=-1)  # [T, V]


def _judged_draft_probs(blocks, prompt_len, probs):
    """(recorded q, teacher-forced q) for every judged draft: accepted ones and the first rejected."""
    recorded, recomputed = [], []
    anchor = prompt_len - 1
    for block in blocks[1:]:
        for j, token in enumerate(block.drafts[: min(block.n_accepted + 1, block.k)], start=1):
            recorded.append(token.draft_prob)
            recomputed.append(float(probs[anchor + j, token.token_id]))  # input position a + j
        anchor += block.n_accepted + 1
    return torch.tensor(recorded), torch.tensor(recomputed)


@pytest.mark.parametrize("kind", ["copy", "random"])
def test_inference_drafts_equal_teacher_forced_drafts_with_offset_j(kind):
    verifier = tiny_llama(hidden=64, layers=4, ffn=128, seed=0)
    # a copy of the verifier accepts whole blocks (exercising the re-fed d_k), a random drafter few
    drafter = tiny_llama(hidden=64, layers=4, ffn=128, seed=0 if kind == "copy" else 1)
    head = new_head_for(verifier, drafter)
    with torch.no_grad():
        head.w_s.normal_(0, 0.05 if kind == "copy" else 0.5)
        head.hml.bias.normal_(0, 1.0)
    config = DecodeConfig(k=3, temperature=0.0, max_new_tokens=40)
    blocks = list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, frozenset()).run(PROMPT))
    tokens = PROMPT + [t.token_id for b in blocks for t in b.emitted]
    if kind == "copy":  # whole blocks accepted: the re-fed d_k path is exercised
        assert any(b.n_accepted == b.k == 3 for b in blocks[1:])

    anchors = _anchors_from_trace(blocks, len(PROMPT), len(tokens))
    probs = _teacher_forced_probs(verifier, drafter, head, tokens, anchors)
    recorded, recomputed = _judged_draft_probs(blocks, len(PROMPT), probs)
    assert torch.allclose(recorded, recomputed, atol=1e-5)

    for shift in (-1, 1):  # one position off in either direction is detected
        wrong = _teacher_forced_probs(
            verifier, drafter, head, tokens, _anchors_from_trace(blocks, len(PROMPT), len(tokens), shift)
        )
        assert not torch.allclose(recorded, _judged_draft_probs(blocks, len(PROMPT), wrong)[1], atol=1e-5)


def test_offsets_within_a_block_run_from_1_to_k():
    """For a block with anchor a, the j-th judged draft is predicted at input position a + j."""
    verifier = tiny_llama(hidden=64, layers=4, ffn=128, seed=0)
    drafter = tiny_llama(hidden=64, layers=4, ffn=128, seed=0)
    head = new_head_for(verifier, drafter)
    config = DecodeConfig(k=4, temperature=0.0, max_new_tokens=20)
    blocks = list(SpeculativeDecoder(verifier, Proposer(drafter, head), config, frozenset()).run(PROMPT))
    tokens = PROMPT + [t.token_id for b in blocks for t in b.emitted]
    anchors = _anchors_from_trace(blocks, len(PROMPT), len(tokens))
    offsets = torch.arange(len(tokens)) - anchors
    steered_offsets = offsets[anchors >= 0]
    assert steered_offsets.min() == 1
    assert set(steered_offsets.tolist()) <= {1, 2, 3, 4, 5}  # 5 = k + 1 only for a re-fed d_k
