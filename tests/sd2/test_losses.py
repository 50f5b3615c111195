"""sd2.losses: the fine-tuning divergences and the τ proxy, on hand-made distributions."""

import pytest
import torch

from sd2.losses import acceptance, draft_loss, forward_kl, tau_proxy, total_variation


def test_total_variation_is_one_minus_the_acceptance_probability():
    generator = torch.Generator().manual_seed(0)
    target, draft = torch.randn(6, 50, generator=generator), torch.randn(6, 50, generator=generator)
    expected = 1 - acceptance(target, draft, chunk=4)  # chunks of 4 rows: 6 rows in two
    assert total_variation(target, draft) == pytest.approx(float(expected.mean()), rel=1e-5)
    assert float(total_variation(target, target)) == pytest.approx(0.0, abs=1e-6)
    disjoint = torch.full((1, 4), -1e4)
    assert float(
        total_variation(
            disjoint.index_fill(1, torch.tensor([0]), 0.0), disjoint.index_fill(1, torch.tensor([3]), 0.0)
        )
    ) == pytest.approx(1.0)


def test_draft_loss_names_each_divergence_and_refuses_others():
    generator = torch.Generator().manual_seed(1)
    target, draft = torch.randn(3, 20, generator=generator), torch.randn(3, 20, generator=generator)
    kl, tv = forward_kl(target, draft), total_variation(target, draft)
    assert torch.equal(draft_loss("kl", target, draft), kl)
    assert torch.equal(draft_loss("tvd", target, draft), tv)
    assert torch.allclose(draft_loss("mixed", target, draft), (kl + tv) / 2)
    with pytest.raises(ValueError, match="loss must be one of"):
        draft_loss("js", target, draft)


def test_tvd_gradient_moves_only_the_drafter_towards_the_verifier():
    target = torch.tensor([[2.0, 0.0, -1.0]])
    draft = torch.zeros(1, 3, requires_grad=True)
    total_variation(target, draft).backward()
    assert draft.grad[0, 0] < 0  # raising q where p is larger lowers the distance


def test_the_tau_proxy_is_the_block_efficiency_of_windows_of_k_positions():
    ones, zeros = torch.ones(10), torch.zeros(10)
    assert tau_proxy(ones, [10], k=4) == pytest.approx(5.0)  # every draft accepted: 1 + k
    assert tau_proxy(zeros, [10], k=4) == pytest.approx(1.0)  # none: the extra token only
    half = torch.full((4,), 0.5)
    assert tau_proxy(half, [4], k=2) == pytest.approx(1 + 0.5 + 0.25)
    # two sequences: [1, 1, 0] gives windows (1, 1) → 3 and (1, 0) → 2; [0.5] is one short window → 1.5
    mixed = torch.tensor([1.0, 1.0, 0.0, 0.5])
    assert tau_proxy(mixed, [3, 1], k=2) == pytest.approx((3 + 2 + 1.5) / 3)
    assert tau_proxy(torch.zeros(0), [0, 0], k=4) is None
