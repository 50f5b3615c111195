"""Tiny training set-ups shared by the training tests: 48 chat rows, a 4-layer verifier, a 2-layer drafter."""

from pathlib import Path

from sd2.data.batches import ShardSet
from sd2.data.examples import Example
from sd2.data.shards import ShardConfig, build_shards
from sd2.prompts import encode_prompt
from sd2.train.config import TrainConfig
from sd2.train.trainer import TrainData
from tests.tiny import CORPUS, tiny_llama, tiny_tokenizer


def tiny_train_data(folder: Path) -> TrainData:
    """48 prompt/reply rows of 64 tokens as train and validation data, one τ prompt."""
    tokenizer = tiny_tokenizer()
    examples = []
    for i in range(48):
        prompt = encode_prompt(tokenizer, prompt=f"Question {i}: tell me something")
        reply = tokenizer(CORPUS[i % len(CORPUS)], add_special_tokens=False)["input_ids"] + [2]
        examples.append(Example(f"ex{i}", tuple(prompt), tuple(reply)))
    build_shards(
        examples, folder, tokenizer, ShardConfig(seq_len=64, min_response_tokens=2), {"kind": "test"}
    )
    shards = ShardSet(folder)
    return TrainData(
        shards, shards, eval_prompts=[list(examples[0].prompt_ids)], description={"kind": "test"}
    )


def tiny_verifier():
    return tiny_llama(hidden=64, layers=4, ffn=128, seed=0)


def tiny_drafter():
    return tiny_llama(hidden=32, layers=2, ffn=64, seed=1)


def train_config(tmp_path: Path, objective: str, **overrides) -> TrainConfig:
    values = dict(
        objective=objective,
        out_dir=str(tmp_path / objective),
        steps=12,
        batch_size=8,
        lr=3e-3,
        warmup_steps=2,
        eval_every=0,
        save_every=0,
        k=4,
        eval_max_new_tokens=16,
    )
    return TrainConfig(**(values | overrides))
