"""Training losses. Positions are selected by a boolean mask; the reduction is a mean over them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def forward_kl(target_logits: torch.Tensor, draft_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(p_verifier ‖ q_drafter) at T = 1, summed over the vocabulary, averaged over masked positions.

    target_logits, draft_logits: [B, T, V]; mask: [B, T] bool. Forward KL is mass-covering: the
    drafter is pushed to put probability wherever the verifier does, which is what acceptance
    Σ min(p, q) rewards. Gradients flow only into draft_logits.
    """
    target_logp = F.log_softmax(target_logits.float(), dim=-1)  # [B, T, V]
    draft_logp = F.log_softmax(draft_logits.float(), dim=-1)  # [B, T, V]
    per_position = (target_logp.exp() * (target_logp - draft_logp)).sum(-1)  # [B, T]
    return _masked_mean(per_position, mask)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits[n] against targets[n] over the N selected positions (0 when N = 0).

    logits: [N, V]; targets: [N] long. Callers select the positions before the LM head, so the
    head (most of a small drafter's compute) runs only where a loss is taken.
    """
    total = F.cross_entropy(logits.float(), targets, reduction="sum")
    return total / max(len(targets), 1)


def top1_agreement(
    target_logits: torch.Tensor, draft_logits: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Fraction of masked positions where drafter and verifier argmax agree (greedy acceptance proxy)."""
    agree = (target_logits.argmax(-1) == draft_logits.argmax(-1)).float()  # [B, T]
    return _masked_mean(agree, mask)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.to(values.dtype)
    return (values * weights).sum() / weights.sum().clamp(min=1.0)
