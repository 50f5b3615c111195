"""Training losses on the selected positions ([N, V] logits, `objectives.logits_at`); means over N."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from sd2.choices import LOSSES
from sd2.sampling import overlap


def forward_kl(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_verifier ‖ q_drafter) at T = 1, summed over the vocabulary, averaged over the N positions.

    target_logits, draft_logits: [N, V] (the selected positions; 0 when N = 0). Forward KL is
    mass-covering: the drafter is pushed to put probability wherever the verifier does, which is
    what acceptance Σ min(p, q) rewards. Gradients flow only into draft_logits.
    """
    target_logp = F.log_softmax(target_logits.float(), dim=-1)  # [N, V]
    draft_logp = F.log_softmax(draft_logits.float(), dim=-1)  # [N, V]
    total = F.kl_div(draft_logp, target_logp, reduction="sum", log_target=True)
    return total / max(len(target_logits), 1)


def total_variation(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """TV(p_verifier, q_drafter) = ½ Σ_v |p − q| at T = 1, averaged over the N positions.

    target_logits, draft_logits: [N, V] (0 when N = 0). 1 − TV is the acceptance probability of a draft
    under Leviathan's rule (Σ min(p, q)), so this loss is the one the decoding rule pays (DistillSpec);
    its gradient only moves q where it differs from p. Gradients flow only into draft_logits.
    """
    target = F.softmax(target_logits.float(), dim=-1)  # [N, V]
    draft = F.softmax(draft_logits.float(), dim=-1)  # [N, V]
    total = 0.5 * (target - draft).abs().sum()
    return total / max(len(target_logits), 1)


def draft_loss(name: str, target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """The fine-tuning loss by name: forward KL, TV distance, or their mean (mixed). [N, V] each."""
    if name == "kl":
        return forward_kl(target_logits, draft_logits)
    if name == "tvd":
        return total_variation(target_logits, draft_logits)
    if name == "mixed":
        return 0.5 * (forward_kl(target_logits, draft_logits) + total_variation(target_logits, draft_logits))
    raise ValueError(f"loss must be one of {LOSSES}, got {name!r}")


def tau_proxy(alphas: torch.Tensor, lengths: Sequence[int], k: int) -> float | None:
    """The block efficiency a drafter of these per-position acceptances would reach at draft length k:
    the mean over every window of k consecutive positions of one sequence of 1 + Σ_j Π_{i≤j} α_i (a
    shorter sequence is one shorter window). alphas: [N] α in [0, 1], the positions of the sequences
    one after another (`lengths` of each, in order). None when N = 0.

    With α = Σ min(p, q) it is τ under Leviathan's rule at T = 1; with α = 1 where the argmaxes agree (else
    0), greedy τ. Teacher-forced positions stand in for a block's drafts, so it is a proxy, not τ."""
    windows = []
    for row in alphas.detach().float().split(list(lengths)):
        if len(row):
            windows.append(row.unfold(0, k, 1) if len(row) >= k else row[None])  # [W, ≤ k]
    if not windows:
        return None
    taus = torch.cat([1 + w.cumprod(-1).sum(-1) for w in windows])  # [Σ W]
    return float(taus.mean())


@torch.no_grad()
def acceptance(target_logits: torch.Tensor, draft_logits: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """α = Σ_v min(p, q) at T = 1 per position (`sd2.sampling.overlap`): [N, V] each → [N], `chunk` rows
    at a time (no gradient)."""
    parts = [
        overlap(F.softmax(t.float(), dim=-1), F.softmax(d.float(), dim=-1))
        for t, d in zip(target_logits.split(chunk), draft_logits.detach().split(chunk), strict=True)
    ]
    return torch.cat(parts) if parts else target_logits.new_zeros(0, dtype=torch.float32)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits[n] against targets[n] over the N selected positions (0 when N = 0).

    logits: [N, V]; targets: [N] long. Callers select the positions before the LM head, so the
    head (most of a small drafter's compute) runs only where a loss is taken.
    """
    total = F.cross_entropy(logits.float(), targets, reduction="sum")
    return total / max(len(targets), 1)


def top1_agreement(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Fraction of the N positions where drafter and verifier argmax agree (greedy acceptance proxy).

    target_logits, draft_logits: [N, V].
    """
    agree = (target_logits.argmax(-1) == draft_logits.argmax(-1)).float()  # [N]
    return agree.sum() / max(len(agree), 1)
