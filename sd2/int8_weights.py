"""A drafter's linears multiplied by int8 copies of their weights: a cheaper draft step on a CPU.

A drafter's one-token step on a CPU reads each of its weights once, and in decoding the verifier's
forward between two draft steps has evicted them from the caches: reading them is most of the step (the
shipped 4-layer drafters' linears and reduced head hold ≈ 8 M weights, 16 MB in bf16).
`torch._weight_int8pack_mm` multiplies bf16 rows by an int8 matrix with one scale per output row
(symmetric, scale = max |w| / 127): half the bytes. On the embedded pair it took the drafters' c in
decoding from 0.099–0.106 to 0.064–0.068 with α̂ unchanged, decoding 1.02–1.08× faster
(assets/benchmarks/draft_weights.md).

Exactness does not depend on it: the drafter only proposes, and the acceptance rule judges each draft
with the q it was drafted from, so the output is the verifier's either way. What rounding the weights
does to q can move acceptance; the benchmark measures it.

Rows stay invariant: the kernel computes each row of a product on its own, so a batched draft step
equals the solo one (sd2.batching) — a property of the kernel on this machine, so it is probed per
shape (as sd2.invariant probes its layouts), and a linear whose shape fails keeps its kernel. Linears
of one input (q, k, v; gate, up) multiply as one product where the probe finds each part's columns
unchanged (`Int8Fused`). Only bf16 on a CPU: the kernel's fp32 path is slower than oneDNN's fp32 one.

Training never sees these copies: they are kept beside each module (as sd2.invariant keeps packed
weights), quantised again when the weight changes, so state dicts, deep copies and the trained
parameters stay as they are; `sd2.invariant.make_stock` turns the linears back.

Dims: M rows, K in, N out (N_i a fused part's).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from sd2.choices import DRAFT_WEIGHTS_CHOICES, DRAFT_WEIGHTS_ENV
from sd2.invariant import MAX_ROWS, PROBE_DRAWS, PROBE_ROWS, RowInvariantLinear, cancelling_probe

INT8 = "int8"  # the layout name an Int8Linear reports
INT8_MAX = 127  # symmetric: −127..127, so a weight and its negation quantise to negations


def int8_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the int8 product can serve a model here: a bf16 model on a CPU with the kernel."""
    return device.type == "cpu" and dtype == torch.bfloat16 and hasattr(torch, "_weight_int8pack_mm")


def resolve_draft_weights(
    name: str | None,
    dtype: torch.dtype,
    device: torch.device,
    draft_step: str,
    env: Mapping[str, str] | None = None,
) -> str:
    """--draft-weights (or $SD2_DRAFT_WEIGHTS when None) → "int8" or "full"; auto = int8 where the int8
    product runs (bf16 on a CPU) and the drafters step eagerly or directly, full elsewhere. Raises
    ValueError on an unknown name, or int8 asked for where it cannot run."""
    env = os.environ if env is None else env
    name = (name if name is not None else env.get(DRAFT_WEIGHTS_ENV, "") or "auto").strip().lower()
    if name not in DRAFT_WEIGHTS_CHOICES:
        choices = ", ".join(DRAFT_WEIGHTS_CHOICES)
        raise ValueError(f"--draft-weights must be one of {choices} (or ${DRAFT_WEIGHTS_ENV}), got {name!r}")
    available = int8_available(dtype, device) and draft_step != "compiled"
    if name == "auto":
        return "int8" if available else "full"
    if name == "int8" and not available:
        where = f"{device.type}/{str(dtype).removeprefix('torch.')}, {draft_step} draft step"
        raise ValueError(
            "int8 drafter weights need a bf16 model on a CPU and the eager or direct draft step (the "
            f"compiled one runs transformers' kernels); this engine runs {where}: use --draft-weights full"
        )
    return name


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] → (int8 [N, K], scales [N] in the weight's dtype), w ≈ q · scale per row; a row of
    zeros gets scale 1 (q = 0)."""
    matrix = weight.detach().float()
    scales = matrix.abs().amax(dim=1) / INT8_MAX  # [N]
    scales = torch.where(scales > 0, scales, torch.ones_like(scales)).to(weight.dtype)
    q = torch.round(matrix / scales.float()[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.contiguous(), scales.contiguous()


def int8_product(rows: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """rows [M, K] (bf16) times an int8 weight [N, K] with its row scales [N] → [M, N]."""
    return torch._weight_int8pack_mm(rows.contiguous(), q, scales)


# a module → ((weight address, version), (q, scales)); kept beside it, so its state dict stays as it is
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def int8_copy(owner: nn.Module, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 copy of a module's weight [N, K] (`quantize`), made again whenever the weight changes
    (moved, cast or written in place)."""
    key = (weight.data_ptr(), weight._version)
    cached = _COPIES.get(owner)
    if cached is None or cached[0] != key:
        cached = (key, quantize(weight))
        _COPIES[owner] = cached
    return cached[1]


@lru_cache(maxsize=256)
def int8_invariant(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the int8 product's row i of an M-row call equals its 1-row call, M ≤ PROBE_ROWS, for a
    weight [N, K] of this shape (sd2.invariant.cancelling_probe's data, whose negated column pairs
    quantise to negations, so the exact products stay 0 and any other summation order shows)."""
    if not int8_available(dtype, device):
        return False
    generator = torch.Generator().manual_seed(0)
    for _ in range(PROBE_DRAWS):
        weight, rows = cancelling_probe(shape, generator, dtype, device)  # [N, K], [P, K]
        q, scales = quantize(weight)
        single = torch.cat([int8_product(rows[i : i + 1], q, scales) for i in range(PROBE_ROWS)])
        if not all(
            torch.equal(int8_product(rows[:m], q, scales), single[:m]) for m in range(2, PROBE_ROWS + 1)
        ):
            return False
    return True


class Int8Linear(RowInvariantLinear):
    """A linear whose products of up to MAX_ROWS rows use the int8 copy of its weight (row-invariant,
    probed); longer forwards (a long prompt) take the stock product of the weight itself."""

    layout: str = INT8

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., K] → [..., N]
        rows = x.reshape(-1, x.shape[-1])  # [M, K]
        if rows.shape[0] > MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        out = int8_product(rows, *int8_copy(self, self.weight))  # [M, N]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class Int8Fused:
    """Int8 linears of one input as one product: `__call__(x [1, 1, K])` → their outputs ([1, 1, N_i]
    each), equal to `linear.forward(x)` bit for bit. The stacked copy is stacked again when a part's
    weight changes."""

    def __init__(self, linears: Sequence[Int8Linear]):
        self.linears = tuple(linears)
        self.sizes = [linear.out_features for linear in self.linears]
        self._key: tuple | None = None
        self._stacked: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = tuple((linear.weight.data_ptr(), linear.weight._version) for linear in self.linears)
        if key != self._key:
            copies = [int8_copy(linear, linear.weight) for linear in self.linears]
            self._stacked = (torch.cat([q for q, _ in copies]), torch.cat([s for _, s in copies]))
            self._key = key
        out = int8_product(x.reshape(1, -1), *self._stacked)  # [1, N]
        return tuple(part.contiguous().view(1, 1, -1) for part in out.split(self.sizes, dim=-1))


def int8_fused(linears: Sequence[nn.Linear]) -> Int8Fused | None:
    """The linears as one int8 product where that keeps every output bit for bit (each a bias-free
    Int8Linear, of one input width, whose stacked product the probe finds equal to its parts); else None."""
    if (
        not all(type(linear) is Int8Linear and linear.bias is None for linear in linears)
        or len({linear.in_features for linear in linears}) != 1
    ):
        return None
    weight = linears[0].weight
    sizes = tuple(linear.out_features for linear in linears)
    return (
        Int8Fused(linears)
        if int8_fusable(sizes, linears[0].in_features, weight.dtype, weight.device)
        else None
    )


@lru_cache(maxsize=64)
def int8_fusable(
    out_sizes: tuple[int, ...], in_features: int, dtype: torch.dtype, device: torch.device
) -> bool:
    """Whether one int8 product of weights [N_i, K] stacked gives each part's 1- and 2-row products bit
    for bit (cancelling probe data, as `int8_invariant`)."""
    if not int8_available(dtype, device):
        return False
    generator = torch.Generator().manual_seed(1)
    for _ in range(PROBE_DRAWS):
        weight, rows = cancelling_probe((sum(out_sizes), in_features), generator, dtype, device)
        q, scales = quantize(weight)
        parts = list(zip(q.split(list(out_sizes)), scales.split(list(out_sizes)), strict=True))
        for m in (1, 2):
            alone = torch.cat([int8_product(rows[:m], pq, ps) for pq, ps in parts], dim=-1)
            if not torch.equal(int8_product(rows[:m], q, scales), alone):
                return False
    return True


def use_int8_weights(model: nn.Module, draft_head: nn.Module | None = None) -> int:
    """Switch a bf16 drafter's linears (and its reduced head, sd2.draft_vocab, in place of its LM head)
    to int8 copies of their weights where the probe finds their rows invariant, in place; returns how
    many it switched. Raises
    ValueError where the int8 product cannot run (not bf16 on a CPU)."""
    weight = model.get_input_embeddings().weight
    if not int8_available(weight.dtype, weight.device):
        raise ValueError(
            f"int8 drafter weights need a bf16 drafter on a CPU; this one is {weight.dtype} on "
            f"{weight.device.type} (use full drafter weights)"
        )
    unused = model.get_output_embeddings() if draft_head is not None else None  # the reduced head serves
    switched = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (
            isinstance(module, nn.Linear)
            and module is not unused
            and type(module) is not Int8Linear
            and int8_invariant(tuple(weight.shape), weight.dtype, weight.device)
        ):
            module.__class__ = Int8Linear
            int8_copy(module, weight)  # quantised now, not in the first decode
            switched += 1
    if draft_head is not None and int8_invariant(
        tuple(draft_head.weight.shape), draft_head.weight.dtype, draft_head.weight.device
    ):
        draft_head.int8 = True
        int8_copy(draft_head, draft_head.weight)
        switched += 1
    return switched


def uses_int8_weights(model: nn.Module) -> bool:
    """Whether some linear of the model multiplies by an int8 copy of its weight."""
    return any(type(module) is Int8Linear for module in model.modules())
