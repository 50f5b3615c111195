"""A batch-invariant verifier forward: row i of a T-token cached forward equals a 1-token one, bit for bit.

Speculative decoding is exact only if a position's verifier logits do not depend on how many tokens the
forward holds: 1 in the verifier-only loop, k+1 in a verify step (docs/lossless.md). Stock CPU kernels
break that in two places, measured on the embedded SmolLM2 (2-core AMD Zen 5):
  - `F.linear` picks its kernel by row count: in bf16 a 1-row product (oneDNN's GEMV path) differs from
    row i of an M-row one for `down_proj`'s 576×1536 weight, while every M ≥ 2 agrees with every other;
    in fp32 (MKL sgemm) no shape is invariant, but (W @ xᵀ)ᵀ with at least 2 columns is.
  - SDPA packs a single query differently (GQA packing, no mask) and reduces over as many keys as the
    forward holds, so a verify row sums over masked tail keys that its 1-token twin never saw.
On a 2-core AMD EPYC with AVX2 only, SDPA's fp32 flash kernel also gives query blocks of 1 or 3 rows
results that depend on how many batch entries the call holds. The invariant path therefore computes
every linear in a layout whose rows do not depend on the row count: in bf16, where oneDNN has it, with a
weight packed once for its inner-product kernel (invariant for any row count, and 1.5–3× faster per
call than `F.linear` on the plain weight in one probe); elsewhere in the cheapest layout a probe finds
invariant. Attention for batch 1 runs with keys padded to a multiple of `KEY_BUCKET` (masked) and rows
grouped by their padded key length: in query blocks (sd2.block_attention: a token's G query heads per KV
head are rows of a block padded to a multiple of a probed quantum, several requests' blocks in one call),
or, where no quantum is invariant, with each token its own batch entry of query rows padded to a probed
invariant count (`entry_rows`). Either way a row's reductions have the same shape and kernel whichever
forward it sits in. Larger forwards (prefill of a long prompt, training batches) use the stock kernels:
they are the same in both loops.

Dims: B batch, T query rows, H heads, H_kv key/value heads, N keys, P padded keys, D head dim.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from sd2.block_attention import KEY_BUCKET, block_attention, pad_keys, query_quantum
from sd2.choices import PACKED_WEIGHTS_ENV, env_flag

INVARIANT_ATTENTION = "sd2_batch_invariant"
MIN_ROWS = 2  # a 1-row product takes a GEMV kernel whose sums differ from the GEMM's: pad to 2 rows
MAX_ROWS = 128  # forwards of more rows than any verify (k ≤ 64) keep the stock kernels


PACKED, PACKED_PAD, STOCK, PAD, COLUMNS, ROWS = "packed", "packed-pad", "stock", "pad", "columns", "rows"
LAYOUTS = (PACKED, PACKED_PAD, STOCK, PAD, COLUMNS, ROWS)  # cheapest first
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
        weight = packed_weight(self) if is_packed(self.layout) else self.weight
        out = rows_product(rows, weight, self.bias, self.layout)  # [M, out]
        return out.reshape(*x.shape[:-1], self.out_features)


# a linear → ((weight address, version), packed): keyed by the module, whose lookup is cheap (one per call)
_PACKED_LINEARS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PACKED_WEIGHTS: WeakIdKeyDictionary = WeakIdKeyDictionary()  # any other weight → the same


def packed_weight(linear: nn.Linear) -> torch.Tensor:
    """The linear's weight packed for oneDNN's inner product (as `packed_matrix`)."""
    return _packed(_PACKED_LINEARS, linear, linear.weight)


def packed_matrix(weight: torch.Tensor) -> torch.Tensor:
    """A weight [..., in] as a matrix [out, in] (leading dims flattened) packed for oneDNN's inner
    product (an opaque tensor), packed again whenever the weight changes (moved, cast or written in
    place). Kept beside the weight's module, not in it, so its state dict and deep copies stay as they
    are; it costs as much memory as the weight."""
    return _packed(_PACKED_WEIGHTS, weight, weight)


def _packed(cache, owner, weight: torch.Tensor) -> torch.Tensor:
    key = (weight.data_ptr(), weight._version)
    cached = cache.get(owner)
    if cached is None or cached[0] != key:
        cached = (key, pack_weight(weight.flatten(0, -2)))
        cache[owner] = cached
    return cached[1]


def invariant_product(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """rows [M, in] times a weight [..., in] (leading dims flattened to out) plus bias → [M, out], row i
    the same bit for bit whatever M is (≤ MAX_ROWS), in the layout `layout_for` probes for the weight's
    shape. For products outside a model's linears (e.g. a steering head's, sd2.steering)."""
    matrix = weight.detach().flatten(0, -2)  # [out, in]
    layout = layout_for(tuple(matrix.shape), matrix.dtype, matrix.device)
    return rows_product(rows, packed_matrix(weight) if is_packed(layout) else matrix, bias, layout)


def is_packed(layout: str) -> bool:
    """Whether a layout multiplies by a packed weight (`packed_weight`)."""
    return layout in (PACKED, PACKED_PAD)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] → the same, packed for `torch.ops.mkldnn._linear_pointwise` (CPU, bf16 or fp32)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def packed_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN's packed inner product can run here: on a CPU, for an fp32 model, or a bf16 one
    where the CPU has native bf16. (Whether its rows are invariant is the probe's question.)"""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (
        dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def rows_product(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, layout: str
) -> torch.Tensor:
    """rows [M, in] → [M, out] in a layout: PACKED multiplies by a weight packed once for oneDNN
    (`weight` is the packed one, or a plain one packed for this call); PACKED_PAD does so with a 1-row
    call given a zero second row (oneDNN takes a GEMV path for one row; measured for the embedded
    verifier's down_proj, 576×1536); STOCK is `F.linear`; PAD gives a
    1-row call a zero second row (the 1-row GEMV kernel sums in another order than the GEMM); COLUMNS
    also pads and computes (W rowsᵀ)ᵀ, for kernels (MKL's fp32 sgemm) whose row results depend on the
    row count; ROWS, the last resort, multiplies each row on its own as the first of a padded pair
    (invariant by construction, M products)."""
    m = rows.shape[0]
    if is_packed(layout):
        packed = weight if weight.is_mkldnn else pack_weight(weight)
        if rows.dtype != packed.dtype:  # bf16 rows (a bf16 autocast) on fp32 packed weights: oneDNN
            # takes no mixed pair, and on a CPU without native bf16 it packs no bf16 weights; the product
            # runs in the weight's precision, as autocast's own linear would run it in bf16 (row by row)
            return rows_product(rows.to(packed.dtype), packed, bias, layout).to(rows.dtype)
        if layout == PACKED_PAD and m < MIN_ROWS:
            rows = torch.cat([rows, rows.new_zeros(MIN_ROWS - m, rows.shape[1])])  # [MIN_ROWS, in]
            return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")[:m]
        return torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, bias, "none", [], "")
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
def layout_for(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, packed: bool = True) -> str:
    """The cheapest layout in which row i of an M-row product equals the 1-row product, M ≤ PROBE_ROWS.

    Kernels are chosen by shape, not data, so probe rows reveal a row-count dependence, provided a
    different summation order shows in the rounded result (see `cancelling_probe`). ROWS when no faster layout
    is invariant. `packed` False leaves PACKED out (it keeps a second copy of the weight).
    """
    generator = torch.Generator().manual_seed(0)
    with_packed = packed and packed_available(dtype, device)
    candidates = (PACKED, PACKED_PAD, STOCK, PAD, COLUMNS) if with_packed else (STOCK, PAD, COLUMNS)
    for layout in candidates:
        if all(
            _invariant_in(layout, *cancelling_probe(shape, generator, dtype, device))
            for _ in range(PROBE_DRAWS)
        ):
            return layout
    return ROWS


PROBE_DRAWS = 3


def cancelling_probe(
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
    if hasattr(key, "bounds"):  # a ragged forward (sd2.ragged.RaggedKeys): each segment its own cache
        heads, dim = query.shape[1], query.shape[3]
        kv_heads = key.segments.kv_heads
        quantum = query_quantum(kv_heads, heads // kv_heads, dim, query.dtype, query.device, MAX_ROWS)
        if quantum and not dropout:  # every segment in one block layout
            tokens = [last - first for first, last in key.bounds]
            scaling = scaling if scaling is not None else dim**-0.5
            keys, values = key.segments, value.segments
            out = block_attention(query[0], keys, values, tokens, scaling, quantum)  # [H, M, D]
            return out.transpose(0, 1).unsqueeze(0), None  # [1, M, H, D]
        segments = [
            invariant_attention(
                module,
                query[:, :, first:last],
                key.segment(r),
                value.segment(r),
                None,
                dropout,
                scaling,
                **kwargs,
            )[0]
            for r, (first, last) in enumerate(key.bounds)
        ]
        return torch.cat(segments, dim=1), None  # [1, M, H, D]
    batch, heads, rows, dim = query.shape
    if batch != 1 or rows > MAX_ROWS or getattr(module, "sliding_window", None) or dropout:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scaling = scaling if scaling is not None else dim**-0.5
    kv_heads = key.shape[1]
    quantum = query_quantum(kv_heads, heads // kv_heads, dim, query.dtype, query.device, MAX_ROWS)
    if quantum:
        out = block_attention(query[0], [key[0]], [value[0]], [rows], scaling, quantum)  # [H, T, D]
        return out.transpose(0, 1).unsqueeze(0), None  # [1, T, H, D]
    padded_rows = entry_rows(kv_heads, heads // kv_heads, dim, query.dtype, query.device)
    outputs = [
        _bucket_attention(query[0, :, first:last], key[0], value[0], seen, scaling, padded_rows)
        for first, last, seen in _row_buckets(key.shape[2], rows, query.device)
    ]
    out = torch.cat(outputs, dim=1) if len(outputs) > 1 else outputs[0]  # [H, T, D]
    return out.transpose(0, 1).unsqueeze(0), None  # [1, T, H, D]


@lru_cache(maxsize=4096)
def _row_buckets(n_keys: int, rows: int, device: torch.device) -> tuple[tuple[int, int, torch.Tensor], ...]:
    """Rows grouped by padded key length: (first row, end row, mask [T_b, 1, 1, P] True where seen).

    Row t of a T-row forward over N keys sees N − T + t + 1 of them (causal, no padding); its keys are
    padded to the next multiple of KEY_BUCKET. The same for every layer: built once.
    """
    visible = n_keys - rows + 1 + torch.arange(rows)  # [T]
    padded = (visible + KEY_BUCKET - 1) // KEY_BUCKET * KEY_BUCKET  # [T]
    buckets = []
    for size in padded.unique(sorted=True).tolist():
        chosen = (padded == size).nonzero().flatten()
        first, last = int(chosen[0]), int(chosen[-1]) + 1
        seen = torch.arange(size) < visible[first:last, None]  # [T_b, P]
        buckets.append((first, last, seen[:, None, None].to(device)))
    return tuple(buckets)


def _bucket_attention(
    query: torch.Tensor,  # [H, T_b, D] rows sharing one padded key length
    key: torch.Tensor,  # [H_kv, N, D]
    value: torch.Tensor,  # [H_kv, N, D]
    seen: torch.Tensor,  # [T_b, 1, 1, P] True where a row may see a (padded) key
    scaling: float,
    padded_rows: int,  # from `entry_rows`
) -> torch.Tensor:
    """Attention over P keys (zero-padded, masked per row). Each row t is its own batch entry of G query
    rows per KV head, zero-padded to `padded_rows`, so its GEMMs have one shape whatever T_b
    is (SDPA's CPU kernels sum an M-row block differently for different M); where no padding is
    invariant, each row is a call of its own, as in its 1-token forward. Returns [H, T_b, D]."""
    heads, rows, dim = query.shape
    kv_heads = key.shape[0]
    group = heads // kv_heads
    key, value = (pad_keys(t, seen.shape[-1]) for t in (key, value))  # [H_kv, P, D]
    per_row = query.reshape(kv_heads, group, rows, dim).permute(2, 0, 1, 3)  # [T_b, H_kv, G, D]
    per_row = F.pad(per_row, (0, 0, 0, abs(padded_rows) - group))  # [T_b, H_kv, R, D]
    if padded_rows > 0 or rows == 1:
        out = _entries_attention(per_row, key, value, seen, scaling)
    else:
        out = torch.cat(
            [
                _entries_attention(per_row[t : t + 1], key, value, seen[t : t + 1], scaling)
                for t in range(rows)
            ]
        )
    return out[:, :, :group].permute(1, 2, 0, 3).reshape(heads, rows, dim)  # [H, T_b, D]


def _entries_attention(
    entries: torch.Tensor,  # [E, H_kv, R, D]
    key: torch.Tensor,  # [H_kv, P, D]
    value: torch.Tensor,  # [H_kv, P, D]
    seen: torch.Tensor,  # [E, 1, 1, P]
    scaling: float,
) -> torch.Tensor:
    """SDPA of E batch entries over the same keys (broadcast, not copied). Returns [E, H_kv, R, D]."""
    batch = (entries.shape[0], -1, -1, -1)
    return F.scaled_dot_product_attention(
        entries, key.expand(*batch), value.expand(*batch), attn_mask=seen, scale=scaling
    )


ENTRY_ROWS_LIMIT = 16  # the most query rows per batch entry the probe tries


@lru_cache(maxsize=64)
def entry_rows(kv_heads: int, group: int, dim: int, dtype: torch.dtype, device: torch.device) -> int:
    """The query rows per attention batch entry (G real ones, zero-padded) for which an entry's result
    does not depend on how many entries the call holds, probed on random data at two key lengths;
    negative (−max(G, MIN_ROWS)) when none up to ENTRY_ROWS_LIMIT is: then each entry runs alone."""
    generator = torch.Generator().manual_seed(0)
    smallest = max(group, MIN_ROWS)
    for padded_rows in range(smallest, max(ENTRY_ROWS_LIMIT, smallest) + 1):
        if all(
            _entries_invariant(padded_rows, kv_heads, dim, n_keys, generator, dtype, device)
            for n_keys in (KEY_BUCKET, 3 * KEY_BUCKET)
        ):
            return padded_rows
    return -smallest


def _entries_invariant(
    padded_rows: int,
    kv_heads: int,
    dim: int,
    n_keys: int,
    generator: torch.Generator,
    dtype: torch.dtype,
    device: torch.device,
) -> bool:
    entries = PROBE_ROWS
    query = torch.randn(entries, kv_heads, padded_rows, dim, generator=generator).to(device, dtype)
    key, value = (torch.randn(kv_heads, n_keys, dim, generator=generator).to(device, dtype) for _ in "kv")
    visible = n_keys - entries + 1 + torch.arange(entries)  # causal, as in a verify
    seen = (torch.arange(n_keys) < visible[:, None])[:, None, None].to(device)  # [E, 1, 1, P]
    scaling = dim**-0.5
    single = torch.cat(
        [_entries_attention(query[e : e + 1], key, value, seen[e : e + 1], scaling) for e in range(entries)]
    )
    return all(
        torch.equal(_entries_attention(query[:e], key, value, seen[:e], scaling), single[:e])
        for e in range(2, entries + 1)
    )


def _register() -> None:
    AttentionInterface.register(INVARIANT_ATTENTION, invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(INVARIANT_ATTENTION, sdpa_mask)


def make_batch_invariant(model: nn.Module, packed: bool = True) -> nn.Module:
    """Switch a loaded causal LM to the invariant kernels, in place (same parameters, same state dict).
    `packed` False never uses the PACKED layout (no second copy of the weights, slower in bf16)."""
    _register()
    for module in model.modules():
        if type(module) is nn.Linear:
            make_linear_invariant(module, packed)
    model.set_attn_implementation(INVARIANT_ATTENTION)
    return model


def make_linear_invariant(linear: nn.Linear, packed: bool = True) -> nn.Linear:
    """One `nn.Linear` as a RowInvariantLinear in its probed layout, in place (unchanged where the stock
    kernel is invariant already); a packed weight is packed now, not in the first decode."""
    weight = linear.weight
    layout = layout_for(tuple(weight.shape), weight.dtype, weight.device, packed)
    if layout != STOCK:
        linear.__class__ = RowInvariantLinear
        linear.layout = layout
    if is_packed(layout):
        packed_weight(linear)
    return linear


def uses_packed_weights(model: nn.Module) -> bool:
    """Whether some linear of the model multiplies by a packed copy of its weight (its memory price)."""
    return any(type(m) is RowInvariantLinear and is_packed(m.layout) for m in model.modules())


def resolve_packed_weights(value: bool | None, env: Mapping[str, str] | None = None) -> bool:
    """Whether batch-invariant kernels may keep packed copies of the weights: `value`, or when None
    $SD2_PACKED_WEIGHTS (1/true/yes/on or 0/false/no/off; unset: on). Raises ValueError on a bad value."""
    return (
        value if value is not None else env_flag(os.environ if env is None else env, PACKED_WEIGHTS_ENV, True)
    )


def is_batch_invariant(model: nn.Module) -> bool:
    return getattr(model.config, "_attn_implementation", None) == INVARIANT_ATTENTION


def make_stock(model: nn.Module) -> nn.Module:
    """Undo `make_batch_invariant`, in place: transformers' own linears and SDPA (e.g. for a copy that
    will be trained: the packed kernels have no backward)."""
    for module in model.modules():
        if isinstance(module, RowInvariantLinear):  # and its kinds (sd2.int8_weights)
            module.__class__ = nn.Linear
    if is_batch_invariant(model):
        model.set_attn_implementation("sdpa")
    return model


@contextmanager
def stock_kernels(model: nn.Module) -> Iterator[nn.Module]:
    """Run a batch-invariant model on transformers' own kernels for a while (e.g. to time HF `generate`)."""
    if not is_batch_invariant(model):
        yield model
        return
    swapped = [(m, type(m)) for m in model.modules() if isinstance(m, RowInvariantLinear)]
    for module, _ in swapped:
        module.__class__ = nn.Linear
    model.set_attn_implementation("sdpa")
    try:
        yield model
    finally:
        for module, kind in swapped:
            module.__class__ = kind
        model.set_attn_implementation(INVARIANT_ATTENTION)
