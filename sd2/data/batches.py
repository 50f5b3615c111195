"""Seeded, shuffled batches from a shard folder.

The permutation of an epoch depends only on (seed, epoch), so a resumed run that skips the batches
it already consumed (`start`) sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from sd2.data.shards import MANIFEST

IGNORE_INDEX = -100  # HF's label value for "no loss here"


@dataclass(frozen=True)
class Batch:
    """One training batch (dims: B rows, T positions)."""

    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] int64, 1 on real tokens (right padding)
    loss_mask: torch.Tensor  # [B, T] bool, True where input_ids[t] is a response token (predicted at t − 1)
    ids: tuple[str, ...]  # example ids, for provenance and leak checks

    @property
    def labels(self) -> torch.Tensor:
        """HF-style labels: input_ids on response positions, IGNORE_INDEX elsewhere (HF shifts them)."""
        return self.input_ids.masked_fill(~self.loss_mask, IGNORE_INDEX)  # [B, T]


class ShardSet:
    """All rows of a shard folder in memory (a few MB per thousand rows), checked against the manifest."""

    def __init__(self, folder: Path, verify: bool = True):
        self.folder = Path(folder)
        manifest_path = self.folder / MANIFEST
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{self.folder} has no {MANIFEST}: the shards are missing or incomplete")
        self.manifest = json.loads(manifest_path.read_text())
        parts = [self._load(entry, verify) for entry in self.manifest["shards"]]
        self.input_ids = (
            torch.cat([p["input_ids"] for p in parts]).long() if parts else torch.zeros(0, 0).long()
        )
        self.loss_mask = (
            torch.cat([p["loss_mask"] for p in parts]).bool() if parts else torch.zeros(0, 0).bool()
        )
        self.lengths = torch.cat([p["lengths"] for p in parts]).long() if parts else torch.zeros(0).long()
        self.ids = tuple(i for entry in self.manifest["shards"] for i in entry["ids"])

    def _load(self, entry: dict, verify: bool) -> dict[str, torch.Tensor]:
        path = self.folder / entry["file"]
        if verify and hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            raise ValueError(f"{path} does not match its manifest checksum: the shard is corrupt, rebuild it")
        return load_file(str(path))

    def __len__(self) -> int:
        return len(self.ids)

    def rows(self, index: torch.Tensor, trim: bool = False) -> Batch:
        """The batch of the given row indices; `trim` drops trailing all-padding columns."""
        lengths = self.lengths[index]  # [B]
        width = int(lengths.max()) if trim and len(index) else self.input_ids.shape[1]
        positions = torch.arange(width)  # [T]
        return Batch(
            input_ids=self.input_ids[index, :width],
            attention_mask=(positions[None, :] < lengths[:, None]).long(),
            loss_mask=self.loss_mask[index, :width],
            ids=tuple(self.ids[i] for i in index.tolist()),
        )


def epoch_order(n_rows: int, seed: int, epoch: int) -> torch.Tensor:
    """The seeded permutation of one epoch: a function of (seed, epoch) only."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n_rows, generator=generator)  # [N]


def batches(
    shards: ShardSet,
    batch_size: int,
    seed: int = 0,
    epoch: int = 0,
    start: int = 0,
    drop_last: bool = True,
    trim: bool = False,
) -> Iterator[Batch]:
    """Shuffled batches of one epoch, from batch index `start` on (for resuming)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    order = epoch_order(len(shards), seed, epoch)
    stop = len(order) - len(order) % batch_size if drop_last else len(order)
    for begin in range(start * batch_size, stop, batch_size):
        yield shards.rows(order[begin : begin + batch_size], trim=trim)


def rank_batches(
    shards: ShardSet,
    batch_size: int,
    seed: int,
    epoch: int,
    start: int,
    rank: int = 0,
    ranks: int = 1,
    trim: bool = False,
) -> Iterator[tuple[int, Batch]]:
    """One process's share of an epoch's batches (the order of `batches`), from batch index `start` on.

    The batches come in rounds of `ranks` consecutive ones; rank r trains on the r-th of each round, so
    the processes of one step see different data. A last incomplete round is dropped, so every rank
    takes as many batches. Yields (resume index, batch): the batch index the epoch continues from once
    this batch's round is done — the same on every rank. With one rank this is `batches` exactly.
    """
    order = epoch_order(len(shards), seed, epoch)
    total = len(order) // batch_size
    for round_start in range(start, total - ranks + 1, ranks):
        begin = (round_start + rank) * batch_size
        yield round_start + ranks, shards.rows(order[begin : begin + batch_size], trim=trim)
