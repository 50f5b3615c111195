"""A reduced draft vocabulary (FR-Spec / EAGLE-3 style): the drafter's LM head restricted to the N tokens
the verifier emits most, stored with the drafter as `draft_vocab.json`.

The drafter then proposes only those tokens: q = 0 for every pruned one. The verifier keeps its full
vocabulary, so a rejection's residual norm(max(0, p − q)) still reaches pruned tokens and the output
stays distributed exactly as the verifier's (Leviathan's rule holds for any q). What it buys: the
drafter's head, ≈ 40 % of a small drafter's step at V = 49 152, shrinks to N rows.

Dims: V full vocabulary, N kept tokens, D drafter hidden size.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from sd2.int8_weights import int8_copy, int8_product
from sd2.invariant import MAX_ROWS, is_packed, layout_for, packed_weight, rows_product

VOCAB_FILE = "draft_vocab.json"


@dataclass(frozen=True)
class DraftVocab:
    """The kept token ids, most frequent first, and where their counts came from."""

    token_ids: tuple[int, ...]
    source: str = ""  # e.g. "verifier greedy answers to 320 training prompts (sd2 data synth)"
    coverage: float | None = None  # share of the source's tokens that are kept
    extra: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.token_ids)

    def save(self, folder: str | Path) -> Path:
        path = Path(folder) / VOCAB_FILE
        path.write_text(json.dumps({**asdict(self), "token_ids": list(self.token_ids)}) + "\n")
        return path

    @classmethod
    def load(cls, folder: str | Path) -> DraftVocab | None:
        """The folder's vocabulary, or None when it has none (a hub id or a plain HF folder)."""
        path = Path(folder) / VOCAB_FILE
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        ids = raw.get("token_ids")
        if not ids or len(set(ids)) != len(ids) or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise ValueError(f"{path}: token_ids must be distinct non-negative integers")
        return cls(tuple(ids), raw.get("source", ""), raw.get("coverage"), raw.get("extra", {}))


def most_frequent(
    token_streams: Iterable[Sequence[int]], size: int, always: Iterable[int] = (), source: str = ""
) -> DraftVocab:
    """The `size` most frequent ids of the streams (ties by id), `always` included (e.g. stop ids)."""
    counts = Counter(t for stream in token_streams for t in stream)
    if size < 1:
        raise ValueError(f"size must be ≥ 1, got {size}")
    forced = [t for t in dict.fromkeys(always)]
    ranked = [t for t, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if t not in forced]
    kept = (forced + ranked)[:size]
    total = sum(counts.values())
    coverage = sum(counts[t] for t in kept) / total if total else None
    return DraftVocab(tuple(kept), source, coverage)


def coverage(vocab: DraftVocab, token_streams: Iterable[Sequence[int]]) -> float:
    """Share of the streams' tokens inside the vocabulary (the draftable share of an output)."""
    kept = set(vocab.token_ids)
    tokens = [t for stream in token_streams for t in stream]
    return sum(t in kept for t in tokens) / len(tokens) if tokens else 0.0


class ReducedHead(nn.Module):
    """The drafter's LM head cut to the kept rows; logits over N, expanded to V with q = 0 elsewhere."""

    int8 = False  # multiply by an int8 copy of the rows (sd2.int8_weights.use_int8_weights sets it)

    def __init__(self, lm_head_weight: torch.Tensor, vocab: DraftVocab):  # lm_head_weight: [V, D]
        super().__init__()
        vocab_size = lm_head_weight.shape[0]
        if max(vocab.token_ids) >= vocab_size:
            raise ValueError(f"draft vocabulary has ids ≥ the drafter's vocab_size {vocab_size}")
        ids = torch.tensor(vocab.token_ids, device=lm_head_weight.device)  # [N]
        self.register_buffer("token_ids", ids, persistent=False)
        self.weight = nn.Parameter(lm_head_weight.detach()[ids].clone(), requires_grad=False)  # [N, D]
        self.vocab_size = vocab_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., D] → logits [..., N]. Each row's logits do not depend on how many rows the call
        holds (sd2.invariant's probed layout, or the int8 product's, sd2.int8_weights), so a batched drafter
        step equals its solo step. Inside a
        compiled draft step (sd2.draft_step), which never shares a forward, the stock product: the probe
        cannot run while torch.compile traces."""
        rows = hidden.reshape(-1, hidden.shape[-1])  # [M, D]
        if rows.shape[0] > MAX_ROWS or torch.compiler.is_compiling():
            return F.linear(hidden, self.weight)
        weight = self.weight
        if self.int8:
            out = int8_product(rows, *int8_copy(self, weight))  # [M, N]
            return out.reshape(*hidden.shape[:-1], weight.shape[0])
        layout = layout_for(tuple(weight.shape), weight.dtype, weight.device)
        out = rows_product(rows, packed_weight(self) if is_packed(layout) else weight, None, layout)
        return out.reshape(*hidden.shape[:-1], weight.shape[0])

    def vocabulary_id(self, index: int) -> int:
        """The vocabulary id of the kept token at `index` (0..N−1)."""
        return int(self.token_ids[index])

    def to_vocabulary(self, logits: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A block's draft rows over the N kept tokens back in the full vocabulary: logits and rule
        probabilities [..., N] → [..., V] (−inf and q = 0 at pruned tokens). A draft loop expands its
        rows once per block, not per step: two [V] rows a step cost more than a third of a pick."""
        return self.expand(logits, float("-inf")), self.expand(probs, 0.0)

    def expand(self, rows: torch.Tensor, fill: float) -> torch.Tensor:
        """rows [..., N] → [..., V] with `fill` at pruned tokens (−inf for logits, 0 for probs)."""
        full = rows.new_full((*rows.shape[:-1], self.vocab_size), fill)
        return full.index_copy_(-1, self.token_ids, rows)


def reduced_head_for(model: nn.Module, vocab: DraftVocab | None) -> ReducedHead | None:
    """A ReducedHead over the model's own output embeddings (untouched: HF and training use the full one)."""
    if vocab is None:
        return None
    return ReducedHead(model.get_output_embeddings().weight, vocab).eval()
