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

from torch import nn
from transformers import DynamicCache


def rollback_cache(model: nn.Module) -> DynamicCache:
    """An empty cache for `model` (its layer types from its config) that any `crop(-n)` can roll back."""
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache
