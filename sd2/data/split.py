"""A seeded, deterministic train/validation/test split by conversation.

Each split unit (a conversation, or all parts of one long ShareGPT conversation) is hashed with the
seed to a number in [0, 1): below `test` → test, below `test + validation` → validation, else train.
No RNG state, no dependence on file order or on which other records exist, so every tool (synth,
shards, prompt sets, evaluation) recomputes the same split independently. ShareGPT also repeats the
same first prompt under different ids ("hi", copied prompts), so `train_only` also drops any training
conversation with a user turn that is, as text, a held-out prompt (≈5 % of ShareGPT's training
conversations at the default seed): held-out prompts are never trained on, not even as context.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from sd2.data.records import Conversation

Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitConfig:
    """How records are divided. Changing any field changes the split: record it with the data."""

    seed: int = 0  # the split's only source of randomness; fixed so every tool agrees
    validation: float = 0.02  # ≈350 ShareGPT conversations: enough for KL/τ checks during training
    test: float = 0.03  # ≈500 ShareGPT conversations: the pool the held-out chat prompt set is drawn from

    def __post_init__(self) -> None:
        if not (0 <= self.validation < 1 and 0 <= self.test < 1 and self.validation + self.test < 1):
            raise ValueError(f"validation and test fractions must be in [0, 1) and sum below 1, got {self}")


CHAT_SPLIT = SplitConfig()  # ShareGPT: ≈17 k conversations, 3 % held out for testing is plenty
DOCS_SPLIT = SplitConfig(test=0.08)  # Python docs: only ≈480 files, so a larger share is held out


def default_split(source: str) -> SplitConfig:
    """The split every tool uses for a corpus ("sharegpt", "pydocs", "pydocs-explain": the same
    documents as "pydocs"; HumanEval is all held out)."""
    return DOCS_SPLIT if source.startswith("pydocs") else CHAT_SPLIT


def unit_interval(key: str, seed: int) -> float:
    """A uniform-looking number in [0, 1) determined by (seed, key) alone."""
    digest = hashlib.sha256(f"sd2-split:{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_of(key: str, config: SplitConfig = SplitConfig()) -> Split:
    """The split of one unit; growing `validation` never moves a unit out of test."""
    u = unit_interval(key, config.seed)
    if u < config.test:
        return "test"
    return "validation" if u < config.test + config.validation else "train"


def normalize_prompt(text: str) -> str:
    """Text identity for leak checks: case- and whitespace-insensitive."""
    return " ".join(text.split()).casefold()


def select(
    conversations: Iterable[Conversation], split: Split, config: SplitConfig = SplitConfig()
) -> Iterator[Conversation]:
    """The conversations of one split, in input order (no leak filtering; see `train_only`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return (c for c in conversations if split_of(c.split_key, config) == split)


def held_out_prompts(conversations: Iterable[Conversation], config: SplitConfig = SplitConfig()) -> set[str]:
    """Normalised opening user turns (the prompts evaluation uses) of validation and test conversations."""
    return {
        normalize_prompt(prompt)
        for c in conversations
        if split_of(c.split_key, config) != "train" and (prompt := c.first_user_turn()) is not None
    }


def train_only(
    conversations: Iterable[Conversation], config: SplitConfig = SplitConfig()
) -> list[Conversation]:
    """Training conversations, minus any that share a user turn with a held-out conversation."""
    pool = list(conversations)
    held_out = held_out_prompts(pool, config)
    train = list(select(pool, "train", config))
    kept = [
        c
        for c in train
        if not any(m["role"] == "user" and normalize_prompt(m["content"]) in held_out for m in c.messages)
    ]
    if len(kept) < len(train):
        log.info(
            "split: dropped %d training conversations that repeat a held-out prompt", len(train) - len(kept)
        )
    return kept
