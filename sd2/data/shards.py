"""Tokenised examples packed into fixed-length rows, stored as safetensors shards with a JSON manifest.

Row layout (T = seq_len), one example per row, right-padded:
  input_ids[t]  = prompt ids, then response ids, then pad
  loss_mask[t]  = 1 where input_ids[t] is a response token (the logits that predict it sit at t − 1)
  length        = number of real tokens (the attention mask is `arange(T) < length`)
A prompt that does not fit with `min_response_tokens` of response is dropped, never left-truncated;
a long response is cut on the right. Files are written atomically; the manifest is written last, so a
folder with a manifest is complete. The folder name hashes everything that determines its contents.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from transformers import PreTrainedTokenizerBase

from sd2.data.atomic import atomic_path, write_text
from sd2.data.examples import Example
from sd2.memory import release_freed_memory
from sd2.paths import sd2_home

FORMAT_VERSION = 1
MANIFEST = "manifest.json"

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    """How examples become rows."""

    seq_len: int = 512  # the paper's 256 cut most ShareGPT replies; 512 keeps most prompts whole
    min_response_tokens: int = 8  # rows with less to learn are not worth a slot
    rows_per_shard: int = 4096  # 4096 × 512 × int32 = 8 MB per shard: cheap to load, few files


DEFAULT_CONFIG = ShardConfig()


@dataclass
class Counts:
    """What packing did, recorded in the manifest."""

    examples: int = 0
    rows: int = 0
    dropped_long_prompt: int = 0  # prompt + min_response_tokens > seq_len
    dropped_short_response: int = 0  # fewer than min_response_tokens response tokens to begin with
    truncated_response: int = 0  # response cut on the right to fit
    response_tokens: int = 0  # Σ loss_mask
    tokens: int = 0  # Σ length


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """SHA-256 of the vocabulary, special tokens and chat template: ids are only valid under it."""
    payload = json.dumps(
        [sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens, tokenizer.chat_template],
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def pack(example: Example, config: ShardConfig, counts: Counts) -> tuple[list[int], list[int]] | None:
    """(ids, loss_mask) of one row before padding, or None when the example is dropped."""
    prompt, response = list(example.prompt_ids), list(example.response_ids)
    if len(response) < config.min_response_tokens:
        counts.dropped_short_response += 1
        return None
    if len(prompt) + config.min_response_tokens > config.seq_len:
        counts.dropped_long_prompt += 1
        return None
    room = config.seq_len - len(prompt)
    if len(response) > room:
        counts.truncated_response += 1
        response = response[:room]
    return prompt + response, [0] * len(prompt) + [1] * len(response)


def shard_key(tokenizer: PreTrainedTokenizerBase, config: ShardConfig, source: dict) -> str:
    """Hash of everything that determines the rows: tokenizer, packing and the data source."""
    payload = json.dumps(
        [FORMAT_VERSION, tokenizer_fingerprint(tokenizer), asdict(config), source],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def shard_dir(name: str, key: str, home: Path | None = None) -> Path:
    return (home or sd2_home()) / "data" / "shards" / f"{name}-{key[:12]}"


def build_shards(
    examples: Iterable[Example],
    folder: Path,
    tokenizer: PreTrainedTokenizerBase,
    config: ShardConfig,
    source: dict,
) -> dict:
    """Pack, pad and write all shards into `folder`, then the manifest; return the manifest."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    counts, rows, shards = Counts(), [], []
    for example in examples:
        counts.examples += 1
        packed = pack(example, config, counts)
        if packed is not None:
            rows.append((example.id, *packed))
        if len(rows) == config.rows_per_shard:
            shards.append(_write_shard(folder, len(shards), rows, config.seq_len, pad_id, counts))
            rows = []
    if rows:
        shards.append(_write_shard(folder, len(shards), rows, config.seq_len, pad_id, counts))
    manifest = {
        "format_version": FORMAT_VERSION,
        "source": source,
        "config": asdict(config),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "pad_id": pad_id,
        "counts": asdict(counts),
        "shards": shards,
    }
    write_text(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    log.info("shards in %s: %s", folder, asdict(counts))
    return manifest


def _write_shard(folder: Path, index: int, rows: list, seq_len: int, pad_id: int, counts: Counts) -> dict:
    input_ids = np.full((len(rows), seq_len), pad_id, dtype=np.int32)  # [N, T]
    loss_mask = np.zeros((len(rows), seq_len), dtype=np.uint8)  # [N, T]
    lengths = np.zeros(len(rows), dtype=np.int32)  # [N]
    for i, (_, ids, mask) in enumerate(rows):
        input_ids[i, : len(ids)], loss_mask[i, : len(mask)], lengths[i] = ids, mask, len(ids)
    counts.rows += len(rows)
    counts.response_tokens += int(loss_mask.sum())
    counts.tokens += int(lengths.sum())
    name = f"shard-{index:05d}.safetensors"
    with atomic_path(folder / name) as tmp:
        save_file({"input_ids": input_ids, "loss_mask": loss_mask, "lengths": lengths}, str(tmp))
    digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    return {"file": name, "rows": len(rows), "sha256": digest, "ids": [row[0] for row in rows]}


def cached_shards(
    name: str,
    examples: Callable[[], Iterable[Example]],
    tokenizer: PreTrainedTokenizerBase,
    config: ShardConfig = ShardConfig(),
    source: dict | None = None,
    home: Path | None = None,
) -> Path:
    """The shard folder for (name, tokenizer, config, source), built on first use and reused after.

    `source` must identify the data exactly (e.g. corpus, split, seed, the synth file's sha256);
    `examples` is only called when the folder has to be built.
    """
    source = source or {}
    folder = shard_dir(name, shard_key(tokenizer, config, source), home)
    manifest_path = folder / MANIFEST
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("tokenizer") == tokenizer_fingerprint(tokenizer):
            log.info("reusing cached shards %s", folder)
            return folder
        raise ValueError(f"{folder} was built with another tokenizer: delete it and rebuild")
    build_shards(examples(), folder, tokenizer, config, source)
    release_freed_memory()  # building from a parsed corpus leaves a heap that slows torch (sd2.memory)
    return folder
