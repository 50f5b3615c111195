"""A batch's KV pool: the rollback caches (sd2.kv_cache) of several requests on one model, each in a slot
of one shared buffer per layer, so a ragged forward (sd2.ragged) writes every request's new keys in one
indexed copy and reads a call's keys as a view of (or one gather from) that buffer, instead of one copy
per request and layer.

A cache joins with `adopt` (its cached keys copied into a free slot once; from then on its
BucketedLayers are views of the slot, so a solo forward, a crop or a rollback on the cache writes
through to the pool) and leaves with `release` (its keys copied back into buffers of its own). The
buffers stay zero past each slot's cached length, as a BucketedLayer's do, so the invariant attention
reads a slot's keys padded without a copy (sd2.kv_cache.zero_padded): the same values in the same
layout, so the same logits bit for bit. The pool grows (more slots, or a longer capacity for every
slot) by copying into new buffers, and frees them when its last cache leaves.

Dims: S slots, H_kv key/value heads, C capacity (a multiple of CAPACITY_QUANTUM), D head dim, M rows
of a forward, E entries of an attention call, P padded keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary
from transformers import DynamicCache

from sd2.kv_cache import BucketedLayer, capacity_for, zero_tailed


class KVPool:
    """Slots for the rollback caches of one model (module doc). Not thread-safe: its batch owns it."""

    def __init__(self) -> None:
        self._keys: list[torch.Tensor] = []  # per layer [S, H_kv, C, D]
        self._values: list[torch.Tensor] = []
        self._slots: WeakIdKeyDictionary = WeakIdKeyDictionary()  # cache → its slot (a dead cache's is free)

    @property
    def capacity(self) -> int:
        """C: the tokens each slot holds."""
        return self._keys[0].shape[2] if self._keys else 0

    @property
    def size(self) -> int:
        """S: the slots, free ones included."""
        return self._keys[0].shape[0] if self._keys else 0

    def slot(self, cache: DynamicCache) -> int | None:
        """The cache's slot, None when it is not in this pool."""
        return self._slots.get(cache)

    def adopt(self, cache: DynamicCache) -> bool:
        """Move a cache into a free slot (no-op if it is in one). False, leaving it as it is, when it cannot
        join: a layer that is not a filled BucketedLayer of one sequence, or shapes unlike the pool's."""
        if cache in self._slots:
            return True
        layers = cache.layers
        if not layers or not all(
            type(layer) is BucketedLayer and layer._buffers is not None and layer._pool is None
            for layer in layers
        ):
            return False
        shapes = [layer._buffers[0].shape for layer in layers]  # [1, H_kv, C_own, D] each
        if any(shape[0] != 1 for shape in shapes):
            return False
        if self._keys and (
            len(layers) != len(self._keys)
            or any(
                (shape[1], shape[3]) != (pool.shape[1], pool.shape[3])
                or layer._buffers[0].dtype != pool.dtype
                or layer._buffers[0].device != pool.device
                for layer, shape, pool in zip(layers, shapes, self._keys, strict=True)
            )
        ):
            return False
        slot = self._free_slot()
        needed = max(shape[2] for shape in shapes)
        if slot >= self.size or needed > self.capacity:
            self._resize(max(slot + 1, self.size), max(needed, self.capacity), layers)
        for i, layer in enumerate(layers):
            for pool, own in zip((self._keys[i], self._values[i]), layer._buffers, strict=True):
                pool[slot].zero_()
                pool[slot, :, : own.shape[2]] = own[0]
            self._point(layer, i, slot)
        self._slots[cache] = slot
        return True

    def release(self, cache: DynamicCache) -> None:
        """Give a cache buffers of its own again (its keys copied out) and free its slot; the pool's
        buffers go when no cache is left in it."""
        slot = self._slots.pop(cache, None)
        if slot is None:
            return
        for layer in cache.layers:
            if layer._pool is self:
                size = capacity_for(layer._length)
                layer._buffers = tuple(zero_tailed(buffer[:, :, :size].clone()) for buffer in layer._buffers)
                layer._pool = None
        if not self._slots:
            self._keys, self._values = [], []

    def grow(self, capacity: int) -> None:
        """Every slot holds at least `capacity` tokens (BucketedLayer._grow of a pooled layer)."""
        if self._keys and capacity > self.capacity:
            self._resize(self.size, capacity, None)

    def write(
        self,
        layer: int,
        slots: torch.Tensor,  # [M] each row's slot
        positions: torch.Tensor,  # [M] each row's position in its slot
        key: torch.Tensor,  # [H_kv, M, D]
        value: torch.Tensor,  # [H_kv, M, D]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a forward's new keys and values of one layer into their slots, one indexed copy each.
        (Set the caches' lengths after: `BucketedLayer._set_length`.) Returns the layer's buffers."""
        keys, values = self._keys[layer], self._values[layer]
        keys[slots, :, positions] = key.transpose(0, 1)  # [M, H_kv, D]
        values[slots, :, positions] = value.transpose(0, 1)
        return keys, values

    def _free_slot(self) -> int:
        taken = set(self._slots.values())
        return next(slot for slot in range(self.size + 1) if slot not in taken)

    def _resize(self, slots: int, capacity: int, layers: Sequence[BucketedLayer] | None) -> None:
        """New zeroed buffers of at least `slots` slots (doubling) and `capacity` tokens, the old ones
        copied in; every cache in the pool pointed at its slot of them. `layers`: a joining cache's, for
        the shapes of a pool that has none yet."""
        old_slots, old_capacity = self.size, self.capacity
        slots = max(slots, 2 * old_slots) if slots > old_slots else old_slots
        capacity = capacity_for(capacity)
        templates = (
            [(k, v) for k, v in zip(self._keys, self._values, strict=True)]
            if self._keys
            else [layer._buffers for layer in layers]
        )
        self._keys, self._values = [], []
        for k, v in templates:
            for old, new in ((k, self._keys), (v, self._values)):
                buffer = zero_tailed(old.new_zeros(slots, old.shape[1], capacity, old.shape[3]))
                if old_slots:
                    buffer[:old_slots, :, :old_capacity] = old
                new.append(buffer)
        for cache, slot in list(self._slots.items()):
            for i, layer in enumerate(cache.layers):
                if layer._pool is self:  # not a layer that left (BucketedLayer.reset)
                    self._point(layer, i, slot)

    def _point(self, layer: BucketedLayer, index: int, slot: int) -> None:
        layer._pool = self
        layer._buffers = (self._keys[index][slot : slot + 1], self._values[index][slot : slot + 1])


def shared_pool(caches: Sequence[DynamicCache]) -> KVPool | None:
    """The pool every layer of every one of the caches is in, or None."""
    pool = getattr(caches[0].layers[0], "_pool", None) if caches and caches[0].layers else None
    if pool is None or any(
        pool.slot(cache) is None or any(getattr(layer, "_pool", None) is not pool for layer in cache.layers)
        for cache in caches
    ):
        return None
    return pool


class PooledKeys:
    """One layer's keys (or values) of a ragged forward's segments, in a pool's buffer: what block
    attention reads (sd2.block_attention.KeyList's interface)."""

    def __init__(
        self,
        buffer: torch.Tensor,  # [S, H_kv, C, D]
        slots: Sequence[int],  # each segment's slot
        lengths: Sequence[int],  # N_s: each segment's cached keys, this forward's included
        gathers: dict,  # (segments) → slot index tensor, shared by a forward's layers
    ):
        self.buffer, self.slots, self.lengths, self._gathers = buffer, tuple(slots), tuple(lengths), gathers
        self.kv_heads = buffer.shape[1]

    def entries(self, segments: tuple[int, ...], padded: int) -> torch.Tensor:
        """The segments' keys zero-padded to P: [E, H_kv, P, D]; a view where their slots are
        consecutive, else one gather."""
        capacity = self.buffer.shape[2]
        size = min(padded, capacity)
        slots = [self.slots[s] for s in segments]
        if slots == list(range(slots[0], slots[0] + len(slots))):
            out = self.buffer[slots[0] : slots[0] + len(slots), :, :size]
        else:
            index = self._gathers.get(segments)
            if index is None:
                index = self._gathers[segments] = torch.tensor(slots, device=self.buffer.device)
            out = self.buffer[:, :, :size].index_select(0, index)  # 3× faster than buffer[index]
        return F.pad(out, (0, 0, 0, padded - size)) if padded > size else out

    def segment(self, i: int) -> torch.Tensor:
        """Segment i's keys: [1, H_kv, N_i, D] (a view)."""
        slot = self.slots[i]
        return self.buffer[slot : slot + 1, :, : self.lengths[i]]
