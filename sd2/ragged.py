"""A ragged forward: the new tokens of several requests in one forward, each on its own KV cache.

Rows of every request are concatenated into one [1, M] sequence, so the linears (which carry almost all
of a model's weights) run once over M rows; each request's rows then attend only to its own cache. With
a batch-invariant model (sd2.invariant: row-invariant linears, attention computed per token) every
row's result equals the one it has in the request's own forward, bit for bit, whatever else shares the
forward (docs/lossless.md). The decoder layers run their own code (norms, rotary embeddings, MLP,
steering hooks): only the layer loop of the model's `forward` is written here, and `cache.update`
hands each request's keys and values to its own cache — where every request's cache sits in one KV
pool (sd2.kv_pool: a batch's), as one indexed copy per layer, and attention reads them from the pool.

Dims: M rows of all segments, T_r rows of segment r, H_kv key/value heads, N_r keys of segment r, D.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache

from sd2.architecture import decoder_layers
from sd2.block_attention import KeyList
from sd2.kv_pool import PooledKeys, shared_pool


class RaggedKeys:
    """The full keys (or values) of each segment after a layer's cache update, as a layer hands them to
    its attention function (`sd2.invariant.invariant_attention`): `segments` for block attention (a
    KeyList, or PooledKeys in a pool), `segment(r)` one segment's [1, H_kv, N_r, D]."""

    def __init__(self, segments: KeyList | PooledKeys, bounds: Sequence[tuple[int, int]]):
        self.segments = segments
        self.bounds = tuple(bounds)  # (first row, end row) of each segment among the M rows

    def segment(self, r: int) -> torch.Tensor:
        return self.segments.segment(r)


class RaggedCache:
    """The caches of a ragged forward's segments behind the one `update` call a decoder layer makes."""

    def __init__(
        self,
        caches: Sequence[DynamicCache],
        bounds: Sequence[tuple[int, int]],
        positions: torch.Tensor,  # [M] each row's position in its own sequence
    ):
        self.caches, self.bounds = list(caches), list(bounds)
        self.pool = shared_pool(self.caches)
        if self.pool is not None:
            self.slots = [self.pool.slot(cache) for cache in self.caches]
            self.lengths = [int(positions[last - 1]) + 1 for _, last in self.bounds]  # N_r after the update
            self.pool.grow(max(self.lengths))
            rows = [last - first for first, last in self.bounds]
            self.row_slots = torch.tensor(self.slots, device=positions.device).repeat_interleave(
                torch.tensor(rows, device=positions.device)
            )  # [M]
            self.positions = positions
            self.gathers: dict = {}  # shared by the layers' PooledKeys

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key, value: [1, H_kv, M, D] → each segment's full keys and values (RaggedKeys)."""
        if self.pool is not None:
            buffers = self.pool.write(layer_idx, self.row_slots, self.positions, key[0], value[0])
            for cache, length in zip(self.caches, self.lengths, strict=True):
                cache.layers[layer_idx]._set_length(length)
            keys, values = (PooledKeys(b, self.slots, self.lengths, self.gathers) for b in buffers)
            return RaggedKeys(keys, self.bounds), RaggedKeys(values, self.bounds)
        keys, values = [], []
        for cache, (first, last) in zip(self.caches, self.bounds, strict=True):
            k, v = cache.update(key[:, :, first:last], value[:, :, first:last], layer_idx)
            keys.append(k[0])
            values.append(v[0])
        return RaggedKeys(KeyList(keys), self.bounds), RaggedKeys(KeyList(values), self.bounds)


@dataclass(frozen=True)
class Segment:
    """One request's part of a ragged forward: its new token ids and its cache."""

    ids: Sequence[int]
    cache: DynamicCache
    all_logits: bool = True  # logits at every new row, else only at the last one


def supports_ragged(model: nn.Module) -> bool:
    """Whether `ragged_forward` can run this model: a decoder with embed_tokens, rotary_emb, norm and full
    attention in every layer (Llama, Qwen2/3 without sliding windows, SmolLM)."""
    decoder = model.get_decoder()
    layer_types = getattr(model.config, "layer_types", None) or ["full_attention"]
    return (
        all(hasattr(decoder, name) for name in ("embed_tokens", "rotary_emb", "norm", "layers"))
        and set(layer_types) == {"full_attention"}
        and not getattr(model.config, "sliding_window", None)
    )


def ragged_forward(
    model: nn.Module, segments: Sequence[Segment], head: nn.Module | None = None
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """One forward over every segment's new tokens, each cached in and attending to its own cache.

    Returns (logits per segment: [T_r, V] or [1, V] when not `all_logits`, the last hidden states
    [M, D] after the final norm). `head` replaces the model's LM head (e.g. a reduced draft head).
    Hooks see one [1, M, ·] call per module: steering biases must hold one row per row fed.
    """
    decoder = model.get_decoder()
    device = decoder.embed_tokens.weight.device
    bounds, ids, positions, first = [], [], [], 0
    for segment in segments:
        n = len(segment.ids)
        if n == 0:
            raise ValueError("a ragged forward's segment needs at least one new token")
        past = segment.cache.get_seq_length()
        bounds.append((first, first + n))
        ids.extend(segment.ids)
        positions.extend(range(past, past + n))
        first += n
    input_ids = torch.tensor([ids], device=device)  # [1, M]
    position_ids = torch.tensor([positions], device=device)  # [1, M]
    cache = RaggedCache([s.cache for s in segments], bounds, position_ids[0])
    hidden = decoder.embed_tokens(input_ids)  # [1, M, D]
    position_embeddings = decoder.rotary_emb(hidden, position_ids=position_ids)
    for layer in decoder_layers(model)[: model.config.num_hidden_layers]:
        hidden = layer(
            hidden,
            attention_mask=None,
            position_embeddings=position_embeddings,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
        )
    hidden = decoder.norm(hidden)[0]  # [M, D]
    rows = [
        torch.arange(a, b) if segment.all_logits else torch.tensor([b - 1])
        for segment, (a, b) in zip(segments, bounds, strict=True)
    ]
    kept = torch.cat(rows).to(device)
    logits = (head or model.get_output_embeddings())(hidden[kept])  # [Σ kept, V]
    return list(logits.split([len(r) for r in rows])), hidden
