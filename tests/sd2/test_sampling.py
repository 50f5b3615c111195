"""The accept/resample rule: exact edge cases and a statistical test of losslessness."""

import pytest
import torch

from sd2.sampling import (
    Verdict,
    Warp,
    greedy_verdict,
    overlap,
    rejection_sample,
    residual,
    sample,
    warp_probs,
)

V = 8


def _random_dist(generator: torch.Generator, vocab: int = V) -> torch.Tensor:
    return torch.softmax(torch.randn(vocab, generator=generator) * 1.5, dim=-1)


def _first_token_law(target: torch.Tensor, draft: torch.Tensor, n: int, seed: int, sampler=rejection_sample):
    """Empirical law of the first emitted token of a 1-draft block: the accepted draft or the resample."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    bonus = torch.full((V,), 1.0 / V)
    for _ in range(n):
        d = torch.multinomial(draft, 1, generator=generator)
        verdict = sampler(d, draft[None], torch.stack([target, bonus]), generator)
        counts[int(d) if verdict.n_accepted == 1 else verdict.extra_token] += 1
    return counts / n


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def test_identical_distributions_accept_everything():
    generator = torch.Generator().manual_seed(0)
    probs = torch.stack([_random_dist(generator) for _ in range(4)])  # [K+1, V]
    for _ in range(200):
        drafts = torch.multinomial(probs[:3], 1, generator=generator).squeeze(-1)
        assert rejection_sample(drafts, probs[:3], probs, generator).n_accepted == 3


def test_disjoint_supports_accept_nothing_and_resample_inside_target_support():
    generator = torch.Generator().manual_seed(0)
    draft = torch.tensor([0.5, 0.5, 0, 0, 0, 0, 0, 0])
    target = torch.tensor([0, 0, 0.2, 0.3, 0.5, 0, 0, 0])
    for _ in range(200):
        d = torch.multinomial(draft, 1, generator=generator)
        verdict = rejection_sample(d, draft[None], torch.stack([target, target]), generator)
        assert verdict.n_accepted == 0
        assert target[verdict.extra_token] > 0


def test_all_zero_residual_falls_back_to_target():
    row = torch.tensor([0.25, 0.25, 0.5])
    assert torch.equal(residual(row, row.clone()), row)
    assert torch.allclose(
        residual(torch.tensor([0.5, 0.5, 0.0]), torch.tensor([1.0, 0.0, 0.0])), torch.tensor([0.0, 1.0, 0.0])
    )


def test_residual_identity_reconstructs_target():
    """q·min(1, p/q) + (1 − Σ q·min(1, p/q))·residual = p, exactly the law of the emitted token."""
    generator = torch.Generator().manual_seed(1)
    target, draft = _random_dist(generator), _random_dist(generator)
    accept = draft * torch.clamp(target / draft, max=1.0)
    reconstructed = accept + (1 - accept.sum()) * residual(target, draft)
    assert torch.allclose(reconstructed, target, atol=1e-6)


@pytest.mark.slow
@pytest.mark.statistical
def test_emitted_token_follows_the_target_law_and_distance_shrinks():
    generator = torch.Generator().manual_seed(2)
    target, draft = _random_dist(generator), _random_dist(generator)
    assert _tv(target, draft) > 0.2  # the drafter alone would be far off
    small = _tv(_first_token_law(target, draft, 1_000, seed=3), target)
    large = _tv(_first_token_law(target, draft, 20_000, seed=4), target)
    assert large < 3 * (V / 20_000) ** 0.5  # within sampling noise of the target
    assert large < small


@pytest.mark.slow
@pytest.mark.statistical
def test_negative_control_always_accept_fails_the_same_check():
    def always_accept(drafts, draft_probs, target_probs, generator):
        return Verdict(n_accepted=drafts.shape[0], extra_token=0)

    generator = torch.Generator().manual_seed(2)
    target, draft = _random_dist(generator), _random_dist(generator)
    law = _first_token_law(target, draft, 20_000, seed=4, sampler=always_accept)
    assert _tv(law, target) > 3 * (V / 20_000) ** 0.5  # the check above would catch it


@pytest.mark.slow
@pytest.mark.statistical
def test_empirical_acceptance_matches_overlap():
    generator = torch.Generator().manual_seed(5)
    target, draft = _random_dist(generator), _random_dist(generator)
    bonus = torch.full((V,), 1.0 / V)
    accepted = 0
    n = 20_000
    for _ in range(n):
        d = torch.multinomial(draft, 1, generator=generator)
        accepted += rejection_sample(d, draft[None], torch.stack([target, bonus]), generator).n_accepted
    assert abs(accepted / n - float(overlap(target, draft))) < 0.02


@pytest.mark.slow
@pytest.mark.statistical
def test_sample_draws_each_id_with_its_share_of_the_weight():
    """Inversion sampling against the law: unnormalised weights, zeros never drawn, and a tail of tiny
    weights after the bulk (where float32 cumulative sums would lose them) still drawn at its rate."""
    generator = torch.Generator().manual_seed(11)
    weights = torch.cat([_random_dist(generator) * 3.0, torch.zeros(2), torch.full((4,), 0.05)])
    weights[1] = 0.0
    law = weights / weights.sum()
    n = 40_000
    counts = torch.bincount(torch.tensor([sample(weights, generator) for _ in range(n)]), minlength=14)
    assert counts[1] == 0 and counts[V] == 0 and counts[V + 1] == 0
    assert _tv(counts / n, law) < 3 * (len(law) / n) ** 0.5


def test_sample_is_reproducible_and_refuses_a_row_without_mass():
    probs = torch.softmax(torch.randn(49_152, generator=torch.Generator().manual_seed(0)), -1)
    first = [sample(probs, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert first[0] == first[1]
    assert sample(torch.tensor([0.0, 0.0, 2.0, 0.0]), torch.Generator().manual_seed(0)) == 2
    for row in (torch.zeros(4), torch.tensor([float("nan"), 1.0])):
        with pytest.raises(ValueError, match="total weight"):
            sample(row, torch.Generator().manual_seed(0))


def test_greedy_verdict_accepts_matching_prefix_and_emits_argmax():
    target_argmax = torch.tensor([4, 7, 1, 9])
    assert greedy_verdict(torch.tensor([4, 7, 2]), target_argmax) == Verdict(2, 1)
    full = greedy_verdict(torch.tensor([4, 7, 1]), target_argmax)
    assert (full.n_accepted, full.extra_token) == (3, 9)
    assert greedy_verdict(torch.tensor([0, 7, 1]), target_argmax).n_accepted == 0


def test_warp_greedy_is_one_hot_and_filters_shape_the_support():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.equal(warp_probs(logits, Warp(0.0)), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    top2 = warp_probs(logits, Warp(1.0, top_k=2))
    assert torch.equal(top2 > 0, torch.tensor([[False, True, True, False]]))
    nucleus = warp_probs(logits, Warp(1.0, top_p=0.5))  # the top token alone holds ≥ 0.5
    assert torch.equal(nucleus > 0, torch.tensor([[False, True, False, False]]))
    assert torch.allclose(warp_probs(logits, Warp(2.0)).sum(-1), torch.ones(1))


@pytest.mark.parametrize("top_p", [1e-300, 1e-50, 1e-45])  # below or at the edge of float32's range
def test_a_vanishing_top_p_keeps_the_top_token_instead_of_nan(top_p):
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.5, 0.5, -1.0, 4.0]])
    probs = warp_probs(logits, Warp(1.0, top_p=top_p))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]))


@pytest.mark.slow
@pytest.mark.statistical
@pytest.mark.parametrize("top_p", [0.3, 0.9])
def test_speculative_sampling_with_nucleus_is_lossless_for_the_warped_target(top_p):
    """top-p warps p and q identically; the emitted law is the warped target."""
    generator = torch.Generator().manual_seed(6)
    warp = Warp(1.0, top_p=top_p)
    target = warp_probs(torch.randn(V, generator=generator) * 2, warp)
    draft = warp_probs(torch.randn(V, generator=generator) * 2, warp)
    law = _first_token_law(target, draft, 20_000, seed=7)
    assert _tv(law, target) < 3 * (V / 20_000) ** 0.5
