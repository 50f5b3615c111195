"""Training data by name: `pydocs`, `sharegpt` (first recorded replies), `sharegpt-turns` (every recorded
reply), `synth:PATH` (verifier answers)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from sd2.data.batches import ShardSet
from sd2.data.datasets import docs_text_shards, sharegpt_reply_shards, sharegpt_turn_shards, synth_shards
from sd2.data.shards import DEFAULT_CONFIG, ShardConfig
from sd2.train.trainer import TrainData
from sd2.train.validation import held_out_prompts


def shard_folder(name: str, split: str, tokenizer, config: ShardConfig) -> Path:
    """The cached shard folder of one named source (built on first use)."""
    if name == "pydocs":
        return docs_text_shards(split, tokenizer, config)
    if name == "sharegpt":
        return sharegpt_reply_shards(split, tokenizer, config)
    if name == "sharegpt-turns":
        return sharegpt_turn_shards(split, tokenizer, config)
    if name.startswith("synth:"):
        return synth_shards(Path(name.removeprefix("synth:")), tokenizer, config, split=split)
    raise ValueError(f"data source {name!r} is not one of pydocs, sharegpt, sharegpt-turns, synth:PATH")


def concatenate(sets: Sequence[ShardSet]) -> ShardSet:
    """One ShardSet holding the rows of several (same seq_len), in order."""
    if len(sets) == 1:
        return sets[0]
    combined = object.__new__(ShardSet)
    combined.folder, combined.manifest = sets[0].folder, {"parts": [s.manifest for s in sets]}
    combined.input_ids = torch.cat([s.input_ids for s in sets])
    combined.loss_mask = torch.cat([s.loss_mask for s in sets])
    combined.lengths = torch.cat([s.lengths for s in sets])
    combined.ids = tuple(i for s in sets for i in s.ids)
    return combined


def validation_data(
    name: str, tokenizer, eval_prompts: int, seq_len: int = DEFAULT_CONFIG.seq_len
) -> tuple[ShardSet, list[list[int]], str]:
    """Validation rows, τ prompts and a description from the held-out validation split of `name`:
    ShareGPT's recorded replies, or `synth:PATH` made with `sd2 data synth --split validation` (the
    verifier's own answers — what synth-trained drafters learn)."""
    if name != "sharegpt" and not name.startswith("synth:"):
        raise ValueError("validation data must be sharegpt or synth:PATH (prompts with answers)")
    rows = ShardSet(shard_folder(name, "validation", tokenizer, ShardConfig(seq_len=seq_len)))
    description = (
        "sharegpt validation split (first replies)"
        if name == "sharegpt"
        else f"{name} (verifier answers to validation-split prompts)"
    )
    return rows, held_out_prompts(rows, eval_prompts), description


def training_data(
    names: Sequence[str],
    tokenizer,
    eval_prompts: int,
    seq_len: int = DEFAULT_CONFIG.seq_len,
    validation_name: str = "sharegpt",
) -> TrainData:
    """Train rows from the named sources; validation rows and τ prompts from `validation_data`."""
    config = ShardConfig(seq_len=seq_len)
    train = concatenate([ShardSet(shard_folder(n, "train", tokenizer, config)) for n in names])
    validation, prompts, described = validation_data(validation_name, tokenizer, eval_prompts, seq_len)
    description = {
        "sources": list(names),
        "train_rows": len(train),
        "validation": described,
        "seq_len": seq_len,
    }
    return TrainData(train, validation, prompts, description)
