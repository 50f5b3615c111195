"""Per-batch losses of the three recipes (docs/math.md#training-objectives).

Positions: `offsets.trained_positions`."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from sd2.data.batches import Batch
from sd2.losses import acceptance, draft_loss, next_token_loss, tau_proxy, top1_agreement
from sd2.steering import SteeringHead, anchored_biases, captured_states, stack_features, steered
from sd2.train.offsets import sample_anchors, trained_positions


@dataclass
class StepOutput:
    """Loss to back-propagate and detached numbers to log."""

    loss: torch.Tensor
    metrics: dict[str, float]


def logits_at(model: nn.Module, mask: torch.Tensor, **inputs) -> torch.Tensor:
    """Logits [N, V] of a causal LM at the N positions where mask [B, T] is set.

    The body runs on every position, the output head only on the selected ones: the 49 152-row head
    is most of a small drafter's compute, and the losses then never hold [B, T, V] fp32 tensors.
    Models that post-process their logits (final soft-capping) take the full forward instead.
    """
    if getattr(model.config, "final_logit_softcapping", None):
        return model(**inputs).logits[mask]
    hidden = model.base_model(**inputs).last_hidden_state  # [B, T, D]
    return model.get_output_embeddings()(hidden[mask])


def pretrain_step(drafter: nn.Module, batch: Batch) -> StepOutput:
    """Plain next-token cross-entropy on the text (the independently pretrained drafter)."""
    input_ids = batch.input_ids  # [B, T]
    mask = trained_positions(batch.loss_mask)  # [B, T]; never the last column (no next token)
    logits = logits_at(drafter, mask, input_ids=input_ids)  # [N, V]
    loss = next_token_loss(logits, input_ids[:, 1:][mask[:, :-1]])
    return StepOutput(loss, {"loss": float(loss.detach()), "tokens": float(mask.sum())})


@torch.no_grad()
def verifier_targets(verifier: nn.Module, batch: Batch, mask: torch.Tensor, layers: tuple[int, ...] | None):
    """Frozen verifier: logits [N, V] at the masked positions and, for steering, the features
    [B, T, n·D_v] of every position (else None)."""
    capture = captured_states(verifier, layers) if layers else nullcontext({})
    with capture as states:
        logits = logits_at(verifier, mask, input_ids=batch.input_ids)
    return logits, (stack_features(states, layers) if layers else None)


# (verifier, batch, mask [B, T], feature layers or None) → (logits [N, V], features [B, T, n·D_v] or None)
VerifierTargets = Callable[
    [nn.Module, Batch, torch.Tensor, tuple[int, ...] | None], tuple[torch.Tensor, torch.Tensor | None]
]


def distill_step(
    drafter: nn.Module,
    verifier: nn.Module,
    batch: Batch,
    head: SteeringHead | None = None,
    k: int = 8,
    generator: torch.Generator | None = None,
    targets: VerifierTargets = verifier_targets,
    loss_name: str = "kl",
) -> StepOutput:
    """A divergence of q_drafter from p_verifier at T = 1 on response positions (`sd2.losses.draft_loss`:
    forward KL, TV distance or their mean); with a head, the SD² step: position s is steered by the
    verifier state at s − δ, δ ~ U{1..k} per position. `targets` computes the frozen verifier's side
    (runs in lockstep share one computation per batch). Logs the τ proxies at draft length k
    (`sd2.losses.tau_proxy`): under Leviathan's rule at T = 1 and greedy."""
    layers = head.config.verifier_layers if head is not None else None
    mask = trained_positions(batch.loss_mask)  # [B, T]
    target_logits, features = targets(verifier, batch, mask, layers)  # [N, V]
    if head is None:
        draft_logits = logits_at(drafter, mask, input_ids=batch.input_ids)  # [N, V]
    else:
        anchors = sample_anchors(batch.loss_mask, k, generator)  # [B, T]
        draft_logits = steered_logits(drafter, head, batch.input_ids, features, anchors, mask)
    loss = draft_loss(loss_name, target_logits, draft_logits)
    agreement = top1_agreement(target_logits, draft_logits.detach())
    metrics = {"loss": float(loss.detach()), "agreement": float(agreement), "tokens": float(mask.sum())}
    lengths = mask.sum(1).tolist()  # positions of each sequence, in the row-major order of [N]
    matches = (target_logits.argmax(-1) == draft_logits.detach().argmax(-1)).float()  # [N]
    proxies = {"tau_proxy": acceptance(target_logits, draft_logits), "tau_proxy_greedy": matches}
    for name, alphas in proxies.items():
        proxy = tau_proxy(alphas, lengths, k)
        if proxy is not None:
            metrics[name] = proxy
    return StepOutput(loss, metrics)


def steered_logits(
    drafter: nn.Module,
    head: SteeringHead,
    input_ids: torch.Tensor,  # [B, T]
    features: torch.Tensor,  # [B, T, n·D_v] verifier states of the same tokens
    anchors: torch.Tensor,  # [B, T] verifier position steering each input position, −1 = none
    mask: torch.Tensor,  # [B, T] bool: the positions whose logits are wanted
) -> torch.Tensor:
    """Teacher-forced steered drafter logits [N, V] at the masked positions: one forward does what
    k decoding steps do."""
    with steered(drafter, anchored_biases(head, features, anchors)):
        return logits_at(drafter, mask, input_ids=input_ids)
