"""Ready-made shard folders for training: verifier answers (synth), ShareGPT replies (first or every
turn), Python-docs text.

Each returns a cached shard folder (`shards.cached_shards`) whose name and hash record the source,
split and seed, so a trainer asks for data by meaning and never rebuilds what is already on disk.
Held-out data stay out: ShareGPT training text goes through `split.train_only`, docs through the
document-level split, and HumanEval is never offered for training.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from sd2.data.examples import conversation_examples, synth_examples, text_examples, turn_examples
from sd2.data.pydocs import SOURCES, docs_documents, docs_version
from sd2.data.shards import DEFAULT_CONFIG, ShardConfig, cached_shards
from sd2.data.sharegpt import sharegpt_conversations
from sd2.data.split import DOCS_SPLIT, Split, select, split_of, train_only
from sd2.data.synth import meta_path


def synth_split(path: Path) -> str | None:
    """Which split's prompts a `sd2 data synth` file answers (its settings file); None without one."""
    settings = meta_path(path)
    return json.loads(settings.read_text()).get("split") if settings.is_file() else None


def synth_shards(
    path: Path,
    tokenizer: PreTrainedTokenizerBase,
    config: ShardConfig = DEFAULT_CONFIG,
    home: Path | None = None,
    split: Split = "train",
) -> Path:
    """Shards of a `sd2 data synth` file, keyed by the file's content hash. The file must answer
    prompts of `split`: training on answers to held-out prompts is refused, and so is validating on
    a file that does not say it answers validation prompts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no synth file {path}: run `sd2 data synth` first")
    answered = synth_split(path)
    if answered is not None and answered != split:
        leak = " (training on it would leak held-out prompts)" if split == "train" else ""
        raise ValueError(f"{path} answers {answered}-split prompts, not {split} ones{leak}")
    if answered is None and split != "train":
        raise ValueError(
            f"{path} has no {meta_path(path).name} saying which prompts it answers; {split} data must "
            f"come from `sd2 data synth --split {split}`"
        )
    source = {"kind": "synth", "file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return cached_shards(path.stem, lambda: synth_examples(path), tokenizer, config, source, home)


def sharegpt_split(split: Split) -> list:
    """The ShareGPT conversations of one split; training drops any repeating a held-out prompt."""
    conversations = sharegpt_conversations()
    return train_only(conversations) if split == "train" else select(conversations, split)


def sharegpt_reply_shards(
    split: Split,
    tokenizer: PreTrainedTokenizerBase,
    config: ShardConfig = DEFAULT_CONFIG,
    home: Path | None = None,
) -> Path:
    """Teacher-forced ShareGPT: first user turn → the recorded first reply (corpus text, not the verifier)."""

    def examples():
        return conversation_examples(sharegpt_split(split), tokenizer)

    source = {"kind": "sharegpt-replies", "split": split, "split_config": "CHAT_SPLIT"}
    return cached_shards(f"sharegpt-replies-{split}", examples, tokenizer, config, source, home)


def sharegpt_turn_shards(
    split: Split,
    tokenizer: PreTrainedTokenizerBase,
    config: ShardConfig = DEFAULT_CONFIG,
    home: Path | None = None,
) -> Path:
    """ShareGPT's recorded replies, every assistant turn in full (`examples.turn_examples`): the
    pretraining text, ≈ 15× the first replies of `sharegpt_reply_shards`."""

    def examples():
        return turn_examples(sharegpt_split(split), tokenizer, window=config.seq_len)

    source = {"kind": "sharegpt-turns", "split": split, "split_config": "CHAT_SPLIT"}
    return cached_shards(f"sharegpt-turns-{split}", examples, tokenizer, config, source, home)


def docs_text_shards(
    split: Split,
    tokenizer: PreTrainedTokenizerBase,
    config: ShardConfig = DEFAULT_CONFIG,
    home: Path | None = None,
    root: Path = SOURCES,
) -> Path:
    """Python-docs prose for plain next-token pretraining, windows of `seq_len` tokens, loss everywhere."""

    def examples():
        docs = ((doc, text) for doc, text in docs_documents(root) if split_of(doc, DOCS_SPLIT) == split)
        return text_examples(docs, tokenizer, window=config.seq_len)

    source = {
        "kind": "pydocs-text",
        "split": split,
        "seed": DOCS_SPLIT.seed,
        "test": DOCS_SPLIT.test,
        "version": docs_version() if root == SOURCES else str(root),
    }
    return cached_shards(f"pydocs-text-{split}", examples, tokenizer, config, source, home)
