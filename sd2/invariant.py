"""A batch-invariant verifier forward: row i of a T-token cached forward equals a 1-token one, bit for bit.

Speculative decoding is exact only if a position's verifier logits do not depend on how many tokens the
forward holds: 1 in the verifier-only loop, k+1 in a verify step (docs/lossless.md). Stock CPU kernels
break that in two places, measured on the embedded SmolLM2 (2-core AMD Zen 5):
  - `F.linear` picks its kernel by row count: in bf16 a 1-row product (oneDNN's GEMV path) differs from
    row i of an M-row one for `down_proj`'s 576×1536 weight, while every M ≥ 2 agrees with every other;
    in fp32 (MKL sgemm) no shape is invariant, but (W @ xᵀ)ᵀ with at least 2 columns is.
  - SDPA packs a single query differently (GQA packing, no mask) and reduces over as many keys as the
    forward holds, so a verify row sums over masked tail keys that its 1-token twin never saw.
The invariant path therefore computes every linear with at least `MIN_ROWS` rows, and attention for
batch 1 with keys padded to a multiple of `KEY_BUCKET` (masked), at least `MIN_ROWS` query rows per GEMM
and rows grouped by their padded key length, so a row's reductions have the same shape and kernel
whichever forward it sits in. Larger forwards (prefill of a long prompt, training batches) use the
stock kernels: they are the same in both loops.

Dims: B batch, T query rows, H heads, H_kv key/value heads, N keys, P padded keys, D head dim.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

INVARIANT_ATTENTION = "sd2_batch_invariant"
MIN_ROWS = 2  # a 1-row product takes a GEMV kernel whose sums differ from the GEMM's: pad to 2 rows
MAX_ROWS = 128  # forwards of more rows than any verify (k ≤ 64) keep the stock kernels
KEY_BUCKET = 64  # attention reduces over keys padded to a multiple of this, whatever the forward holds


STOCK, PAD, COLUMNS, ROWS = "stock", "pad", "columns", "rows"  # the layouts, cheapest first
PROBE_ROWS = 17  # probed row counts 1..17 (a verify at k ≤ 16); the real-model tests check whole forwards


class RowInvariantLinear(nn.Linear):
    """An `nn.Linear` whose row i does not depend on how many rows the call holds (up to MAX_ROWS).

    The layout (PAD or COLUMNS) depends on the weight's shape and the machine's kernels, probed once
    per shape by `make_batch_invariant`, which leaves linears that need neither as they are.
    """

    layout: str = PAD

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] → [..., out]
        rows = x.reshape(-1, x.shape[-1])  # [M, in]
        if rows.shape[0] > MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        out = rows_product(rows, self.weight, self.bias, self.layout)  # [M, out]
        return out.reshape(*x.shape[:-1], self.out_features)


def rows_product(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layout: str
) -> torch.Tensor:
    """rows [M, in] → [M, out] in a layout: STOCK is `F.linear`; PAD gives a 1-row call a zero second
    row (the 1-row GEMV kernel sums in another order than the GEMM); COLUMNS also pads and computes
    (W rowsᵀ)ᵀ, for kernels (MKL's fp32 sgemm) whose row results depend on the row count; ROWS, the
    last resort, multiplies each row on its own as the first of a padded pair (invariant by
    construction, M products)."""
    m = rows.shape[0]
    if layout == ROWS:
        return torch.cat([rows_product(rows[i : i + 1], weight, bias, PAD) for i in range(m)])
    if layout == STOCK or (layout == PAD and m >= MIN_ROWS):
        return F.linear(rows, weight, bias)
    if m < MIN_ROWS:
        rows = torch.cat([rows, rows.new_zeros(MIN_ROWS - m, rows.shape[1])])  # [MIN_ROWS, in]
    if layout == PAD:
        return F.linear(rows, weight, bias)[:m]
    # contiguous, since elementwise kernels round differently on strided inputs
    out = (weight @ rows.T).T[:m].contiguous()
    return out + bias if bias is not None else out


@lru_cache(maxsize=256)
def layout_for(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> str:
    """The cheapest layout in which row i of an M-row product equals the 1-row product, M ≤ PROBE_ROWS.

    Kernels are chosen by shape, not data, so probe rows reveal a row-count dependence, provided a
    different summation order shows in the rounded result (see `_probe`). ROWS when no faster layout
    is invariant.
    """
    generator = torch.Generator().manual_seed(0)
    for layout in (STOCK, PAD, COLUMNS):
        if all(_invariant_in(layout, *_probe(shape, generator, dtype, device)) for _ in range(PROBE_DRAWS)):
            return layout
    return ROWS


PROBE_DRAWS = 3


def _probe(
    shape: tuple[int, int], generator: torch.Generator, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [out, in] and rows [PROBE_ROWS, in] whose exact products are 0: each column of
    rows repeats another one of them, where the weight negates it (pairs shuffled). The computed
    products are pure rounding noise, so another summation order almost surely changes them, where
    ordinary random data hides order differences under the bf16 rounding of the result."""
    out_features, in_features = shape
    half = in_features // 2
    u = torch.randn(PROBE_ROWS, half, generator=generator)
    v = torch.randn(out_features, half, generator=generator)
    extra = in_features - 2 * half  # an odd width keeps one ordinary column
    rows = torch.cat([u, u, torch.randn(PROBE_ROWS, extra, generator=generator)], dim=1)
    weight = torch.cat([v, -v, torch.randn(out_features, extra, generator=generator)], dim=1)
    order = torch.randperm(in_features, generator=generator)
    return weight[:, order].to(device, dtype), rows[:, order].to(device, dtype)


def _invariant_in(layout: str, weight: torch.Tensor, rows: torch.Tensor) -> bool:
    single = torch.cat([rows_product(rows[i : i + 1], weight, None, layout) for i in range(rows.shape[0])])
    return all(
        torch.equal(rows_product(rows[:m], weight, None, layout), single[:m])
        for m in range(2, rows.shape[0] + 1)
    )


def invariant_attention(
    module: nn.Module,
    query: torch.Tensor,  # [B, H, T, D]
    key: torch.Tensor,  # [B, H_kv, N, D], the cache with this forward's keys last
    value: torch.Tensor,  # [B, H_kv, N, D]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention of batch-1 decoding with each row computed as its own 1-token forward would.

    Batches, long forwards and sliding windows go to SDPA (they never need invariance here).
    Returns [B, T, H, D] like transformers' attention functions.
    """
    batch, heads, rows, dim = query.shape
    if batch != 1 or rows > MAX_ROWS or getattr(module, "sliding_window", None) or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scaling = scaling if scaling is not None else dim**-0.5
    group = heads // key.shape[1]
    outputs = [
        _bucket_attention(query[0, :, first:last], key[0], value[0], hidden, scaling)
        for first, last, hidden in _row_buckets(key.shape[2], rows, group, query.device)
    ]
    out = torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]  # [H, T, D]
    return out.transpose(0, 1).unsqueeze(0), None  # [1, T, H, D]


@lru_cache(maxsize=4096)
def _row_buckets(
    n_keys: int, rows: int, group: int, device: torch.device
) -> tuple[tuple[int, int, torch.Tensor], ...]:
    """Rows grouped by padded key length: (first row, end row, mask [R, P] True where hidden).

    Row t of a T-row forward over N keys sees N − T + t + 1 of them (causal, no padding); its keys are
    padded to the next multiple of KEY_BUCKET. Mask rows are ordered (head in group, t) and padded to
    MIN_ROWS, like the query rows of `_bucket_attention`. The same for every layer: built once.
    """
    visible = n_keys - rows + 1 + torch.arange(rows)  # [T]
    padded = (visible + KEY_BUCKET - 1) // KEY_BUCKET * KEY_BUCKET  # [T]
    buckets = []
    for size in padded.unique(sorted=True).tolist():
        chosen = (padded == size).nonzero().flatten()
        first, last = int(chosen[0]), int(chosen[-1]) + 1
        hidden = (torch.arange(size) >= visible[first:last, None]).repeat(group, 1)  # [G·T_b, P]
        if hidden.shape[0] < MIN_ROWS:
            hidden = torch.cat([hidden, hidden.new_zeros(MIN_ROWS - hidden.shape[0], size)])
        buckets.append((first, last, hidden.to(device)))
    return tuple(buckets)


def _bucket_attention(
    query: torch.Tensor,  # [H, T_b, D] rows sharing one padded key length
    key: torch.Tensor,  # [H_kv, N, D]
    value: torch.Tensor,  # [H_kv, N, D]
    hidden: torch.Tensor,  # [R, P] True where a (padded) row must not see a (padded) key
    scaling: float,
) -> torch.Tensor:
    """Attention over P keys (zero-padded, masked per row). Returns [H, T_b, D]."""
    heads, rows, dim = query.shape
    kv_heads, padded = key.shape[0], hidden.shape[1]
    group = heads // kv_heads
    key, value = (_pad_keys(t, padded) for t in (key, value))  # [H_kv, P, D]
    grouped = query.reshape(kv_heads, group * rows, dim)  # [H_kv, G·T_b, D], rows ordered (head, t)
    if grouped.shape[1] < MIN_ROWS:
        grouped = torch.cat([grouped, grouped.new_zeros(kv_heads, MIN_ROWS - grouped.shape[1], dim)], 1)
    out = F.scaled_dot_product_attention(
        grouped[None], key[None], value[None], attn_mask=~hidden, scale=scaling
    )[0, :, : group * rows]  # [H_kv, G·T_b, D]
    return out.reshape(heads, rows, dim)


def _pad_keys(tensor: torch.Tensor, padded: int) -> torch.Tensor:
    """[H_kv, N, D] → [H_kv, P, D]: zero rows appended (they are masked out)."""
    missing = padded - tensor.shape[1]
    return F.pad(tensor, (0, 0, 0, missing)) if missing > 0 else tensor[:, :padded]


def _register() -> None:
    AttentionInterface.register(INVARIANT_ATTENTION, invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(INVARIANT_ATTENTION, sdpa_mask)


def make_batch_invariant(model: nn.Module) -> nn.Module:
    """Switch a loaded causal LM to the invariant kernels, in place (same parameters, same state dict)."""
    _register()
    for module in model.modules():
        if type(module) is not nn.Linear:
            continue
        layout = layout_for(tuple(module.weight.shape), module.weight.dtype, module.weight.device)
        if layout != STOCK:
            module.__class__ = RowInvariantLinear
            module.layout = layout
    model.set_attn_implementation(INVARIANT_ATTENTION)
    return model


def is_batch_invariant(model: nn.Module) -> bool:
    return getattr(model.config, "_attn_implementation", None) == INVARIANT_ATTENTION


@contextmanager
def stock_kernels(model: nn.Module) -> Iterator[nn.Module]:
    """Run a batch-invariant model on transformers' own kernels for a while (e.g. to time HF `generate`)."""
    if not is_batch_invariant(model):
        yield model
        return
    swapped = [m for m in model.modules() if type(m) is RowInvariantLinear]
    for module in swapped:
        module.__class__ = nn.Linear
    model.set_attn_implementation("sdpa")
    try:
        yield model
    finally:
        for module in swapped:
            module.__class__ = RowInvariantLinear
        model.set_attn_implementation(INVARIANT_ATTENTION)
