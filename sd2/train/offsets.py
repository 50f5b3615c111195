"""Which verifier position steers each drafter input position during training
(docs/math.md#the-steering-vector).

The drafter at input position s (predicting x_{s+1}) is steered by the verifier state at s − δ,
δ ~ U{1..k} drawn per position. This is what decoding does: draft step j of a block feeds position
anchor + j, steered by the anchor's state. Anchors never precede the last prompt position (decoding
starts steering there), so δ is capped at s − (P − 1); positions before P are never steered.
"""

from __future__ import annotations

import torch


def prompt_lengths(loss_mask: torch.Tensor) -> torch.Tensor:
    """P per row = index of the first response token. loss_mask: [B, T] bool → [B] long."""
    has_response = loss_mask.any(dim=1)
    first = loss_mask.float().argmax(dim=1)
    return torch.where(has_response, first, torch.full_like(first, loss_mask.shape[1]))


def trained_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Input positions whose prediction is trained: s with x_{s+1} a response token and s ≥ P.

    The prediction of the first response token x_P (made at s = P − 1) is excluded: decoding takes
    it from the verifier's prefill, never from the drafter. loss_mask: [B, T] → [B, T] bool.
    """
    predicts_response = torch.zeros_like(loss_mask)
    predicts_response[:, :-1] = loss_mask[:, 1:]
    positions = torch.arange(loss_mask.shape[1], device=loss_mask.device)  # [T]
    return predicts_response & (positions[None, :] >= prompt_lengths(loss_mask)[:, None])


def sample_anchors(loss_mask: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """anchor[b, s] = s − δ with δ ~ U{1..min(k, s − P + 1)} on trained positions, −1 elsewhere.

    loss_mask: [B, T] bool. Returns [B, T] long.
    """
    batch, length = loss_mask.shape
    positions = torch.arange(length, device=loss_mask.device).expand(batch, length)  # [B, T]
    max_offset = (positions - prompt_lengths(loss_mask)[:, None] + 1).clamp(min=1, max=k)  # [B, T]
    uniform = torch.rand(batch, length, generator=generator, device=loss_mask.device)
    offsets = 1 + (uniform * max_offset).long()  # δ uniform on 1..max_offset
    return torch.where(trained_positions(loss_mask), positions - offsets, torch.full_like(positions, -1))
