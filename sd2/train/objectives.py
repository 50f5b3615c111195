"""Per-batch losses of the three recipes (DESIGN.md §2.3). Positions: `offsets.trained_positions`."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from sd2.data.batches import Batch
from sd2.losses import forward_kl, next_token_loss, top1_agreement
from sd2.steering import SteeringHead, anchored_biases, captured_states, stack_features, steered
from sd2.train.offsets import sample_anchors, trained_positions


@dataclass
class StepOutput:
    """Loss to back-propagate and detached numbers to log."""

    loss: torch.Tensor
    metrics: dict[str, float]


def pretrain_step(drafter: nn.Module, batch: Batch) -> StepOutput:
    """Plain next-token cross-entropy on the text (the independently pretrained drafter)."""
    input_ids = batch.input_ids  # [B, T]
    mask = trained_positions(batch.loss_mask)[:, :-1]  # [B, T-1]
    hidden = drafter.base_model(input_ids=input_ids).last_hidden_state[:, :-1]  # [B, T-1, D]
    logits = drafter.get_output_embeddings()(hidden[mask])  # [N, V]: the head only where learned
    loss = next_token_loss(logits, input_ids[:, 1:][mask])
    return StepOutput(loss, {"loss": float(loss.detach()), "tokens": float(mask.sum())})


@torch.no_grad()
def verifier_targets(verifier: nn.Module, batch: Batch, layers: tuple[int, ...] | None):
    """Frozen verifier: logits [B, T, V] and, for steering, features [B, T, n·D_v] (else None)."""
    capture = captured_states(verifier, layers) if layers else nullcontext({})
    with capture as states:
        logits = verifier(input_ids=batch.input_ids).logits
    return logits, (stack_features(states, layers) if layers else None)


def distill_step(
    drafter: nn.Module,
    verifier: nn.Module,
    batch: Batch,
    head: SteeringHead | None = None,
    k: int = 8,
    generator: torch.Generator | None = None,
) -> StepOutput:
    """Forward KL(p_verifier ‖ q_drafter) at T = 1 on response positions; with a head, the SD² step:
    position s is steered by the verifier state at s − δ, δ ~ U{1..k} per position."""
    layers = head.config.verifier_layers if head is not None else None
    target_logits, features = verifier_targets(verifier, batch, layers)
    mask = trained_positions(batch.loss_mask)  # [B, T]
    if head is None:
        draft_logits = drafter(input_ids=batch.input_ids).logits
    else:
        anchors = sample_anchors(batch.loss_mask, k, generator)  # [B, T]
        draft_logits = steered_logits(drafter, head, batch.input_ids, features, anchors)
    loss = forward_kl(target_logits, draft_logits, mask)
    agreement = top1_agreement(target_logits, draft_logits.detach(), mask)
    metrics = {"loss": float(loss.detach()), "agreement": float(agreement), "tokens": float(mask.sum())}
    return StepOutput(loss, metrics)


def steered_logits(
    drafter: nn.Module,
    head: SteeringHead,
    input_ids: torch.Tensor,  # [B, T]
    features: torch.Tensor,  # [B, T, n·D_v] verifier states of the same tokens
    anchors: torch.Tensor,  # [B, T] verifier position steering each input position, −1 = none
) -> torch.Tensor:
    """Teacher-forced steered drafter logits [B, T, V]: one forward does what k decoding steps do."""
    with steered(drafter, anchored_biases(head, features, anchors)):
        return drafter(input_ids=input_ids).logits
