"""Training losses on the selected positions ([N, V] logits, `objectives.logits_at`); means over N."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
