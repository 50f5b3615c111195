import pytest
import torch

from sd2.data.batches import IGNORE_INDEX, ShardSet, batches, epoch_order
from sd2.data.examples import Example, conversation_examples, end_of_turn_id, text_examples, turn_examples
from sd2.data.records import Conversation, Provenance
from sd2.data.shards import ShardConfig, build_shards, cached_shards
from tests.tiny import tiny_tokenizer

PROV = Provenance("t", "t", "0", "f")
REPLIES = [
    "The sky is blue.",
    "Speculative decoding drafts tokens with a small model. " * 3,
    "def add(a, b):",
]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def conversations(n: int) -> list[Conversation]:
    return [
        Conversation(
            f"c{i}",
            (
                {"role": "user", "content": f"Tell me a short story about a cat {i}"},
                {"role": "assistant", "content": REPLIES[i % len(REPLIES)]},
            ),
            PROV,
        )
        for i in range(n)
    ]


def test_rows_keep_the_header_and_mask_exactly_the_response(tokenizer, tmp_path):
    examples = list(conversation_examples(conversations(6), tokenizer))
    build_shards(
        examples,
        tmp_path,
        tokenizer,
        ShardConfig(seq_len=128, min_response_tokens=2, rows_per_shard=4),
        {"kind": "test"},
    )
    shards = ShardSet(tmp_path)
    assert len(shards) == 6 and len(shards.manifest["shards"]) == 2
    eot = end_of_turn_id(tokenizer)
    for row, example in enumerate(examples):
        ids, mask, length = shards.input_ids[row], shards.loss_mask[row], int(shards.lengths[row])
        n_prompt = len(example.prompt_ids)
        assert ids[:n_prompt].tolist() == list(example.prompt_ids)  # the whole prompt, header first
        assert tokenizer.decode(ids[:n_prompt]).startswith("<|im_start|>user\nTell me")
        assert ids[mask].tolist() == list(example.response_ids)  # exactly the response tokens…
        assert mask.nonzero().flatten().tolist() == list(range(n_prompt, length))  # …at their positions
        assert ids[length - 1] == eot and mask[length - 1]  # the end-of-turn token is learned
        assert not mask[length:].any()


def test_long_prompts_are_dropped_and_long_responses_cut_on_the_right(tokenizer, tmp_path):
    config = ShardConfig(seq_len=20, min_response_tokens=4)
    long_prompt = Example("long-prompt", tuple(range(3, 20)), (5, 6, 7, 8))
    long_reply = Example("long-reply", (1, 7, 8), tuple(range(10, 60)))
    short_reply = Example("short-reply", (1, 7, 8), (9,))
    manifest = build_shards([long_prompt, long_reply, short_reply], tmp_path, tokenizer, config, {})
    counts = manifest["counts"]
    assert (
        counts["dropped_long_prompt"],
        counts["truncated_response"],
        counts["dropped_short_response"],
    ) == (1, 1, 1)
    shards = ShardSet(tmp_path)
    assert shards.ids == ("long-reply",)
    assert shards.input_ids[0].tolist() == [1, 7, 8, *range(10, 27)]  # prompt intact, response cut at T
    assert shards.loss_mask[0].sum() == 17


def test_text_examples_learn_every_token(tokenizer):
    examples = list(text_examples([("doc", "Hello! How can I help you today? " * 4)], tokenizer, window=16))
    assert all(e.prompt_ids == () and 0 < len(e.response_ids) <= 16 for e in examples)
    assert [e.id for e in examples[:2]] == ["doc@0", "doc@1"]


def test_turn_examples_learn_every_reply_in_full(tokenizer):
    long_reply = "Drafts are checked by the verifier in one pass. " * 12
    conv = Conversation(
        "multi",
        (
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Explain speculative decoding."},
            {"role": "assistant", "content": long_reply},
            {"role": "user", "content": "Thanks"},  # unanswered: nothing to learn
        ),
        PROV,
    )
    examples = list(turn_examples([conv], tokenizer, window=128))
    first, second = examples[0], [e for e in examples if e.id.startswith("multi#1")]
    assert first.id == "multi#0" and tokenizer.decode(first.prompt_ids).startswith("<|im_start|>user\nHi")
    assert tokenizer.decode(first.response_ids) == "Hello!<|im_end|>"
    assert tokenizer.decode(second[0].prompt_ids).count("Explain speculative decoding.") == 1
    assert all(e.prompt_ids == () for e in second[1:]) and len(second) > 2  # the rest as plain text
    assert all(len(e.prompt_ids) + len(e.response_ids) <= 128 for e in examples)
    reply_ids = [t for e in second for t in e.response_ids]  # the whole reply, in order, once
    assert tokenizer.decode(reply_ids) == long_reply + "<|im_end|>"


def test_batches_are_seeded_shuffled_and_resumable(tokenizer, tmp_path):
    build_shards(
        conversation_examples(conversations(10), tokenizer),
        tmp_path,
        tokenizer,
        ShardConfig(seq_len=160, min_response_tokens=2),
        {},
    )
    shards = ShardSet(tmp_path)
    run = list(batches(shards, batch_size=3, seed=7))
    assert len(run) == 3 and all(b.input_ids.shape == (3, 160) for b in run)  # drop_last: 10 rows → 3 batches
    assert [b.ids for b in run] == [b.ids for b in batches(shards, batch_size=3, seed=7)]
    assert [b.ids for b in run[1:]] == [b.ids for b in batches(shards, batch_size=3, seed=7, start=1)]
    assert [b.ids for b in run] != [b.ids for b in batches(shards, batch_size=3, seed=7, epoch=1)]
    seen = [i for b in run for i in b.ids]
    assert seen != sorted(seen, key=lambda i: int(i[1:]))  # shuffled, not file order
    assert not torch.equal(epoch_order(10, 7, 0), torch.arange(10))
    b = run[0]
    assert torch.equal(b.labels[b.loss_mask], b.input_ids[b.loss_mask])
    assert (b.labels[~b.loss_mask] == IGNORE_INDEX).all()
    assert torch.equal(b.attention_mask.sum(1), shards.lengths[[shards.ids.index(i) for i in b.ids]])
    trimmed = next(batches(shards, batch_size=3, seed=7, trim=True))
    assert trimmed.input_ids.shape[1] == int(trimmed.attention_mask.sum(1).max()) < 160


def test_cached_shards_build_once_and_refuse_corruption(tokenizer, tmp_path):
    calls = []

    def examples():
        calls.append(1)
        return conversation_examples(conversations(4), tokenizer)

    source = {"kind": "test", "version": 1}
    first = cached_shards("unit", examples, tokenizer, ShardConfig(seq_len=64), source, home=tmp_path)
    again = cached_shards("unit", examples, tokenizer, ShardConfig(seq_len=64), source, home=tmp_path)
    other = cached_shards("unit", examples, tokenizer, ShardConfig(seq_len=96), source, home=tmp_path)
    assert first == again != other and len(calls) == 2
    assert first.parent == tmp_path / "data" / "shards"
    shard = first / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the tensor data
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        ShardSet(first)
    (other / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="manifest"):
        ShardSet(other)


def test_docs_text_shards_hold_only_their_split(tokenizer, tmp_path):
    from sd2.data.batches import ShardSet
    from sd2.data.datasets import docs_text_shards
    from sd2.data.split import DOCS_SPLIT, split_of

    root = tmp_path / "docs"
    names = [f"page{i}.rst.txt" for i in range(120)]  # ≈10 land in the 8 % test split
    root.mkdir()
    for name in names:
        (root / name).write_text(f"Hello! How can I help you today? This is {name}, a page of prose text.\n")
    folder = docs_text_shards(
        "test", tokenizer, ShardConfig(seq_len=64, min_response_tokens=2), home=tmp_path / "home", root=root
    )
    docs = {i.split("@")[0] for i in ShardSet(folder).ids}
    assert docs == {n for n in names if split_of(n, DOCS_SPLIT) == "test"} and docs


def _synth_file(folder, tokenizer, split: str | None):
    """A small `sd2 data synth`-shaped JSONL (+ its .meta.json naming the split, unless None)."""
    import json

    from sd2.prompts import encode_prompt

    path = folder / f"synth-{split}.jsonl"
    rows = []
    for i in range(6):
        prompt = encode_prompt(tokenizer, prompt=f"Question {i}?")
        response = tokenizer(REPLIES[i % len(REPLIES)], add_special_tokens=False)["input_ids"]
        rows.append(json.dumps({"id": f"s{i}", "prompt_ids": prompt, "response_ids": response}))
    path.write_text("\n".join(rows) + "\n")
    if split is not None:
        path.with_name(path.name + ".meta.json").write_text(
            json.dumps({"split": split, "source": "sharegpt"})
        )
    return path


def test_synth_files_serve_only_the_split_they_answer(tokenizer, tmp_path):
    from sd2.data.datasets import synth_shards

    config = ShardConfig(seq_len=64, min_response_tokens=2)
    train_file = _synth_file(tmp_path, tokenizer, "train")
    validation_file = _synth_file(tmp_path, tokenizer, "validation")
    bare_file = _synth_file(tmp_path, tokenizer, None)
    home = tmp_path / "home"
    assert len(ShardSet(synth_shards(train_file, tokenizer, config, home, split="train"))) == 6
    assert len(ShardSet(synth_shards(validation_file, tokenizer, config, home, split="validation"))) == 6
    assert len(ShardSet(synth_shards(bare_file, tokenizer, config, home, split="train"))) == 6
    with pytest.raises(ValueError, match=r"answers validation-split prompts, not train ones .*leak held-out"):
        synth_shards(validation_file, tokenizer, config, home, split="train")
    with pytest.raises(ValueError, match="answers train-split prompts, not validation ones"):
        synth_shards(train_file, tokenizer, config, home, split="validation")
    with pytest.raises(
        ValueError, match=r"no synth-None\.jsonl\.meta\.json .*`sd2 data synth --split validation`"
    ):
        synth_shards(bare_file, tokenizer, config, home, split="validation")


def test_a_gzipped_synth_export_trains_like_its_file_and_shares_its_settings(tokenizer, tmp_path):
    import gzip

    from sd2.data.datasets import synth_shards
    from sd2.data.examples import synth_examples
    from sd2.data.synth import meta_path

    config = ShardConfig(seq_len=64, min_response_tokens=2)
    plain = _synth_file(tmp_path, tokenizer, "validation")
    packed = plain.with_name(plain.name + ".gz")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert meta_path(packed) == meta_path(plain)
    assert list(synth_examples(packed)) == list(synth_examples(plain))
    shards = ShardSet(synth_shards(packed, tokenizer, config, tmp_path / "home", split="validation"))
    assert len(shards) == 6
    with pytest.raises(ValueError, match="answers validation-split prompts, not train ones"):
        synth_shards(packed, tokenizer, config, tmp_path / "home", split="train")


def test_training_can_validate_on_the_verifiers_answers_to_validation_prompts(
    tokenizer, tmp_path, monkeypatch
):
    from sd2.train.sources import training_data

    monkeypatch.setenv("SD2_HOME", str(tmp_path / "home"))
    train_file = _synth_file(tmp_path, tokenizer, "train")
    validation_file = _synth_file(tmp_path, tokenizer, "validation")
    data = training_data(
        [f"synth:{train_file}"], tokenizer, 2, seq_len=64, validation_name=f"synth:{validation_file}"
    )
    assert len(data.train) == 6 and len(data.validation) == 6 and len(data.eval_prompts) == 2
    assert data.description["validation"].startswith(f"synth:{validation_file} (verifier answers")
    with pytest.raises(ValueError, match="not train ones"):  # the two files swapped
        training_data([f"synth:{validation_file}"], tokenizer, 2, seq_len=64)
    with pytest.raises(ValueError, match="validation data must be sharegpt or synth:PATH"):
        training_data([f"synth:{train_file}"], tokenizer, 2, seq_len=64, validation_name="pydocs")
