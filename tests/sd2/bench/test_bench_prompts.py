"""Prompt sets: JSONL files with `prompt` or `messages`, else the labelled demo set."""

import hashlib
import json

import pytest

from sd2.bench.prompts import DEMO_SET, load_prompt_sets, read_prompt_file


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_demo_set_when_no_files(tmp_path):
    (only,) = load_prompt_sets(tmp_path / "missing")
    assert only.name == DEMO_SET and only.demo and len(only.prompts) >= 2
    (cut,) = load_prompt_sets(tmp_path, max_prompts=1)
    assert len(cut.prompts) == 1 and cut.n_available == len(only.prompts)


def test_reads_prompt_and_messages_lines(tmp_path):
    path = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {"_meta": "provenance header"},
            {"id": "a", "prompt": "Hello there"},
            {
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "stored reply"},
                ]
            },
        ],
    )
    prompts = read_prompt_file(path)
    assert [p.id for p in prompts.prompts] == ["a", "chat-3"]
    assert prompts.prompts[0].prompt == "Hello there" and prompts.prompts[0].messages is None
    assert prompts.prompts[1].messages == ({"role": "user", "content": "Hi"},)  # the reply is dropped
    assert prompts.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and not prompts.demo


def test_named_sets_files_and_demo(tmp_path):
    write_jsonl(tmp_path / "code.jsonl", [{"prompt": f"def f{i}():"} for i in range(5)])
    write_jsonl(tmp_path / "chat.jsonl", [{"prompt": "hi there"}])
    assert [s.name for s in load_prompt_sets(tmp_path)] == ["chat", "code"]
    sets = load_prompt_sets(tmp_path, ["code", "demo"], max_prompts=2)
    assert (sets[0].name, len(sets[0].prompts), sets[0].n_available) == ("code", 2, 5)
    assert sets[1].demo
    with pytest.raises(ValueError, match="unknown prompt set 'math'"):
        load_prompt_sets(tmp_path, ["math"])


def test_file_without_prompts_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no line with a 'prompt' or 'messages'"):
        read_prompt_file(write_jsonl(tmp_path / "empty.jsonl", [{"id": "x"}]))


def test_a_prompt_file_inside_the_repository_is_recorded_by_its_repo_relative_path(tmp_path, monkeypatch):
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    (checkout / "assets" / "prompts").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("")
    elsewhere.mkdir()
    monkeypatch.setattr("sd2.paths._CHECKOUT", checkout)
    row = [{"prompt": "Hi", "source": "sharegpt 1.0"}]
    inside = read_prompt_file(write_jsonl(checkout / "assets" / "prompts" / "chat.jsonl", row))
    assert inside.source == "assets/prompts/chat.jsonl (sharegpt 1.0)"
    (only,) = load_prompt_sets(checkout / "assets" / "prompts")
    assert only.source == inside.source
    outside = write_jsonl(elsewhere / "chat.jsonl", row)
    assert read_prompt_file(outside).source == f"{outside} (sharegpt 1.0)"  # outside: absolute
