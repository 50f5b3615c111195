"""Drafters cut from the verifier: depth pruning by block importance, width pruning by activation importance.

Pruning a model and distilling the pruned copy needs a small fraction of the tokens training from scratch
needs (Minitron; Sheared-LLaMA), and the copy shares the verifier's embeddings and tokenizer by
construction. Measured on calibration text (never the held-out prompts):

  block importance  of decoder layer i: the mean angular distance arccos(cos(h_in, h_out)) / π between
                    the hidden states entering and leaving it, over every calibration token (ShortGPT's
                    and Minitron's depth criterion): a layer that barely turns the residual stream is the
                    first to go. The `layers` most important layers are kept, in their order.
  channel importance of MLP channel c in a kept layer: the mean |act(gate(x)) · up(x)|_c over calibration
                    tokens (Minitron's activation criterion); `ffn` keeps the top channels of each layer
                    (rows of gate_proj and up_proj, columns of down_proj).

The embeddings, the final norm and the LM head are the verifier's; a reduced draft vocabulary can be taken
from another drafter. The result is an fp32 checkpoint for `sd2 train distill|sd2|lockstep --from`; its
card records the kept layers and width, both importance measures and the calibration text.

Dims: L layers, L' kept, T calibration tokens per row, D hidden, F MLP width, F' kept width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from sd2.architecture import decoder_layers, mlp

IMPORTANCE = "angular distance arccos(cos(h_in, h_out)) / pi, mean over calibration tokens"
CHANNEL_IMPORTANCE = "mean |act(gate(x)) * up(x)| over calibration tokens"


@torch.no_grad()
def layer_importance(model: nn.Module, rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """Each decoder layer's block importance over the calibration rows (token id lists). Returns [L]."""
    layers = decoder_layers(model)[: model.config.num_hidden_layers]
    sums = torch.zeros(len(layers), dtype=torch.float64)

    def hook(index: int):
        def record(module, args, kwargs, output):
            entering = args[0] if args else kwargs["hidden_states"]
            leaving = output[0] if isinstance(output, tuple) else output
            cos = torch.nn.functional.cosine_similarity(entering.double(), leaving.double(), dim=-1)
            sums[index] += (torch.arccos(cos.clamp(-1, 1)) / math.pi).sum()

        return record

    handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    return (sums / _calibrate(model, rows, handles)).float()


@torch.no_grad()
def channel_importance(model: nn.Module, rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """Each layer's MLP channel importance over the calibration rows. Returns [L, F]."""
    n_layers = model.config.num_hidden_layers
    sums = torch.zeros(n_layers, model.config.intermediate_size, dtype=torch.float64)

    def hook(index: int):
        def record(module, args):
            sums[index] += args[0].abs().double().reshape(-1, args[0].shape[-1]).sum(0)

        return record

    handles = [mlp(model, i).down_proj.register_forward_pre_hook(hook(i)) for i in range(n_layers)]
    return (sums / _calibrate(model, rows, handles)).float()


def _calibrate(model: nn.Module, rows: Sequence[Sequence[int]], handles: list) -> int:
    """Forward every calibration row with the hooks of `handles` recording, then remove them. Returns
    the number of tokens seen (at least 1, the divisor of a mean)."""
    try:
        for row in rows:
            model(input_ids=_ids(model, row), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return max(sum(map(len, rows)), 1)


def calibration_rows(source: str, tokenizer, rows: int, tokens: int) -> list[list[int]]:
    """Up to `rows` calibration rows of at most `tokens` tokens: a training data source by name (its
    train split: `sd2.train.sources`), or `text:PATH`, a plain text file cut into rows."""
    if source.startswith("text:"):
        ids = tokenizer(Path(source.removeprefix("text:")).read_text())["input_ids"]
        return [ids[i : i + tokens] for i in range(0, len(ids), tokens)][:rows]
    from sd2.data.batches import ShardSet
    from sd2.data.shards import ShardConfig
    from sd2.train.sources import shard_folder

    shards = ShardSet(shard_folder(source, "train", tokenizer, ShardConfig()))
    count = min(rows, len(shards))
    return [shards.input_ids[i, : min(int(shards.lengths[i]), tokens)].tolist() for i in range(count)]


def _ids(model: nn.Module, row: Sequence[int]) -> torch.Tensor:
    return torch.tensor([list(row)], device=model.get_input_embeddings().weight.device)  # [1, T]


def kept_layers(importance: torch.Tensor, layers: int) -> list[int]:
    """The `layers` most important layers, in their order in the model."""
    if not 1 <= layers <= importance.shape[0]:
        raise ValueError(f"--layers must be in 1..{importance.shape[0]}, got {layers}")
    return sorted(importance.topk(layers).indices.tolist())


@torch.no_grad()
def cut(
    model: nn.Module, keep: Sequence[int], channels: torch.Tensor | None = None, ffn: int | None = None
) -> nn.Module:
    """A copy of `model` (a Llama-family causal LM) with only the `keep` layers and, with `ffn`, the top
    `ffn` MLP channels of each by `channels` ([L, F]); fp32, in eval mode, its LM head tied as the
    source's is."""
    decoder_layers(model)  # refuses unsupported layouts with a clear error
    n_layers, width = model.config.num_hidden_layers, model.config.intermediate_size
    if not keep or sorted(set(keep)) != list(keep) or not all(0 <= i < n_layers for i in keep):
        raise ValueError(f"layers to keep must be increasing indices in 0..{n_layers - 1}, got {list(keep)}")
    if ffn is not None and (not 1 <= ffn <= width or channels is None):
        raise ValueError(f"--ffn must be in 1..{width} (with channel importance), got {ffn}")
    raw = model.config.to_dict()
    raw.pop("layer_types", None)  # one entry per layer: rebuilt for the new depth
    config = type(model.config).from_dict(
        {**raw, "num_hidden_layers": len(keep), "intermediate_size": ffn or width}
    )
    with torch.random.fork_rng(devices=[]):  # every weight is set below: leave the global RNG alone
        pruned = type(model)(config)
    source = {key: value.detach().float() for key, value in model.state_dict().items()}
    state = {key: value.clone() for key, value in source.items() if not key.startswith("model.layers.")}
    for new_index, layer in enumerate(keep):
        prefix = f"model.layers.{layer}."
        chosen = channels[layer].topk(ffn).indices.sort().values if ffn else None  # [F']
        for key, value in source.items():
            if not key.startswith(prefix):
                continue
            rest = key.removeprefix(prefix)
            if chosen is not None and rest.startswith(("mlp.gate_proj.", "mlp.up_proj.")):
                value = value[chosen]
            elif chosen is not None and rest == "mlp.down_proj.weight":
                value = value[:, chosen]
            state[f"model.layers.{new_index}.{rest}"] = value.clone()
    result = pruned.load_state_dict(state, strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:  # lm_head: tied below
        raise ValueError(f"cannot prune {type(model).__name__}: {result}")
    pruned.tie_weights()
    pruned.generation_config = model.generation_config
    return pruned.to(torch.float32).eval()


def prune_checkpoint(
    verifier: nn.Module,
    verifier_name: str,
    tokenizer,
    target: str | Path,
    calibration: Sequence[Sequence[int]],
    calibration_source: str,
    layers: int | None = None,
    keep: Sequence[int] | None = None,
    ffn: int | None = None,
    draft_vocab=None,
) -> Path:
    """Cut a drafter from `verifier` (its `layers` most important layers, or the `keep` list; with
    `ffn`, its MLPs narrowed) and write it to `target` as a checkpoint with its card."""
    from sd2.train.checkpoint import save_checkpoint

    if (layers is None) == (keep is None):
        raise ValueError("give exactly one of --layers or --keep")
    if not calibration:
        raise ValueError("pruning needs calibration text: no rows")
    importance = layer_importance(verifier, calibration)
    chosen = kept_layers(importance, layers) if layers is not None else sorted(keep)
    channels = channel_importance(verifier, calibration) if ffn is not None else None
    drafter = cut(verifier, chosen, channels, ffn)
    card = {
        "initialised_from": verifier_name,
        "pruned": {
            "from": verifier_name,
            "layers_kept": chosen,
            "layers_of": verifier.config.num_hidden_layers,
            "ffn": ffn or verifier.config.intermediate_size,
            "ffn_of": verifier.config.intermediate_size,
            "layer_importance": [round(float(x), 6) for x in importance],
            "importance": IMPORTANCE,
            "channel_importance": CHANNEL_IMPORTANCE if ffn is not None else None,
            "calibration": {
                "source": calibration_source,
                "rows": len(calibration),
                "tokens": sum(map(len, calibration)),
            },
        },
        "recipe": {"objective": "prune", "layers": layers, "keep": list(keep) if keep else None, "ffn": ffn},
        "steps": 0,
        "lineage": [],
    }
    return save_checkpoint(target, drafter, None, card, tokenizer=tokenizer, draft_vocab=draft_vocab)
