"""The unsteered counterfactual of each block (sd2.counterfactual) and the rejection explainer: it never
changes a run, it is the real unsteered drafter judged by the real verifier, and its expected accepted
length is what the acceptance rule gives."""

import copy

import pytest
import torch

from sd2.config import DecodeConfig
from sd2.decoding import SpeculativeDecoder
from sd2.draft_vocab import DraftVocab, reduced_head_for
from sd2.kv_cache import cached_forward, rollback_cache
from sd2.metrics import summarize
from sd2.proposer import Proposer
from sd2.sampling import acceptance_survival, greedy_verdict, rejection_sample, warp_probs
from sd2.steering import new_head_for
from sd2.trace import BlockKind, SteeringOutcome, TokenStatus
from tests.tiny import peaky_llama

PROMPT = [5, 17, 42, 9, 100, 7]
NO_STOP = frozenset()


def _run(verifier, drafter, head, counterfactual, draft_head=None, **settings):
    config = DecodeConfig(**{"k": 4, "max_new_tokens": 40, "seed": 3, **settings})
    decoder = SpeculativeDecoder(
        verifier, Proposer(drafter, head, draft_head), config, NO_STOP, counterfactual=counterfactual
    )
    return list(decoder.run(PROMPT))


def _ids(blocks):
    return [t.token_id for b in blocks for t in b.emitted]


@pytest.fixture(scope="module")
def zero_head(verifier, drafters):
    """A freshly initialised head: its W_s is zero, so it steers by nothing."""
    drafter, _ = drafters["random"]
    head = new_head_for(verifier, drafter)
    assert not head.w_s.detach().any()
    return head


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["same", "random", "steered"])
def test_the_counterfactual_never_changes_the_emitted_tokens(verifier, drafters, kind, temperature):
    drafter, head = drafters[kind]
    plain = _run(verifier, drafter, head, False, temperature=temperature)
    probed = _run(verifier, drafter, head, True, temperature=temperature)
    assert _ids(probed) == _ids(plain)
    assert [b.k for b in probed] == [b.k for b in plain]
    speculative = [b for b in probed if b.kind is BlockKind.SPECULATIVE]
    if head is None:  # nothing steered: nothing to compare against
        assert all(b.counterfactual is None for b in probed)
    else:
        assert speculative and all((b.counterfactual is not None) == (b.k > 0) for b in speculative)
        assert all(len(b.counterfactual.drafts) == b.k for b in speculative if b.k > 0)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_negative_control_a_zero_head_gives_the_runs_own_drafts_and_no_gain(
    verifier, drafters, zero_head, temperature
):
    drafter, _ = drafters["random"]
    blocks = _run(verifier, drafter, zero_head, True, temperature=temperature, max_new_tokens=60)
    speculative = [b for b in blocks if b.kind is BlockKind.SPECULATIVE and b.k > 0]
    assert len(speculative) > 5
    for block in speculative:
        twin = block.counterfactual
        assert [t.token_id for t in twin.drafts] == [t.token_id for t in block.drafts]
        assert [t.draft_prob for t in twin.drafts] == [t.draft_prob for t in block.drafts]
        assert twin.expected_accepted == twin.steered_expected_accepted
        assert twin.outcome is SteeringOutcome.TIED
    gain = summarize(blocks, 4).steering_gain
    assert gain.gain == 0.0 and gain.tied == len(speculative) and gain.won == gain.lost == 0


def test_a_real_head_makes_the_counterfactual_differ(verifier, drafters):
    drafter, head = drafters["steered"]
    blocks = _run(verifier, drafter, head, True, max_new_tokens=60)
    pairs = [(b.drafts, b.counterfactual.drafts) for b in blocks if b.counterfactual is not None]
    differing = sum([t.token_id for t in a] != [t.token_id for t in b] for a, b in pairs)
    assert differing > 0
    gain = summarize(blocks, 4).steering_gain
    assert gain.won + gain.tied + gain.lost == gain.n_blocks == len(pairs)
    assert gain.low <= gain.gain <= gain.high


@torch.inference_mode()
def test_the_counterfactual_is_the_unsteered_drafter_judged_by_the_verifier(verifier, drafters):
    """Recompute a greedy block's counterfactual from scratch: the drafter without hooks drafting from
    the block's committed prefix, the verifier's argmax after each draft."""
    drafter, head = drafters["steered"]
    blocks = _run(verifier, drafter, head, True, max_new_tokens=30)
    committed = [*PROMPT, blocks[0].extra.token_id]
    checked = 0
    for block in blocks[1:]:
        twin = block.counterfactual
        if twin is None:  # a k = 0 block at the length limit
            continue
        sequence = list(committed)
        for _ in range(block.k):
            sequence.append(int(drafter(torch.tensor([sequence])).logits[0, -1].argmax()))
        assert [t.token_id for t in twin.drafts] == sequence[len(committed) :]
        argmax = verifier(torch.tensor([sequence])).logits[0, len(committed) - 1 : -1].argmax(-1)  # [K]
        matches = greedy_verdict(torch.tensor(sequence[len(committed) :]), torch.cat([argmax, argmax[-1:]]))
        assert twin.accepted == matches.n_accepted == twin.expected_accepted
        statuses = [t.status for t in twin.drafts]
        assert statuses[: twin.accepted] == [TokenStatus.ACCEPTED] * twin.accepted
        if twin.accepted < block.k:
            assert statuses[twin.accepted] is TokenStatus.REJECTED
        assert twin.steered_expected_accepted == block.n_accepted  # greedy: the block's own count
        committed += [t.token_id for t in block.emitted]
        checked += 1
    assert checked > 3


def test_a_reduced_draft_vocabulary_counterfactual_drafts_only_kept_tokens(verifier, drafters, zero_head):
    drafter, _ = drafters["random"]
    draft_head = reduced_head_for(drafter, DraftVocab(tuple(range(0, verifier.config.vocab_size, 2))))
    blocks = _run(verifier, drafter, zero_head, True, draft_head=draft_head, temperature=1.0)
    for block in [b for b in blocks[1:] if b.k > 0]:
        assert all(t.token_id % 2 == 0 for t in block.counterfactual.drafts)
        assert [t.token_id for t in block.counterfactual.drafts] == [t.token_id for t in block.drafts]


def test_counterfactual_time_is_left_out_of_the_speed_figures(verifier, drafters):
    drafter, head = drafters["steered"]
    blocks = _run(verifier, drafter, head, True)
    spent = sum(b.timings.counterfactual_ms for b in blocks)
    assert spent > 0 and all(b.timings.counterfactual_ms > 0 for b in blocks[1:] if b.k > 0)
    wall_ms = sum(b.timings.total_ms for b in blocks) + spent
    metrics = summarize(blocks, 4, wall_ms=wall_ms)
    prefill = blocks[0].timings.total_ms
    assert metrics.counterfactual_ms == pytest.approx(spent)
    assert metrics.decode_ms == pytest.approx(wall_ms - spent - prefill)


@torch.inference_mode()
def _tiny_draft(verifier, drafter, seed: int, k: int = 4):
    """A T = 1 draft of k tokens after [3, 1, 4]: ids [K], q [K, V], p [K+1, V]."""
    warp = DecodeConfig(temperature=1.0).warp
    generator = torch.Generator().manual_seed(seed)
    draft_cache, verify_cache = rollback_cache(drafter), rollback_cache(verifier)
    cached_forward(verifier, [3, 1], verify_cache, last_only=True)
    inputs, tokens, q_rows = [3, 1, 4], [], []
    for _ in range(k):
        q = warp_probs(cached_forward(drafter, inputs, draft_cache, last_only=True)[-1], warp)
        inputs = [int(torch.multinomial(q, 1, generator=generator))]
        tokens.append(inputs[0])
        q_rows.append(q)
    p = warp_probs(cached_forward(verifier, [4, *tokens], verify_cache, last_only=False), warp)
    return torch.tensor(tokens), torch.stack(q_rows), p


@pytest.mark.slow
@pytest.mark.statistical
def test_expected_accepted_length_matches_monte_carlo():
    """Σ_j Π_{i≤j} min(1, p_i/q_i) against the mean accepted count of Leviathan's rule on one draft."""
    verifier = peaky_llama(8, 0, hidden=16, layers=2)
    drafter = copy.deepcopy(verifier)  # close to the verifier, not equal: p/q near 1, not 1
    torch.manual_seed(5)
    with torch.no_grad():
        drafter.lm_head.weight.add_(torch.randn_like(drafter.lm_head.weight) * 0.8)
    draft, q, p = _tiny_draft(verifier, drafter, seed=7)
    survival = acceptance_survival(draft, q, p)
    assert float(survival[0]) < 0.9 and float(survival[-1]) > 0.05  # every position matters
    expected = float(acceptance_survival(draft, q, p).sum())
    generator, n = torch.Generator().manual_seed(1), 20_000
    counts = torch.tensor([rejection_sample(draft, q, p, generator).n_accepted for _ in range(n)]).double()
    half_width = 4 * float(counts.std()) / n**0.5
    assert abs(float(counts.mean()) - expected) < half_width


def test_at_greedy_the_expected_length_counts_leading_argmax_matches():
    v = 6
    argmax = torch.tensor([1, 2, 3, 4, 5])  # the verifier's argmax at positions 1..K+1
    for draft in ([1, 2, 3, 4], [1, 2, 0, 4], [0, 2, 3, 4], [1, 2, 3, 0]):
        draft = torch.tensor(draft)
        q = torch.nn.functional.one_hot(draft, v).float()  # greedy rule: one-hot on the drafted token
        p = torch.nn.functional.one_hot(argmax, v).float()
        assert float(acceptance_survival(draft, q, p).sum()) == greedy_verdict(draft, argmax).n_accepted


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_judged_tokens_carry_the_explainer(verifier, drafters, temperature):
    drafter, head = drafters["steered"]
    # long enough that a T = 1 run of these near-uniform tiny models meets a rejection or more
    blocks = _run(verifier, drafter, head, False, temperature=temperature, max_new_tokens=120)
    resampled = 0
    for block in blocks[1:]:
        for i, token in enumerate(block.drafts):
            judged = i <= block.n_accepted
            assert bool(token.target_top) == judged and bool(token.draft_top) == judged
            if not judged:
                continue
            probs = [c.prob for c in token.target_top]
            assert len(probs) == 5 and probs == sorted(probs, reverse=True)
            assert token.draft_top[0].prob >= token.draft_prob  # q's most likely is at least q(x)
            if token.target_rank <= 5:
                assert token.target_top[token.target_rank - 1].prob == token.target_prob
            else:
                assert token.target_prob <= probs[-1]
        extra = block.extra
        assert extra.target_top and extra.target_rank >= 1
        if extra.status is TokenStatus.RESAMPLED:
            resampled += 1
            mass = [c.prob for c in extra.residual_top]
            assert mass and all(m > 0 for m in mass) and mass == sorted(mass, reverse=True)
            assert sum(mass) <= 1 + 1e-6
            if temperature == 0:  # the residual of two one-hots is the verifier's argmax
                assert [c.token_id for c in extra.residual_top] == [extra.token_id]
        else:
            assert extra.residual_top == []
    assert resampled > 0
