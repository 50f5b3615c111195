"""A KV cache speculative decoding can roll back: every draft the verifier rejects is cropped off again.

transformers' `DynamicCache(config=...)` keeps only the last `sliding_window - 1` keys of a
sliding-window layer (Mistral, Qwen2 with `use_sliding_window`, Gemma's local layers) and refuses to crop
once the window is full. With past recording on, such a layer holds every key until the next `crop`,
which then trims it back to the window: rejected drafts can be removed at any length, and the layer
stays at its working size as long as each block ends with a crop (`crop(0)` trims, and leaves
full-attention layers as they are). The attention mask applies the window either way, so the logits
are those of the model's own sliding-window attention.

Full-attention layers are `BucketedLayer`s: keys and values at the front of a zeroed buffer, written in
place (transformers' `DynamicLayer` copies the whole cache into a new tensor on every update), and
zeroed again where a crop drops them. So the buffer is zero past the cached length, and the invariant
attention (sd2.invariant), which attends over keys zero-padded to a bucket, reads them padded as a view
(`zero_padded`) instead of copying them on every call: the same values, so the same logits. A batch may
move a layer's buffers into a slot of a pool shared by several requests (sd2.kv_pool); the layer then
writes through its slot and asks the pool to grow.

Dims: B batch, H_kv key/value heads, N cached tokens, C buffer capacity, P padded keys, D head dim.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

CAPACITY_QUANTUM = 256  # a bucketed layer's buffer grows in whole multiples of this many tokens

_ZERO_TAILED: dict[int, int] = {}  # a live BucketedLayer buffer's storage address → its capacity C


class BucketedLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values [B, H_kv, N, D] are views of the front of
    buffers [B, H_kv, C, D] that are zero past N (module docstring)."""

    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # [B, H_kv, C, D] each, once filled
    _length = 0  # N
    _pool = None  # the sd2.kv_pool.KVPool whose slot the buffers are views of, if any
    _unbuffered: tuple = (None, None)  # keys and values as DynamicLayer sets them before any buffer

    @property
    def keys(self) -> torch.Tensor | None:
        """[B, H_kv, N, D]: a view of the buffer's front (made when read, so a length change is free)."""
        return self._buffers[0][..., : self._length, :] if self._buffers is not None else self._unbuffered[0]

    @keys.setter
    def keys(self, keys: torch.Tensor | None) -> None:
        self._unbuffered = (keys, self._unbuffered[1])

    @property
    def values(self) -> torch.Tensor | None:
        return self._buffers[1][..., : self._length, :] if self._buffers is not None else self._unbuffered[1]

    @values.setter
    def values(self, values: torch.Tensor | None) -> None:
        self._unbuffered = (self._unbuffered[0], values)

    def get_seq_length(self) -> int:
        return self._length if self._buffers is not None else 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys and values [B, H_kv, T, D] after the cached ones; returns all of them."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._buffers is None or end > self._buffers[0].shape[-2]:
            self._grow(end, key_states, value_states)
        for buffer, new in zip(self._buffers, (key_states, value_states), strict=True):
            buffer[..., self._length : end, :] = new
        self._set_length(end)
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` tokens (a negative count, as DynamicLayer's), zeroing them."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, not {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized or self._buffers is None:
            return
        end = max(self._length + tokens_to_remove, 0)
        for buffer in self._buffers:
            buffer[..., end : self._length, :] = 0
        self._set_length(end)

    def reset(self) -> None:
        """Forget every key; a pooled layer zeroes its slot's front and leaves the pool (the slot stays
        its cache's until the pool releases the cache)."""
        if self._pool is not None:
            for buffer in self._buffers:
                buffer[..., : self._length, :] = 0
            self._pool = None
        self._buffers, self._length = None, 0
        super().reset()

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a rollback cache holds one sequence")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("a rollback cache holds one sequence")

    def _set_length(self, length: int) -> None:
        self._length = length

    def _grow(self, needed: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """New zeroed buffers of a capacity ≥ needed (at least double the old), the cached rows copied;
        a pooled layer's pool grows instead (and points the layer at its new slot)."""
        old = self._buffers[0].shape[-2] if self._buffers is not None else 0
        capacity = max(capacity_for(needed), 2 * old)
        if self._pool is not None:
            self._pool.grow(capacity)
            return
        grown = []
        for i, new in enumerate((key_states, value_states)):
            buffer = zero_tailed(new.new_zeros(*new.shape[:-2], capacity, new.shape[-1]))  # [B, H_kv, C, D]
            if self._buffers is not None:
                buffer[..., : self._length, :] = self._buffers[i][..., : self._length, :]
            grown.append(buffer)
        self._buffers = (grown[0], grown[1])


def capacity_for(tokens: int) -> int:
    """The buffer capacity that holds `tokens`: the next whole multiple of CAPACITY_QUANTUM."""
    return max(-(-tokens // CAPACITY_QUANTUM), 1) * CAPACITY_QUANTUM


def zero_tailed(buffer: torch.Tensor) -> torch.Tensor:
    """Register a buffer [S, H_kv, C, D] that its owner keeps zero past each entry's cached length, so
    `zero_padded` may read keys at the front of any of its entries padded as a view. Returns it."""
    address = buffer.untyped_storage().data_ptr()
    _ZERO_TAILED[address] = buffer.shape[-2]
    weakref.finalize(buffer, _ZERO_TAILED.pop, address, None)
    return buffer


def zero_padded(tensor: torch.Tensor, padded: int) -> torch.Tensor | None:
    """Keys (or values) [H_kv, N, D] that are the front of an entry of a zero-tailed buffer (a
    BucketedLayer's, or a slot of a pool's: `zero_tailed`) → the first `padded` rows of that entry
    [H_kv, P, D] as a view: the keys zero-padded to P (or cut to P) without a copy. None when the tensor
    is not such a view or the buffer is shorter than P."""
    capacity = _ZERO_TAILED.get(tensor.untyped_storage().data_ptr())
    if (
        capacity is None
        or padded > capacity
        or tensor.dim() != 3
        or tensor.storage_offset() % (tensor.shape[0] * capacity * tensor.shape[-1]) != 0
        or tensor.stride() != (capacity * tensor.shape[-1], tensor.shape[-1], 1)
    ):
        return None
    return tensor.as_strided((tensor.shape[0], padded, tensor.shape[-1]), tensor.stride())


def rollback_cache(model: nn.Module) -> DynamicCache:
    """An empty cache for `model` (its layer types from its config) that any `crop(-n)` can roll back;
    its full-attention layers are BucketedLayers."""
    cache = DynamicCache(config=model.config)
    cache.layers = [BucketedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
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
