"""Batch-invariant attention in query blocks: the causal attention of one request's new tokens, or of
several requests' at once (a ragged forward, sd2.ragged), each token's result the same bit for bit
whatever else the call holds.

Layout (per forward; the same for every layer, built once):
  - a *piece* is the new tokens of one request whose keys pad to the same length P (the next multiple of
    KEY_BUCKET of what the token sees; zero keys appended, masked);
  - a piece is one batch entry of an SDPA call: its tokens' G query heads per KV head as rows, token after
    token, zero rows appended up to R, a multiple of the probed quantum (padding rows see key 0 only);
  - the pieces that share P are the entries of one call, their keys stacked (R: the largest piece's).
SDPA's CPU kernels give a row the same result whatever the other rows of its entry, R (a multiple of the
quantum) and the other entries (a block whose last tile holds 1–3 rows differs), which `query_quantum`
probes once per shape on random data. So a token's attention in a verify equals its 1-token forward's,
and a request's in a ragged forward equals its solo forward's.

Dims: H heads, H_kv KV heads, G = H / H_kv, D head dim, M new tokens of the forward, N_s keys of segment s,
P padded keys, E entries of a call, R rows per entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from sd2.kv_cache import zero_padded

KEY_BUCKET = 64  # attention reduces over keys padded to a multiple of this, whatever the forward holds
QUANTA = (4, 8, 16, 32)  # the row quanta `query_quantum` tries, cheapest first
PROBE_KEYS = (2 * KEY_BUCKET, 10 * KEY_BUCKET)  # key lengths the probe tries


class KeyList:
    """The segments' keys (or values) as tensors [H_kv, N_s, D] (a segment's cache with its new keys
    last): what `block_attention` reads. sd2.kv_pool.PooledKeys is the same for keys in a KV pool."""

    def __init__(self, tensors: Sequence[torch.Tensor]):
        self.tensors = list(tensors)
        self.lengths = tuple(t.shape[1] for t in self.tensors)  # N_s
        self.kv_heads = self.tensors[0].shape[0]

    def entries(self, segments: tuple[int, ...], padded: int) -> torch.Tensor:
        """The segments' keys zero-padded to P: [E, H_kv, P, D] (a view for one)."""
        if len(segments) == 1:
            return pad_keys(self.tensors[segments[0]], padded)[None]
        return torch.stack([pad_keys(self.tensors[s], padded) for s in segments])

    def segment(self, s: int) -> torch.Tensor:
        """Segment s's keys: [1, H_kv, N_s, D]."""
        return self.tensors[s][None]


def block_attention(
    query: torch.Tensor,  # [H, M, D] the new tokens of every segment, in segment order
    keys: KeyList | Sequence[torch.Tensor],  # each segment's keys (a list: [H_kv, N_s, D] each)
    values: KeyList | Sequence[torch.Tensor],  # the same for values
    tokens: Sequence[int],  # T_s: each segment's new tokens (Σ = M)
    scaling: float,
    quantum: int,  # from `query_quantum`
) -> torch.Tensor:
    """Causal attention of each segment's new tokens over its own keys, in the module doc's layout.
    Returns [H, M, D]."""
    keys, values = (t if hasattr(t, "entries") else KeyList(t) for t in (keys, values))
    heads, rows, dim = query.shape
    kv_heads = keys.kv_heads
    group = heads // kv_heads
    shape = tuple(zip(tokens, keys.lengths, strict=True))
    grouped = query.reshape(kv_heads, group, rows, dim).transpose(1, 2).reshape(kv_heads, rows * group, dim)
    calls = _layout(shape, group, quantum, query.device, query.dtype)
    if len(calls) == 1 and len(calls[0].segments) == 1:  # one piece: its block as it is, zero rows appended
        call = calls[0]
        q = F.pad(grouped, (0, 0, 0, call.mask.shape[2] - rows * group))[None]  # [1, H_kv, R, D]
        k, v = (t.entries(call.segments, call.padded_keys) for t in (keys, values))  # [1, H_kv, P, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=call.bias, scale=scaling)
        out = out[0, :, : rows * group]
    else:
        out = _calls_attention(grouped, keys, values, calls, scaling)
    return out.reshape(kv_heads, rows, group, dim).transpose(1, 2).reshape(heads, rows, dim)


def _calls_attention(
    grouped: torch.Tensor,  # [H_kv, M·G, D] token-major query rows
    keys: KeyList,
    values: KeyList,
    calls: Sequence[_Call],
    scaling: float,
) -> torch.Tensor:
    """The calls of a layout, their entries' rows gathered from and put back among the grouped rows.
    Returns [H_kv, M·G, D]."""
    kv_heads, _, dim = grouped.shape
    out = torch.empty_like(grouped)
    grouped = torch.cat([grouped, grouped.new_zeros(kv_heads, 1, dim)], dim=1)  # [H_kv, M·G + 1, D]
    for call in calls:
        q = grouped[:, call.rows].transpose(0, 1)  # [E, H_kv, R, D]
        k, v = (t.entries(call.segments, call.padded_keys) for t in (keys, values))  # [E, H_kv, P, D]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=call.bias, scale=scaling)  # [E, H_kv, R, D]
        out[:, call.targets] = o.transpose(0, 1).reshape(kv_heads, -1, dim)[:, call.sources]
    return out


@dataclass(frozen=True)
class _Call:
    """One SDPA call of a layout: the pieces whose keys pad to P."""

    segments: tuple[int, ...]  # [E] each entry's segment
    padded_keys: int  # P
    rows: torch.Tensor  # [E, R] each entry row's row among the M·G grouped ones (M·G: the zero row)
    mask: torch.Tensor  # [E, 1, R, P] True where a row may see a key
    bias: torch.Tensor  # the mask as SDPA adds it: 0 where seen, −inf elsewhere, in the query dtype (the
    # same results as the boolean mask, without its conversion on every call)
    sources: torch.Tensor  # [n] the real rows among the call's E·R output rows
    targets: torch.Tensor  # [n] where they go among the M·G grouped rows


@lru_cache(maxsize=256)
def _layout(
    shape: tuple[tuple[int, int], ...], group: int, quantum: int, device: torch.device, dtype: torch.dtype
) -> tuple[_Call, ...]:
    """The calls of a forward whose segments have `shape`: (new tokens T_s, keys N_s) each. Token t of
    segment s sees N_s − T_s + t + 1 keys (causal)."""
    pieces: dict[int, list[tuple[int, int, torch.Tensor]]] = {}  # P → (segment, first row, visible [T_p])
    first = 0
    for segment, (tokens, n_keys) in enumerate(shape):
        visible = n_keys - tokens + 1 + torch.arange(tokens)  # [T_s]
        padded = (visible + KEY_BUCKET - 1) // KEY_BUCKET * KEY_BUCKET  # [T_s], non-decreasing
        for size in padded.unique(sorted=True).tolist():
            chosen = (padded == size).nonzero().flatten()
            a, b = int(chosen[0]), int(chosen[-1]) + 1
            pieces.setdefault(size, []).append((segment, first + a, visible[a:b]))
        first += tokens
    zero_row = first * group
    calls = []
    for size, entries in sorted(pieces.items()):
        block = max(_block_rows(len(visible), group, quantum) for _, _, visible in entries)
        rows = torch.full((len(entries), block), zero_row)
        mask = torch.zeros(len(entries), block, size, dtype=torch.bool)
        mask[:, :, 0] = True
        sources, targets = [], []
        for e, (_, start, visible) in enumerate(entries):
            n = len(visible) * group
            rows[e, :n] = torch.arange(start * group, start * group + n)
            mask[e, :n] = torch.arange(size) < visible.repeat_interleave(group)[:, None]
            sources.extend(range(e * block, e * block + n))
            targets.extend(range(start * group, start * group + n))
        calls.append(
            _Call(
                tuple(segment for segment, _, _ in entries),
                size,
                rows.to(device),
                mask[:, None].to(device),
                torch.zeros(mask[:, None].shape, dtype=dtype)
                .masked_fill(~mask[:, None], float("-inf"))
                .to(device),
                torch.tensor(sources, device=device),
                torch.tensor(targets, device=device),
            )
        )
    return tuple(calls)


def _block_rows(tokens: int, group: int, quantum: int) -> int:
    """Rows of an entry holding `tokens` tokens' G query rows: the next multiple of the quantum."""
    return -(-tokens * group // quantum) * quantum


def pad_keys(tensor: torch.Tensor, padded: int) -> torch.Tensor:
    """[H_kv, N, D] → [H_kv, P, D]: zero rows appended (they are masked out); a view where the keys sit
    in a rollback cache's zero-tailed buffer (sd2.kv_cache.zero_padded), else a copy."""
    view = zero_padded(tensor, padded)
    if view is not None:
        return view
    missing = padded - tensor.shape[1]
    return F.pad(tensor, (0, 0, 0, missing)) if missing > 0 else tensor[:, :padded]


@lru_cache(maxsize=64)
def query_quantum(
    kv_heads: int, group: int, dim: int, dtype: torch.dtype, device: torch.device, max_tokens: int
) -> int:
    """The smallest of QUANTA for which `block_attention` is invariant here, probed on random data at
    two key lengths: every token of a T-token segment (T ≤ max_tokens) equals its 1-token call, and
    segments sharing a call equal their own calls; 0 when none is (the caller then computes each token
    apart)."""
    for quantum in QUANTA:
        generator = torch.Generator().manual_seed(0)
        if all(
            _tokens_invariant(quantum, kv_heads, group, dim, n_keys, max_tokens, generator, dtype, device)
            and _segments_invariant(quantum, kv_heads, group, dim, n_keys, generator, dtype, device)
            for n_keys in PROBE_KEYS
        ):
            return quantum
    return 0


def _random(shape: tuple[int, ...], generator: torch.Generator, dtype, device) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).to(device, dtype)


def _tokens_invariant(quantum, kv_heads, group, dim, n_keys, max_tokens, generator, dtype, device) -> bool:
    tokens = min(max_tokens, n_keys)
    query = _random((kv_heads * group, tokens, dim), generator, dtype, device)  # [H, T, D]
    key, value = (_random((kv_heads, n_keys, dim), generator, dtype, device) for _ in "kv")
    scaling = dim**-0.5

    def attend(first: int, last: int) -> torch.Tensor:  # tokens first..last, the last one seeing all keys
        n = n_keys - (tokens - last)
        count = last - first
        return block_attention(query[:, first:last], [key[:, :n]], [value[:, :n]], [count], scaling, quantum)

    single = torch.cat([attend(t, t + 1) for t in range(tokens)], dim=1)  # [H, T, D]
    return all(torch.equal(attend(tokens - n, tokens), single[:, tokens - n :]) for n in range(2, tokens + 1))


def _segments_invariant(quantum, kv_heads, group, dim, n_keys, generator, dtype, device) -> bool:
    counts = [1, 3, 2, 5, 1, 9, 4]  # new tokens of each segment; keys n_keys − s (same bucket but the last)
    lengths = [n_keys - s for s in range(len(counts) - 1)] + [n_keys + 1]
    query = _random((kv_heads * group, sum(counts), dim), generator, dtype, device)
    keys = [_random((kv_heads, n, dim), generator, dtype, device) for n in lengths]
    values = [_random((kv_heads, n, dim), generator, dtype, device) for n in lengths]
    scaling = dim**-0.5
    together = block_attention(query, keys, values, counts, scaling, quantum)
    first = 0
    for count, key, value in zip(counts, keys, values, strict=True):
        alone = block_attention(query[:, first : first + count], [key], [value], [count], scaling, quantum)
        if not torch.equal(together[:, first : first + count], alone):
            return False
        first += count
    return True
