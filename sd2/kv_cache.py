"""A KV cache speculative decoding can roll back: every draft the verifier rejects is cropped off again.

transformers' `DynamicCache(config=...)` keeps only the last `sliding_window - 1` keys of a
sliding-window layer (Mistral, Qwen2 with `use_sliding_window`, Gemma's local layers) and refuses to crop
once the window is full. With past recording on, such a layer holds every key until the next `crop`,
which then trims it back to the window: rejected drafts can be removed at any length, and the layer
stays at its working size as long as each block ends with a crop (`crop(0)` trims, and leaves
full-attention layers as they are). The attention mask applies the window either way, so the logits
are those of the model's own sliding-window attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache


def rollback_cache(model: nn.Module) -> DynamicCache:
    """An empty cache for `model` (its layer types from its config) that any `crop(-n)` can roll back."""
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache


def cached_forward(
    model: nn.Module, ids: Sequence[int], cache: DynamicCache, last_only: bool
) -> torch.Tensor:
    """Cached forward of a few new tokens. Returns logits [T, V] (or [1, V] when last_only)."""
    device = model.get_input_embeddings().weight.device
    input_ids = torch.tensor([list(ids)], device=device)  # [1, T]
    out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1 if last_only else 0)
    return out.logits[0]


def crop_to(cache: DynamicCache, length: int) -> None:
    """Roll a rollback cache back to its first `length` tokens (also at 0 surplus: sliding-window
    layers trim back to their window)."""
    cache.crop(-max(cache.get_seq_length() - length, 0))
