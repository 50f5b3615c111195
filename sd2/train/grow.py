"""Deepening a trained drafter without changing what it computes (block expansion, as in LLaMA Pro).

Each new decoder layer is a copy of the layer before it with its two output projections (attention
`o_proj`, MLP `down_proj`) zeroed, so it adds exactly 0 to the residual stream: the grown drafter's
logits equal the original's, bit for bit, until training moves the new layers. A steering head grows
with it: the new layers' rows of W_s start at zero, so the steered drafter is unchanged too. This lets
a probe ask whether a deeper body pays without pretraining one from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from sd2.architecture import decoder_layers
from sd2.models import drafter_vocab
from sd2.steering import SteeringConfig, SteeringHead, has_steering_head
from sd2.train.build import lineage, load_trainable_drafter
from sd2.train.checkpoint import checkpoint_tokenizer, save_checkpoint, verify_checkpoint

ZEROED_PROJECTIONS = ("self_attn.o_proj.", "mlp.down_proj.")


def layer_plan(n_layers: int, after: Sequence[int]) -> list[tuple[int, bool]]:
    """The grown model's layers as (source layer, is_new_copy), e.g. 4 layers after (1, 3) →
    [(0, F), (1, F), (1, T), (2, F), (3, F), (3, T)]."""
    bad = sorted({i for i in after if not 0 <= i < n_layers})
    if bad or not after:
        raise ValueError(f"--after needs layer indices in 0..{n_layers - 1}, got {list(after)}")
    plan = []
    for layer in range(n_layers):
        plan.append((layer, False))
        plan.extend((layer, True) for _ in range(list(after).count(layer)))
    return plan


@torch.no_grad()
def deepen(drafter: nn.Module, after: Sequence[int]) -> tuple[nn.Module, list[tuple[int, bool]]]:
    """A deeper copy of `drafter` (a Llama-family causal LM) with a zero-output copy of each layer in
    `after` inserted right behind it; returns the model (fp32, same mode) and its layer plan."""
    decoder_layers(drafter)  # refuses unsupported layouts with a clear error
    plan = layer_plan(drafter.config.num_hidden_layers, after)
    raw = drafter.config.to_dict()
    raw.pop("layer_types", None)  # one entry per layer: rebuilt for the new depth
    config = type(drafter.config).from_dict({**raw, "num_hidden_layers": len(plan)})
    with torch.random.fork_rng(devices=[]):  # the init is overwritten below: leave the global RNG alone
        grown = type(drafter)(config)
    source = drafter.state_dict()
    state = {key: value for key, value in source.items() if not key.startswith("model.layers.")}
    for new_index, (layer, is_copy) in enumerate(plan):
        prefix = f"model.layers.{layer}."
        for key, value in source.items():
            if not key.startswith(prefix):
                continue
            rest = key.removeprefix(prefix)
            zero = is_copy and rest.startswith(ZEROED_PROJECTIONS)
            state[f"model.layers.{new_index}.{rest}"] = torch.zeros_like(value) if zero else value.clone()
    result = grown.load_state_dict(state, strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:  # lm_head: tied below
        raise ValueError(f"cannot deepen {type(drafter).__name__}: {result}")
    grown.tie_weights()
    grown.generation_config = drafter.generation_config
    return grown.to(torch.float32).train(drafter.training), plan


@torch.no_grad()
def deepen_head(head: SteeringHead, plan: list[tuple[int, bool]]) -> SteeringHead:
    """The head for the grown drafter: every layer steered before keeps its W_s rows, and each new copy
    of a steered layer is steered from zero rows (its up-projection bias starts at 0)."""
    rows = {layer: i for i, layer in enumerate(head.config.drafter_layers)}
    steered = [(new, layer, copy) for new, (layer, copy) in enumerate(plan) if layer in rows]
    config = SteeringConfig(
        verifier_hidden=head.config.verifier_hidden,
        drafter_ffn=head.config.drafter_ffn,
        verifier_layers=head.config.verifier_layers,
        drafter_layers=tuple(new for new, _, _ in steered),
        layernorm_eps=head.config.layernorm_eps,
        extra=dict(head.config.extra),
    )
    grown = SteeringHead(config).to(head.w_s.dtype)
    grown.hml.load_state_dict(head.hml.state_dict())
    grown.norm.load_state_dict(head.norm.state_dict())
    for i, (_, layer, copy) in enumerate(steered):
        grown.w_s[i] = 0 if copy else head.w_s[rows[layer]]
    return grown


def grow_checkpoint(source: str | Path, target: str | Path, after: Sequence[int]) -> Path:
    """Write a deepened copy of the verified checkpoint `source` to `target` (fp32, a checkpoint
    `sd2 train --from` starts from): same tokenizer, draft vocabulary and, where it has one, a grown
    steering head; its card records the plan and the lineage."""
    card = verify_checkpoint(source)
    drafter, plan = deepen(load_trainable_drafter(source), after)
    head = deepen_head(SteeringHead.load(source).float(), plan) if has_steering_head(source) else None
    tokenizer = checkpoint_tokenizer(source)
    grown_card = {
        "initialised_from": str(source),
        "grown": {"after": list(after), "layers": [layer for layer, _ in plan], "new": [c for _, c in plan]},
        "recipe": {"objective": "grow", "after": list(after)},
        "steps": 0,
        "lineage": lineage(card),
    }
    return save_checkpoint(
        target, drafter, head, grown_card, tokenizer=tokenizer, draft_vocab=drafter_vocab(source)
    )
