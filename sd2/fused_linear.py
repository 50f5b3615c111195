"""Linears that read one input (q, k, v; gate, up) multiplied as one packed product, each part's output
bit for bit its own linear's.

On a CPU a batch-1 product of a small drafter's linear is one oneDNN call of ≈ 20 µs whatever its size
(sd2.invariant packs the weights): the call, not the arithmetic, is the cost. One call on the stacked
weights [Σ out, in] replaces three (or two). oneDNN computes each output column as its own sum over the
input, so stacking does not change a column's sum — but that is a property of the kernels oneDNN picks
for these shapes on this machine, so it is probed (`fusable`) the way sd2.invariant probes its layouts,
and linears that fail the probe stay separate. Used by the direct draft step (sd2.direct_step), whose
logits must equal the eager step's.

Dims: M rows, K in, O_i the parts' out, O = Σ O_i.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from functools import lru_cache

import torch
from torch import nn

from sd2.invariant import PACKED, PROBE_DRAWS, RowInvariantLinear, cancelling_probe, layout_for, pack_weight


class FusedLinears:
    """Linears of one input as one product: `__call__(x [1, 1, K])` → their outputs ([1, 1, O_i] each),
    equal to `linear.forward(x)` bit for bit. The stacked weight is packed again when a part's weight
    changes (moved, cast or written in place)."""

    def __init__(self, linears: Sequence[nn.Linear]):
        self.linears = tuple(linears)
        self.sizes = [linear.out_features for linear in self.linears]
        self._key: tuple | None = None
        self._packed: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = tuple((linear.weight.data_ptr(), linear.weight._version) for linear in self.linears)
        if key != self._key:
            self._packed = pack_weight(torch.cat([linear.weight.detach() for linear in self.linears]))
            self._key = key
        out = torch.ops.mkldnn._linear_pointwise(
            x.reshape(1, -1), self._packed, None, "none", [], ""
        )  # [1, O]
        # each part contiguous, as its own linear returns it (elementwise kernels may round strided inputs
        # differently)
        return tuple(part.contiguous().view(1, 1, -1) for part in out.split(self.sizes, dim=-1))


def fused(linears: Sequence[nn.Linear]) -> FusedLinears | None:
    """The linears as one product where that keeps every output bit for bit (each a packed, bias-free
    invariant linear, of one input width, whose stacked product the probe finds equal); else None. The
    same linears get the same FusedLinears (kept beside the first one while it lives), so a step made
    per request does not pack their stacked weight again."""
    kept = _FUSED.get(linears[0], {})
    key = tuple((id(linear), type(linear), getattr(linear, "layout", None)) for linear in linears)
    if key not in kept:
        kept[key] = _fused(linears)
        _FUSED[linears[0]] = kept
    return kept[key]


_FUSED: weakref.WeakKeyDictionary = (
    weakref.WeakKeyDictionary()
)  # first linear → {(id, kernel) of all: result}


def _fused(linears: Sequence[nn.Linear]) -> FusedLinears | None:
    first = linears[0].weight
    if (
        not all(
            type(linear) is RowInvariantLinear and linear.layout == PACKED and linear.bias is None
            for linear in linears
        )
        or len({linear.in_features for linear in linears}) != 1
    ):
        return None
    shapes = tuple(linear.out_features for linear in linears)
    return (
        FusedLinears(linears) if fusable(shapes, linears[0].in_features, first.dtype, first.device) else None
    )


@lru_cache(maxsize=64)
def fusable(out_sizes: tuple[int, ...], in_features: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether one packed product of weights [O_i, K] stacked gives each part's 1- and 2-row products
    bit for bit, on probe data whose exact products are 0 (sd2.invariant.cancelling_probe: any other summation
    order shows in the rounding noise)."""
    if layout_for((sum(out_sizes), in_features), dtype, device) != PACKED:
        return False
    generator = torch.Generator().manual_seed(1)
    for _ in range(PROBE_DRAWS):
        weight, rows = cancelling_probe(
            (sum(out_sizes), in_features), generator, dtype, device
        )  # [O, K], [P, K]
        parts = weight.split(list(out_sizes))
        stacked = pack_weight(weight)
        for m in (1, 2):
            alone = torch.cat([_product(rows[:m], pack_weight(part)) for part in parts], dim=-1)
            if not torch.equal(_product(rows[:m], stacked), alone):
                return False
    return True


def _product(rows: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(rows.contiguous(), packed, None, "none", [], "")
